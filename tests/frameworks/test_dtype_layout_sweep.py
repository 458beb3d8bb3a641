"""An acceptance sweep of the public API on the CPU, as an independent tester runs it: frameworks (NumPy, Torch,
JAX, array-api-strict, Dask) × dtypes × layouts, for ``matmul`` (alpha/beta/c, epilogs with their inputs,
batches), ``Matmul``, every ``nvdispatch.fft`` transform (n/s, axes, norm), ``fft.FFT`` and ``fft.convolve``.

For each call: values against a NumPy float64/complex128 oracle written here; the result's type and dtype those
of the framework's own operation (``jnp.fft.fft`` of float16, ``torch.promote_types`` of a mixed pair...), or,
where the framework's own operation refuses the call, either a typed ``nvdispatch.errors`` error naming the
argument or nvdispatch's documented extension (Torch's half-precision FFT on the CPU, real input to
array-api-strict's complex transforms, a Dask FFT over several chunks); inputs never modified."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import nvdispatch
from nvdispatch import errors

nf = nvdispatch.fft
RNG = np.random.default_rng(11)


# -- the frameworks: make an array of a dtype, read one back as NumPy, the framework's own fft and matmul ---------
def _torch():
    import torch

    def make(values, dtype):
        if dtype == "complex32":
            return torch.from_numpy(values.astype(np.complex64)).to(torch.complex32)
        if dtype == "bfloat16":
            return torch.from_numpy(values.astype(np.float32)).to(torch.bfloat16)
        return torch.from_numpy(np.ascontiguousarray(values.astype(dtype)))

    def host(x):
        x = x.detach().resolve_conj().resolve_neg()
        if x.dtype in (torch.complex32, torch.bfloat16, torch.float16):
            x = x.to(torch.complex64 if x.is_complex() else torch.float32)
        return x.numpy()

    return make, host, torch.fft, torch.matmul


def _jax():
    jnp = pytest.importorskip("jax.numpy")

    def make(values, dtype):
        return jnp.asarray(values.astype("float32" if dtype == "bfloat16" else dtype)).astype(dtype)

    def host(x):
        return np.asarray(x.astype(jnp.float32) if x.dtype == jnp.bfloat16 else x)

    return make, host, jnp.fft, jnp.matmul


def _strict():
    xp = pytest.importorskip("array_api_strict")
    return (lambda v, d: xp.asarray(v.astype(d))), (lambda x: np.from_dlpack(x)), xp.fft, xp.matmul


def _dask():
    da = pytest.importorskip("dask.array")

    def make(values, dtype):
        return da.from_array(values.astype(dtype), chunks=2)

    def host(x):
        return np.asarray(x.compute())

    def own(op):  # Dask's own op, computed (None: it refused)
        def run(*args, **kwargs):
            return op(*args, **kwargs).compute()

        return run

    class Fft:
        def __getattr__(self, name):
            return own(getattr(da.fft, name))

    return make, host, Fft(), own(da.matmul)


FRAMEWORKS = {
    "numpy": lambda: ((lambda v, d: v.astype(d)), np.asarray, np.fft, np.matmul),
    "torch": lambda: (pytest.importorskip("torch"), _torch())[1],
    "jax": _jax,
    "strict": _strict,
    "dask": _dask,
}
FFT_DTYPES = {
    "numpy": ["float16", "float32", "float64", "complex64", "complex128", "int64", "bool"],
    "torch": ["float16", "bfloat16", "float32", "float64", "complex32", "complex64", "complex128", "int64", "bool"],
    "jax": ["float16", "bfloat16", "float32", "complex64", "int32", "uint8", "bool"],
    "strict": ["float32", "float64", "complex64", "complex128", "int64", "bool"],
    "dask": ["float16", "float32", "float64", "complex64", "complex128", "int64", "bool"],
}
ONE_DIM = ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft")
N_DIM = ("fft2", "ifft2", "rfft2", "irfft2", "fftn", "ifftn", "rfftn", "irfftn")


def _values(dtype, shape):
    if dtype == "bool":
        return RNG.random(shape) > 0.5
    if dtype[0] in "iu":
        return RNG.integers(0, 5, shape).astype(dtype)
    x = RNG.integers(-4, 5, shape).astype(np.float64)
    return x + 1j * RNG.integers(-4, 5, shape) if dtype.startswith("complex") else x


def _host_dtype(dtype: str) -> str:
    """The NumPy dtype holding a framework dtype's values here (bfloat16's in float32)."""
    return "float32" if dtype == "bfloat16" else dtype


def _name(dtype) -> str:
    return str(dtype).rpartition(".")[2]


def _own(fn, *args, **kwargs):
    """The framework's own result, or None where it refuses the call."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn(*args, **kwargs)
    except Exception:  # noqa: BLE001 - whatever the framework raises: it has no answer to compare with
        return None


def _oracle_fft(func, x, **kwargs):
    """numpy.fft in double precision on the values ``x`` stands for (the oracle)."""
    x = np.asarray(x)
    wide = x.astype(np.complex128 if np.iscomplexobj(x) else np.float64)
    if func in ("rfft", "ihfft", "rfft2", "rfftn"):
        wide = wide.real
    return getattr(np.fft, func)(wide, **kwargs)


def _tolerance(*dtypes) -> float:
    names = {_name(d) for d in dtypes}
    if names & {"float16", "complex32"}:
        return 2e-2
    if "bfloat16" in names:
        return 6e-2
    if names & {"float32", "complex64"} or names & {"int32", "uint8", "bool"}:
        return 2e-5
    return 1e-10


def _close(got, want, tol):
    got = np.asarray(got)
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = max(1.0, float(np.abs(want).max(initial=0)))
    np.testing.assert_allclose(got.astype(np.complex128), want, rtol=tol, atol=tol * scale)


def _framework(name):
    return FRAMEWORKS[name]()


# -- fft: dtypes ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fw", "dtype"), [(fw, d) for fw, dts in FFT_DTYPES.items() for d in dts], ids=lambda v: str(v)
)
def test_every_transform_follows_the_frameworks_dtype_rule(fw, dtype):
    make, host, own_fft, _ = _framework(fw)
    values = _values(dtype, (4, 6))
    for func in ONE_DIM + N_DIM:
        x = make(values, dtype)
        before = host(x).copy()
        own = _own(getattr(own_fft, func, None), x)
        try:
            got = getattr(nf, func)(x)
        except errors.NvdispatchError as exc:
            assert own is None, f"{func}: nvdispatch refused ({exc}) what {fw} computes"
            assert exc.argument == "x", (func, str(exc))
            continue
        finally:
            np.testing.assert_array_equal(host(x), before, err_msg=f"{func} modified its input")
        if own is not None:
            assert type(got) is type(own) or fw == "dask", (func, type(got), type(own))
            assert _name(got.dtype) == _name(own.dtype), (func, got.dtype, own.dtype)
        _close(host(got), _oracle_fft(func, host(make(values, dtype))), _tolerance(dtype, got.dtype))


def test_torch_half_precision_transforms_return_half_precision():
    """torch.fft's rule (CUDA; Torch's CPU build refuses half precision, nvdispatch computes it there too):
    float16 and complex32 in, float16 or complex32 out; bfloat16, which torch.fft never transforms, a typed error."""
    torch = pytest.importorskip("torch")
    x = torch.ones(4, 8, dtype=torch.float16)
    assert nf.rfft(x).dtype == nf.fft(x).dtype == torch.complex32
    assert nf.irfft(nf.rfft(x)).dtype == nf.hfft(x.to(torch.complex32)).dtype == torch.float16
    with pytest.raises(errors.UnsupportedDtypeError) as info:
        nf.fft(x.to(torch.bfloat16))
    assert info.value.argument == "x" and "bfloat16" in str(info.value)


def test_jax_transforms_follow_jax_under_jit_too():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    for dtype in ("float16", "bfloat16", "int32", "bool"):
        x = jnp.asarray(_values("float64", (4, 8)).astype("float32")).astype(dtype)
        for func in ("fft", "irfft", "hfft", "fftn", "ifft2"):
            got, own = jax.jit(getattr(nf, func))(x), getattr(jnp.fft, func)(x)
            assert got.dtype == own.dtype, (dtype, func, got.dtype, own.dtype)
            _close(np.asarray(got), np.asarray(own, np.complex128), 2e-5)
        if dtype in ("float16", "bfloat16"):  # jnp.fft.rfft refuses half precision: so does this, naming x
            with pytest.raises(errors.UnsupportedDtypeError) as info:
                jax.jit(nf.rfft)(x)
            assert info.value.argument == "x"


# -- fft: layouts, n/s, axes, norm ----------------------------------------------------------------------------------
def _numpy_layouts(a):
    return {"T": a.T, "F": np.asfortranarray(a), "slice": a[::2, 1::3], "neg": a[::-1, ::-2], "empty": a[:0]}


def _torch_layouts(t):
    views = {"T": t.T, "slice": t[::2, 1::3], "F": t.T.contiguous().T}
    if t.is_complex():
        views |= {"conj": t.conj(), "conjT": t.conj().T, "conj-slice": t.conj()[:, 1::2]}
    return views


def _arguments(func):
    if func.endswith(("2", "n")):
        return [
            {},
            {"axes": (0,)},
            {"s": (3, 5), "axes": (0, 1)},
            {"norm": "ortho"},
            {"norm": "forward", "axes": (1, 0)},
        ]
    return [{}, {"axis": 0}, {"n": 5}, {"n": 3, "norm": "ortho"}, {"norm": "forward"}]


@pytest.mark.parametrize("dtype", ["float32", "complex64", "float64", "complex128"])
def test_numpy_layouts_and_arguments(dtype):
    base = _values(dtype, (6, 8)).astype(dtype)
    for layout, x in _numpy_layouts(base).items():
        before = x.copy()
        for func in ONE_DIM + N_DIM:
            for kwargs in _arguments(func):
                want = _own(getattr(np.fft, func), x, **kwargs)
                if want is None:
                    with pytest.raises(errors.NvdispatchError):
                        getattr(nf, func)(x, **kwargs)
                    continue
                got = getattr(nf, func)(x, **kwargs)
                assert got.dtype == want.dtype, (layout, func, kwargs)
                _close(got, _oracle_fft(func, x, **kwargs), _tolerance(dtype))
        np.testing.assert_array_equal(x, before)


@pytest.mark.parametrize("dtype", ["float32", "complex64", "complex128"])
def test_torch_layouts_conjugate_views_and_arguments(dtype):
    torch = pytest.importorskip("torch")
    base = torch.from_numpy(_values(dtype, (6, 8)).astype(dtype))
    for layout, x in _torch_layouts(base).items():
        values = x.resolve_conj().numpy()
        for func in ONE_DIM + N_DIM:
            if func in ("rfft", "ihfft", "rfft2", "rfftn") and x.is_complex():
                continue
            for kwargs in _arguments(func):
                if "axis" in kwargs:
                    kwargs = {"dim": kwargs["axis"]}
                want = getattr(torch.fft, func)(x, **{("dim" if k == "axes" else k): v for k, v in kwargs.items()})
                got = getattr(nf, func)(x, **{("axis" if k == "dim" else k): v for k, v in kwargs.items()})
                assert got.dtype == want.dtype, (layout, func, kwargs)
                np_kwargs = {("axis" if k == "dim" else k): v for k, v in kwargs.items()}
                _close(got.resolve_conj().numpy(), _oracle_fft(func, values, **np_kwargs), _tolerance(dtype))
        assert x.is_conj() == ("conj" in layout)


@pytest.mark.parametrize("fw", ["jax", "strict", "dask"])
def test_arguments_on_the_other_frameworks(fw):
    """n/s, axis/axes (negative ones included), norm on JAX, array-api-strict and Dask (chunked across the
    transformed axes) against the oracle."""
    make, host, _, _ = _framework(fw)
    for dtype in ("complex64", "float32"):
        values = _values(dtype, (6, 8))
        for func in ONE_DIM + N_DIM:
            if func in ("rfft", "ihfft", "rfft2", "rfftn") and dtype == "complex64":
                continue
            for kwargs in [*_arguments(func), {"axis": -2} if func in ONE_DIM else {"s": (4,), "axes": (-2,)}]:
                got = getattr(nf, func)(make(values, dtype), **kwargs)
                _close(host(got), _oracle_fft(func, values, **kwargs), 2e-5)


def test_zero_size_and_one_dimensional_operands():
    for x in (np.zeros((0, 8), np.complex64), np.ones(7, np.float32), np.zeros((3, 0, 4))):
        for func in ("fft", "ifft", "fftn"):
            want = _own(getattr(np.fft, func), x)
            if want is None:
                with pytest.raises(errors.NvdispatchError):
                    getattr(nf, func)(x)
            else:
                got = getattr(nf, func)(x)
                assert got.shape == want.shape and got.dtype == want.dtype


@pytest.mark.parametrize("fw", list(FRAMEWORKS))
def test_fft_argument_errors_are_typed_and_name_the_argument(fw):
    make, _, _, _ = _framework(fw)
    x = make(_values("complex64", (4, 8)), "complex64")
    for call, argument in [
        (lambda: nf.fft(x, axis=5), "axis"),
        (lambda: nf.fft(x, norm="sideways"), "norm"),
        (lambda: nf.fft(x, n=0), "n"),
        (lambda: nf.rfft(x), "x"),
        (lambda: nf.fftn(x, s=(4, 4, 4), axes=(0, 1)), "s"),
    ]:
        with pytest.raises(errors.NvdispatchError) as info:
            call()
        assert info.value.argument == argument, str(info.value)
        assert "expected" in str(info.value) and "got" in str(info.value)


# -- fft: the stateful object and convolve ---------------------------------------------------------------------------
@pytest.mark.parametrize("fw", list(FRAMEWORKS))
def test_stateful_fft_and_convolve(fw):
    make, host, _, _ = _framework(fw)
    z = _values("complex64", (4, 8)).astype(np.complex64)
    x = make(z, "complex64")
    with nf.FFT(x, axes=(1,)) as f:
        y = f.plan().execute()
        assert type(y) is type(x)
        _close(host(y), np.fft.fft(z, axis=1), 2e-5)
        _close(host(f.execute(direction="inverse")), np.fft.ifft(z, axis=1), 2e-5)
        f.reset_operand(make(2 * z, "complex64"))
        _close(host(f.execute()), 2 * np.fft.fft(z, axis=1), 2e-5)
    for dtype in ("int32", "bool"):  # the stateful object takes floating operands only: a typed error saying so
        with pytest.raises(errors.UnsupportedDtypeError, match="float32/float64") as info:
            nf.FFT(make(_values(dtype, (4, 8)), dtype))
        assert info.value.argument == "x"
    r = _values("float64", (4, 8)).astype(np.float32)
    h = np.fft.rfft(_values("float64", 8)).astype(np.complex64)
    got = nf.convolve(make(r, "float32"), make(h, "complex64"))
    assert type(got) is type(x) and _name(got.dtype) == "float32"
    _close(host(got), np.fft.irfft(np.fft.rfft(r.astype(np.float64)) * h, 8), 2e-5)


# -- matmul ---------------------------------------------------------------------------------------------------------
MATMUL_DTYPES = {
    "numpy": ["float16", "float32", "float64", "complex64", "complex128", "int32", "int64", "bool"],
    "torch": ["float16", "bfloat16", "float32", "float64", "complex64", "complex128", "int32", "int64", "bool"],
    "jax": ["float16", "bfloat16", "float32", "complex64", "int32", "bool"],
    "strict": ["float32", "float64", "complex64", "complex128", "int32", "int64"],
    "dask": ["float16", "float32", "float64", "complex64", "complex128", "int64", "bool"],
}
SHAPES = [((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)), ((2, 1, 3, 4), (3, 4, 5)), ((0, 4), (4, 5))]


def _own_matmul_dtype(fw, own, a, b):
    """The dtype the framework's own matmul gives (asked of 1×1 operands: an empty product runs no kernel and
    refuses nothing); Torch's refuses mixed dtypes: its promotion rule then. Dask's chunks are NumPy's: NumPy's
    rule (``dask.array.matmul`` sums boolean partial products into int64, where ``numpy.matmul`` gives bool)."""
    if fw == "torch":
        import torch

        if a.dtype != b.dtype:
            return _name(torch.promote_types(a.dtype, b.dtype))
        a = b = torch.ones(1, 1, dtype=a.dtype)
    if fw == "dask":
        own, a, b = np.matmul, np.ones((1, 1), a.dtype), np.ones((1, 1), b.dtype)
    result = _own(own, a, b)
    return None if result is None else _name(result.dtype)


@pytest.mark.parametrize("fw", list(MATMUL_DTYPES))
def test_matmul_dtypes_shapes_and_promotion(fw):
    make, host, _, own = _framework(fw)
    dtypes = MATMUL_DTYPES[fw]
    cases = [(d, d, sa, sb) for d in dtypes for sa, sb in SHAPES]
    cases += [(d1, d2, (3, 4), (4, 2)) for d1 in dtypes for d2 in dtypes if d1 != d2]
    for da_, db_, sa, sb in cases:
        va, vb = _values(da_, sa), _values(db_, sb)
        a, b = make(va, da_), make(vb, db_)
        want = _own_matmul_dtype(fw, own, a, b)
        try:
            got = nvdispatch.matmul(a, b)
        except errors.NvdispatchError as exc:
            assert want is None, f"{da_} x {db_} {sa}@{sb}: nvdispatch refused ({exc}), {fw} gives {want}"
            assert exc.argument in ("a", "b") or isinstance(exc, errors.NoExecutorError), str(exc)
            assert "expected" in str(exc) and "got" in str(exc)
            continue
        if fw != "dask":
            assert type(got) is type(a) or (sa == sb == (4,) and fw == "numpy"), (type(got), type(a))
        if want is not None:
            assert _name(got.dtype) == want, (da_, db_, sa, sb, got.dtype, want)
        if da_ == db_ == "bool":
            assert np.array_equal(host(got), np.matmul(host(a), host(b)))  # a logical OR of ANDs
            continue
        oracle = np.matmul(host(a).astype(np.complex128), host(b).astype(np.complex128))
        _close(host(got), oracle, _tolerance(da_, db_))
        np.testing.assert_array_equal(host(a), va.astype(_host_dtype(da_)))


def _gelu(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def _epilog_oracle(epilog, d, bias, mask, pre, a, b):
    z = d + bias if bias is not None else d
    relu = np.maximum(z, 0)
    table = {
        "BIAS": (z, {}),
        "RELU_BIAS": (relu, {}),
        "RELU_AUX_BIAS": (relu, {"relu_aux": z > 0}),
        "GELU_AUX_BIAS": (_gelu(z), {"gelu_aux": z}),
        "DRELU_BGRAD": (np.where(mask, d, 0), {"drelu_bgrad": np.where(mask, d, 0).sum(-2)}),
        "BGRADA": (d, {"bgrada": a.sum(-1)}),
        "BGRADB": (d, {"bgradb": b.sum(-2)}),
    }
    if epilog == "DGELU":
        u = np.sqrt(2.0 / np.pi) * (pre + 0.044715 * pre**3)
        du = np.sqrt(2.0 / np.pi) * (1.0 + 3 * 0.044715 * pre**2)
        return d * (0.5 * (1.0 + np.tanh(u)) + 0.5 * pre * du / np.cosh(u) ** 2), {}
    return table[epilog]


EPILOG_CASES = ["BIAS", "RELU_BIAS", "RELU_AUX_BIAS", "GELU_AUX_BIAS", "DRELU_BGRAD", "DGELU", "BGRADA", "BGRADB"]


EPILOG_DTYPES = [(fw, d) for fw in FRAMEWORKS for d in ("float32", "float64") if (fw, d) != ("jax", "float64")]


@pytest.mark.parametrize(("fw", "dtype"), [*EPILOG_DTYPES, ("torch", "bfloat16"), ("jax", "bfloat16")])
def test_matmul_epilogs_alpha_beta_c_and_batches(fw, dtype):
    make, host, _, _ = _framework(fw)
    m, k, n = 4, 3, 5
    for epilog in EPILOG_CASES:
        for batch in ((), (2,)):
            va, vb = _values(dtype, (*batch, m, k)), _values(dtype, (k, n))
            vc = _values(dtype, (m, n))
            bias, mask, pre = (
                _values(dtype, n).astype(_host_dtype(dtype)),
                RNG.random((*batch, m, n)) > 0.5,
                _values(dtype, (*batch, m, n)) / 4,
            )
            if epilog in ("DRELU_BGRAD", "BGRADA") and batch:
                continue  # their bias gradients are of unbatched products
            inputs = {"bias": bias} if "BIAS" in epilog and "BGRAD" not in epilog else {}
            inputs |= {"relu_aux": mask} if epilog.startswith("DRELU") else {}
            inputs |= {"gelu_aux": pre.astype(_host_dtype(dtype))} if epilog == "DGELU" else {}
            made = {k_: make(v, "bool" if v.dtype == bool else dtype) for k_, v in inputs.items()}
            kwargs = {"epilog": epilog, "epilog_inputs": made}
            plain = epilog in ("BIAS", "BGRADA", "BGRADB", "RELU_BIAS")
            if plain:
                kwargs |= {"alpha": 2.0, "beta": 0.5}
            a, b = make(va, dtype), make(vb, dtype)
            c = make(vc, dtype) if plain else None
            got = nvdispatch.matmul(a, b, c, **kwargs)
            d = va @ vb * (2.0 if plain else 1.0) + (0.5 * vc if plain else 0)
            want, want_aux = _epilog_oracle(epilog, d, inputs.get("bias"), mask, pre, va, vb)
            result, aux = got if isinstance(got, tuple) else (got, {})
            assert type(result) is type(a) or fw == "dask"
            assert _name(result.dtype) == dtype
            _close(host(result), want, _tolerance(dtype) * 10)
            assert set(aux) == set(want_aux), (epilog, set(aux))
            for name, value in want_aux.items():
                assert type(aux[name]) is type(a) or fw == "dask", (epilog, name, type(aux[name]))
                _close(host(aux[name]).astype(value.dtype), value, _tolerance(dtype) * 10)
            np.testing.assert_array_equal(host(a), va.astype(_host_dtype(dtype)))


@pytest.mark.parametrize("fw", list(FRAMEWORKS))
def test_stateful_matmul_plan_execute_reset(fw):
    make, host, _, _ = _framework(fw)
    va, vb, vc = (_values("float32", s).astype(np.float32) for s in ((5, 4), (4, 3), (5, 3)))
    bias = np.arange(3, dtype=np.float32)
    with nvdispatch.Matmul(make(va, "float32"), make(vb, "float32"), make(vc, "float32"), alpha=2.0, beta=0.5) as mm:
        got = mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": make(bias, "float32")}).execute()
        _close(host(got), np.maximum(2 * va @ vb + 0.5 * vc + bias, 0), 1e-5)
        mm.reset_operands(a=make(-va, "float32"))
        _close(host(mm.execute()), np.maximum(-2 * va @ vb + 0.5 * vc + bias, 0), 1e-5)


def test_matmul_numpy_layouts_keep_inputs():
    a0 = _values("complex128", (5, 4))
    b0 = _values("complex128", (4, 3))
    for dtype in ("float32", "float64", "complex64", "complex128"):
        a1, b1 = a0.astype(dtype), b0.astype(dtype)
        if dtype.startswith("float"):
            a1, b1 = a0.real.astype(dtype), b0.real.astype(dtype)
        layouts = {
            "F": (np.asfortranarray(a1), np.asfortranarray(b1)),
            "T": (np.ascontiguousarray(a1.T).T, np.ascontiguousarray(b1.T).T),
            "neg": (np.ascontiguousarray(a1[::-1])[::-1], np.ascontiguousarray(b1[:, ::-1])[:, ::-1]),
            "slice": (np.repeat(a1, 2, axis=1)[:, ::2], np.repeat(b1, 2, axis=0)[::2]),
        }
        for layout, (a, b) in layouts.items():
            before = a.copy(), b.copy()
            got = nvdispatch.matmul(a, b, epilog="BGRADB")
            assert got[0].dtype == dtype
            _close(got[0], before[0].astype(np.complex128) @ before[1], _tolerance(dtype))
            _close(got[1]["bgradb"], before[1].astype(np.complex128).sum(0), _tolerance(dtype))
            np.testing.assert_array_equal(a, before[0], err_msg=layout)
            np.testing.assert_array_equal(b, before[1], err_msg=layout)


def test_matmul_of_torch_conjugate_views_and_their_gradients():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(3)
    A = torch.randn(4, 3, dtype=torch.complex128, generator=g)
    B = torch.randn(3, 5, dtype=torch.complex128, generator=g)
    up = torch.randn(4, 5, dtype=torch.complex128, generator=g)
    views = {"id": lambda t: t, "conj": torch.conj, "conjT": lambda t: t.mT.contiguous().mT.conj()}
    for (na, fa), (nb, fb) in [(x, y) for x in views.items() for y in views.items()]:
        grads = []
        for mm in (nvdispatch.matmul, torch.matmul):
            a = A.T.contiguous().T.requires_grad_()  # a column-major leaf
            b = B.clone().requires_grad_()
            out = mm(fa(a), fb(b))
            out.backward(up)
            grads.append((out.detach().resolve_conj(), a.grad.resolve_conj(), b.grad.resolve_conj(), a.grad.stride()))
        (o, ga, gb, sa), (o2, ga2, gb2, sa2) = grads
        assert torch.allclose(o, o2) and torch.allclose(ga, ga2) and torch.allclose(gb, gb2), (na, nb)
        assert sa == sa2, (na, nb, sa, sa2)


@pytest.mark.parametrize("fw", list(FRAMEWORKS))
def test_matmul_errors_are_typed_and_name_the_argument(fw):
    make, _, _, _ = _framework(fw)
    a, b = make(_values("float32", (3, 4)), "float32"), make(_values("float32", (5, 2)), "float32")
    ok = make(_values("float32", (4, 2)), "float32")
    for call, argument in [
        (lambda: nvdispatch.matmul(a, b), "b"),
        (lambda: nvdispatch.matmul(a, ok, epilog="BIAS"), "epilog_inputs"),
        (lambda: nvdispatch.matmul(a, ok, epilog="BIAS", epilog_inputs={"bias": make(np.ones(3), "float32")}), "bias"),
        (lambda: nvdispatch.matmul(a, ok, beta=2.0), "beta"),
        (lambda: nvdispatch.matmul(a, ok, epilog="NOPE"), "epilog"),
    ]:
        with pytest.raises(errors.NvdispatchError) as info:
            call()
        assert argument in info.value.argument, (argument, str(info.value))
        assert "expected" in str(info.value) and "got" in str(info.value)


#: cupy.fft's result dtype for float16 input, read from its source (cupy/fft/_fft.py): ``_output_dtype`` computes
#: float16 in float32 (complex64 for complex and R2C results, float32 for C2R ones); CuPy 14 (``_compat_caster``,
#: applied by irfft, hfft through irfft, and irfftn/irfft2 when ``axes`` has one entry; ``axes=None`` counts as
#: none) casts that real result to ``result_type(float16, 1.0)``, float16. Rows: (public function, axes given,
#: CuPy 13, CuPy 14).
CUPY_HALF = [
    ("fft", None, "complex64", "complex64"),
    ("ifft", None, "complex64", "complex64"),
    ("rfft", None, "complex64", "complex64"),
    ("ihfft", None, "complex64", "complex64"),
    ("fftn", None, "complex64", "complex64"),
    ("fftn", (0,), "complex64", "complex64"),
    ("ifft2", None, "complex64", "complex64"),
    ("rfftn", (1,), "complex64", "complex64"),
    ("rfft2", None, "complex64", "complex64"),
    ("irfft", None, "float32", "float16"),
    ("hfft", None, "float32", "float16"),
    ("irfftn", None, "float32", "float32"),
    ("irfftn", (0,), "float32", "float16"),
    ("irfftn", (0, 1), "float32", "float32"),
    ("irfft2", None, "float32", "float32"),
    ("irfft2", (0,), "float32", "float16"),
]
#: the public 2-D forms: the n-D function they run and the axes they pass by default
_TWO_D = {"fft2": "fftn", "ifft2": "ifftn", "rfft2": "rfftn", "irfft2": "irfftn"}


@pytest.mark.parametrize(("version", "column"), [("13.6.0", 2), ("14.0.0rc1", 3), ("15.1.0", 3)])
def test_cupy_half_precision_rule_is_cupys(monkeypatch, version, column):
    """The rule the CuPy adapter gives (computed in float32, the result in cupy.fft's dtype) for each public
    transform on float16, per CuPy version; checked on arrays where CuPy and a GPU are present (tests marked
    gpu). Other dtypes: no rule (integers take CuPy's default float64, the shared rule)."""
    import sys
    import types

    from nvdispatch._adapters.cupy import CupyAdapter
    from nvdispatch._fft_conventions import names_one_axis
    from nvdispatch._fft_problem import FUNCS

    fake = types.ModuleType("cupy")  # only its version is read
    fake.__version__ = version
    fake.ndarray = type("ndarray", (), {})
    monkeypatch.setitem(sys.modules, "cupy", fake)
    rule = CupyAdapter().fft_promotion
    for row in CUPY_HALF:
        func, axes = row[0], row[1]
        inner = _TWO_D.get(func, func)
        if func in _TWO_D and axes is None:
            axes = (-2, -1)
        kind = FUNCS[inner][0]
        assert rule(kind, "float16", names_one_axis(inner, axes)) == ("float32", row[column]), row
    for dtype in ("float32", "float64", "complex64", "complex128", "int32", "bool"):
        for kind in ("c2c", "r2c", "c2r"):
            assert rule(kind, dtype, True) is None and rule(kind, dtype, False) is None


def test_boolean_products_take_no_scaling_or_epilog():
    a, b = RNG.random((3, 4)) > 0.5, RNG.random((4, 5)) > 0.5
    c = RNG.random((3, 5)) > 0.5
    np.testing.assert_array_equal(nvdispatch.matmul(a, b, c), np.matmul(a, b) | c)  # NumPy adds booleans as OR
    cases = [
        ({"epilog": "RELU"}, "epilog"),
        ({"alpha": 2}, "alpha"),
        ({"alpha": True}, "alpha"),
        ({"c": c, "beta": 2}, "beta"),
    ]
    for kwargs, argument in cases:
        with pytest.raises(errors.NvdispatchError) as info:
            nvdispatch.matmul(a, b, **kwargs)
        assert info.value.argument == argument and "bool" in str(info.value)


@pytest.mark.gpu
@pytest.mark.parametrize("fw", ["cupy", "jax"])
def test_half_precision_transforms_on_the_gpu_follow_the_framework(fw):
    """On CUDA arrays: float16 comes back in the dtype the framework's own fft gives it (CuPy: complex64, and for a
    real result float32 before CuPy 14, float16 from it on for one named axis; JAX: complex64/float32)."""
    if fw == "cupy":
        xp = pytest.importorskip("cupy")
        x = xp.asarray(_values("float64", (4, 8)), dtype=xp.float16)
        own, host = xp.fft, xp.asnumpy
    else:
        jax = pytest.importorskip("jax")
        gpus = [d for d in jax.devices() if d.platform == "gpu"]
        if not gpus:
            pytest.skip("JAX sees no GPU")
        x = jax.device_put(jax.numpy.asarray(_values("float64", (4, 8)), jax.numpy.float16), gpus[0])
        own, host = jax.numpy.fft, np.asarray
    for func in ("fft", "ifft", "irfft", "hfft", "fftn", "rfft"):
        want = _own(getattr(own, func), x)
        if want is None:
            with pytest.raises(errors.UnsupportedDtypeError):
                getattr(nf, func)(x)
            continue
        got = getattr(nf, func)(x)
        assert type(got) is type(x) and _name(got.dtype) == _name(want.dtype), (func, got.dtype, want.dtype)
        _close(host(got), _oracle_fft(func, host(x)), 2e-2)


@pytest.mark.parametrize("fw", ["numpy", "torch"])
def test_epilog_inputs_in_strided_and_transposed_layouts(fw):
    """A strided bias, a bias along M in column-major order, a transposed relu_aux mask and a column-major
    gelu_aux: values against the oracle, the inputs unmodified."""
    make, host, _, _ = _framework(fw)
    va, vb = _values("float32", (5, 4)).astype(np.float32), _values("float32", (4, 6)).astype(np.float32)
    d = va.astype(np.float64) @ vb
    bias = np.repeat(_values("float32", 6).astype(np.float32), 2)
    bias_m = _values("float32", (1, 5)).astype(np.float32)
    mask = RNG.random((6, 5)) > 0.5
    pre = (_values("float32", (6, 5)) / 4).astype(np.float32)
    u = np.sqrt(2 / np.pi) * (pre.T + 0.044715 * pre.T**3)
    dgelu = 0.5 * (1 + np.tanh(u)) + 0.5 * pre.T * np.sqrt(2 / np.pi) * (1 + 3 * 0.044715 * pre.T**2) / np.cosh(u) ** 2
    cases = [
        ("BIAS", "bias", make(bias, "float32")[::2], d + bias[::2]),
        ("RELU_BIAS", "bias", make(bias_m, "float32").T, np.maximum(d + bias_m.T, 0)),
        ("DRELU", "relu_aux", make(mask, "bool").T, np.where(mask.T, d, 0)),
        ("DGELU", "gelu_aux", make(pre, "float32").T, d * dgelu),
    ]
    for epilog, name, value, want in cases:
        before = host(value).copy()
        got = nvdispatch.matmul(make(va, "float32"), make(vb, "float32"), epilog=epilog, epilog_inputs={name: value})
        _close(host(got[0] if isinstance(got, tuple) else got), want, 1e-5)
        np.testing.assert_array_equal(host(value), before)
