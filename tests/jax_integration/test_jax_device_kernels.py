"""The GPU kernels' XLA side, on the CPU: the device branch of every staged call, with the cuBLASLt/cuFFT launch
replaced by a simulation that writes cuBLASLt's and cuFFT's formats with NumPy (float64).

What is checked without a GPU: the operands XLA hands the device kernel are ones the ``cuda`` executor's plans
read in place (no copy, no cast: what ``LtMatmulPlan.execute_into`` requires, and cuFFT layouts without a
decline), the output buffers are those the plan writes (``lt_setup.output_layouts``), and XLA's conversions
around the call (mask bits, padded pre-activations, the column orientation's transposes, per-batch bias
gradients) give the portable results, forward and backward. The formats are written here from cuBLASLt's
documentation (``_cuda/lt_aux.py``'s docstring), not from nvdispatch's code; GPU tests run the real launches.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fft_reference import assert_close as fft_close
from fft_reference import make
from matmul_reference import assert_close, expected

import nvdispatch
from nvdispatch._cuda.lt_setup import output_layouts, setup
from nvdispatch._detect import Device
from nvdispatch.executors import cuda_fft
from nvdispatch.integrations import jax_fft_kernel, jax_matmul_kernel
from nvdispatch.integrations.jax_matmul_kernel import pack_mask, unpack_mask

_itemsize = lambda a: a.dtype.itemsize


def _logical(buffer: np.ndarray, view):
    shape, strides = view
    return np.lib.stride_tricks.as_strided(buffer, shape, tuple(s * _itemsize(buffer) for s in strides))


def _decode_bits(bits: np.ndarray, orientation: str, m: int, n: int) -> np.ndarray:
    """cuBLASLt's ReLU bits -> the boolean (..., m, n) mask: row orientation, bit j%8 of byte j//8 of row i; column
    orientation, the (..., n, ld/8) buffer holding bit i%8 of byte i//8 of row j."""
    if orientation == "row":
        return ((bits[..., :, np.arange(n) // 8] >> (np.arange(n) % 8)) & 1).astype(bool)
    cols = ((bits[..., :, np.arange(m) // 8] >> (np.arange(m) % 8)) & 1).astype(bool)  # (..., n, m)
    return np.swapaxes(cols, -1, -2)


def _encode_bits(mask: np.ndarray, orientation: str, shape) -> np.ndarray:
    out = np.zeros(shape, np.uint8)
    rows = mask if orientation == "row" else np.swapaxes(mask, -1, -2)
    for r in range(rows.shape[-1]):
        out[..., r // 8] |= (rows[..., r].astype(np.uint8) << (r % 8)).astype(np.uint8)
    return out


def _simulated_lt(call, options, names, views, orientation, outputs):
    """A host callback doing what the device kernel's plan does, in float64 from the cuBLASLt formats."""
    spec = nvdispatch._epilog.spec_of(call.epilog)

    def callback(ctx, outs, *ins):
        _LAUNCHES.append("cublaslt")
        bufs = {name: np.asarray(x) for name, x in zip(names, ins)}
        problem = jax_matmul_kernel._device_problem(call, options, bufs, views, Device("cuda", 0))
        s = setup(problem, orientation)
        assert not s.lt_a.copy and not s.lt_b.copy, "a/b would be copied"
        assert s.c_mode != "copy" and not s.bias_copy and not s.bias_cast, (s.c_mode, s.bias_copy, s.bias_cast)
        assert s.aux_in in (None, "direct"), s.aux_in
        layouts = output_layouts(problem, s)
        assert tuple(layouts) == outputs
        for (shape, dtype), buf in zip(layouts.values(), outs):
            assert tuple(buf.shape) == tuple(shape) and np.dtype(buf.dtype) == np.dtype(dtype), (shape, buf.shape)
        shapes = {name: tuple(int(d) for d in bufs[name].shape) for name in names}
        logical = {name: _logical(bufs[name], jax_matmul_kernel._view(views[name], shapes[name])) for name in names}
        m, n = problem.m, problem.n
        inputs = {}
        for name in names:
            if name == "relu_aux":
                inputs[name] = _decode_bits(logical[name] if orientation == "row" else bufs[name], orientation, m, n)
            elif name in ("bias", "gelu_aux"):
                inputs[name] = np.asarray(logical[name], np.float64)
        a, b = np.asarray(logical["a"], np.float64), np.asarray(logical["b"], np.float64)
        c = np.asarray(logical["c"], np.float64) if "c" in logical else None
        want, aux = expected(a, b, c, call.alpha, call.beta, call.epilog, inputs, options.bgrad_axis)
        written = dict(zip(outputs, (np.asarray(o) for o in outs)))
        written["out"][...] = want if orientation == "row" else np.swapaxes(want, -1, -2)
        for name in spec.outputs:
            buf = written[name]
            if name == "relu_aux":
                buf[...] = _encode_bits(aux[name], orientation, buf.shape)
            elif name == "gelu_aux":
                buf[...] = 0
                if orientation == "row":
                    buf[..., :n] = aux[name]
                else:
                    buf[..., :m] = np.swapaxes(aux[name], -1, -2)
            else:  # bias gradients and operand sums: one per batch matrix, (..., len)
                value = aux[name]
                if value.ndim == buf.ndim + 1:  # a bias gradient along M, (..., m, 1)
                    value = value[..., 0]
                buf[...] = np.broadcast_to(value, buf.shape)

    return callback


_LAUNCHES: list[str] = []


@pytest.fixture
def on_the_gpu_branch(monkeypatch):
    """Trace every staged call's device branch (as on a GPU), its launches simulated."""
    jax.clear_caches()  # nothing traced before (host branch) may be reused
    monkeypatch.setattr(jax.lax, "platform_dependent", lambda *args, cuda, **others: cuda(*args))
    monkeypatch.setattr(jax_matmul_kernel, "_device_callback", _simulated_lt)
    monkeypatch.setattr(jax_fft_kernel, "_device_callback", _simulated_cufft)
    _LAUNCHES.clear()
    yield
    jax.clear_caches()
    assert _LAUNCHES, "no simulated launch ran: the device branch was not taken"


def test_bit_masks_are_cublaslt_layout():
    rng = np.random.default_rng(0)
    mask = rng.random((2, 5, 130)) > 0.5
    bits = np.asarray(pack_mask(jnp.asarray(mask), 256))
    assert bits.shape == (2, 5, 32) and bits.dtype == np.uint8
    np.testing.assert_array_equal(_decode_bits(bits, "row", 5, 130), mask)
    np.testing.assert_array_equal(bits, _encode_bits(mask, "row", bits.shape))
    np.testing.assert_array_equal(np.asarray(unpack_mask(jnp.asarray(bits), 130)), mask)


EPILOGS = [e.name for e in nvdispatch.Epilog]


def _operands(epilog, sa, sb, bias_axis, seed=0):
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal(sa).astype(np.float32), rng.standard_normal(sb).astype(np.float32)
    result = np.matmul(a, b).shape
    m, n = result[-2], result[-1]
    inputs = {}
    if "BIAS" in epilog and "BGRAD" not in epilog:
        inputs["bias"] = rng.standard_normal((n,) if bias_axis == "n" else (m, 1)).astype(np.float32)
    if epilog.startswith("DRELU"):
        inputs["relu_aux"] = rng.random(result) > 0.4
    if epilog.startswith("DGELU"):
        inputs["gelu_aux"] = rng.standard_normal(result).astype(np.float32)
    return a, b, inputs


def _compare(got, want, want_aux):
    y, aux = got if isinstance(got, tuple) else (got, {})
    assert_close(np.asarray(y), want, "float32")
    for name, value in want_aux.items():
        if value.dtype == bool:
            np.testing.assert_array_equal(np.asarray(aux[name]), value, err_msg=name)
        else:
            assert np.asarray(aux[name]).shape == value.shape, name
            assert_close(np.asarray(aux[name]), value, "float32", name)


#: (epilog, orientation): the column orientation is cuBLASLt's for a bias along M and bias gradients along N
_ORIENTED = [(e, "row") for e in EPILOGS] + [(e, "col") for e in EPILOGS if "BIAS" in e or e.endswith("_BGRAD")]


@pytest.mark.parametrize("epilog, orientation", _ORIENTED)
@pytest.mark.parametrize("shapes", [((6, 3), (3, 13)), ((2, 6, 3), (3, 13)), ((1, 6, 3), (2, 3, 13))], ids=["2d", "batch", "broadcast"])
def test_device_branch_gives_the_portable_results(on_the_gpu_branch, epilog, orientation, shapes):
    a, b, inputs = _operands(epilog, *shapes, "n" if orientation == "row" else "m")
    axis = "m" if orientation == "col" else "n"
    options = {"bgrad_axis": axis}
    got = jax.jit(lambda a, b, ins: nvdispatch.matmul(a, b, epilog=epilog, epilog_inputs=ins or None, options=options))(a, b, inputs)
    want, want_aux = expected(a, b, None, 1, None, epilog, inputs, axis)
    _compare(got, want, want_aux)


@pytest.mark.parametrize("orientation", ["row", "col"])
def test_device_branch_c_alpha_beta(on_the_gpu_branch, orientation):
    a, b, inputs = _operands("RELU_BIAS", (2, 6, 3), (3, 5), "n" if orientation == "row" else "m")
    c = np.random.default_rng(3).standard_normal((6, 5)).astype(np.float32)
    f = lambda a, b, c, ins: nvdispatch.matmul(a, b, c, alpha=0.5, beta=2.0, epilog="RELU_BIAS", epilog_inputs=ins)
    want, _ = expected(a, b, c, 0.5, 2.0, "RELU_BIAS", inputs)
    _compare(jax.jit(f)(a, b, c, inputs), want, {})


@pytest.mark.parametrize("epilog", ["RELU_BIAS", "GELU_BIAS", "GELU_AUX_BIAS", "DGELU_BGRAD", "BGRADA"])
@pytest.mark.parametrize("bias_axis", ["n", "m"])
def test_device_branch_gradients(on_the_gpu_branch, x64, epilog, bias_axis):
    """The backward pass through the device branch (transposed operands read in place, BGRAD epilogs) agrees
    with the host branch's, which the CPU tests hold to finite differences."""
    a, b, inputs = _operands(epilog, (2, 6, 3), (3, 5), bias_axis, seed=5)
    a, b = a.astype(np.float64), b.astype(np.float64)
    inputs = {k: (v.astype(np.float64) if v.dtype != bool else v) for k, v in inputs.items()}
    options = {"bgrad_axis": bias_axis}

    def loss(a, b, ins):
        got = nvdispatch.matmul(a, b, epilog=epilog, epilog_inputs=ins or None, options=options)
        y, aux = got if isinstance(got, tuple) else (got, {})
        return jnp.sum(jnp.sin(y)) + sum(jnp.sum(jnp.cos(v)) for v in aux.values() if v.dtype != bool)

    floats = {k: v for k, v in inputs.items() if v.dtype != bool}
    masks = {k: v for k, v in inputs.items() if v.dtype == bool}
    grad = jax.jit(jax.grad(lambda a, b, fl: loss(a, b, {**fl, **masks}), argnums=(0, 1, 2)))
    got = grad(a, b, floats)
    assert _LAUNCHES
    jax.clear_caches()
    with pytest.MonkeyPatch.context() as mp:  # the host branch for the reference
        mp.setattr(jax.lax, "platform_dependent", lambda *args, cpu, **others: cpu(*args))
        want = jax.jit(jax.grad(lambda a, b, fl: loss(a, b, {**fl, **masks}), argnums=(0, 1, 2)))(a, b, floats)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-10, atol=1e-10)


def _simulated_cufft(call, dtype):
    def callback(ctx, outs, x):
        _LAUNCHES.append("cufft")
        arr = np.asarray(x)
        problem = call.problem(arr.shape, dtype, "dlpack", Device("cuda", 0))
        lay = cuda_fft.layout(problem)
        assert isinstance(lay, dict), lay  # cuFFT takes it as it is: no decline
        assert problem.scale() == 1.0
        axes = call.axes(arr.ndim)
        wide = arr.astype(np.complex128 if np.iscomplexobj(arr) else np.float64)
        y = getattr(np.fft, call.func)(wide, s=call.lengths, axes=axes, norm=call.norm)
        np.asarray(outs[0])[...] = y

    return callback


@pytest.mark.parametrize(
    "func, kind, kw",
    [
        ("fft", "c", {"n": 7, "axis": 0, "norm": "ortho"}),
        ("ifftn", "c", {"axes": (2, 0)}),
        ("rfftn", "r", {"axes": (2, 0), "s": (5, 6)}),
        ("irfft", "c", {"axis": 1}),
        ("irfftn", "c", {"s": (3, 4, 6)}),
        ("hfft", "r", {"n": 7}),
        ("ihfft", "r", {"norm": "forward"}),
        ("rfft2", "r", {}),
    ],
)
def test_fft_device_branch(on_the_gpu_branch, func, kind, kw):
    x = make((4, 5, 6), "complex64" if kind == "c" else "float32", 1)
    got = jax.jit(lambda v: getattr(nvdispatch.fft, func)(v, **kw))(x)
    want = getattr(np.fft, func)(x.astype(np.complex128 if kind == "c" else np.float64), **kw)
    fft_close(np.asarray(got), want, "complex64" if kind == "c" else "float32")


def test_fft_device_branch_more_axes_and_gradients(on_the_gpu_branch, x64):
    x = make((3, 4, 2, 5), "float64", 2)
    got = jax.jit(lambda v: nvdispatch.fft.rfftn(v))(x)
    fft_close(np.asarray(got), np.fft.rfftn(x), "float64")
    g = jax.jit(jax.grad(lambda v: jnp.sum(jnp.abs(nvdispatch.fft.rfftn(v)) ** 2)))(x)
    v = make(x.shape, "float64", 3)
    f = lambda t: float(np.sum(np.abs(np.fft.rfftn(x + t * v)) ** 2))
    assert abs((f(1e-6) - f(-1e-6)) / 2e-6 - float(np.sum(np.asarray(g) * v))) <= 1e-6 * f(0)


@pytest.mark.parametrize("epilog", ["RELU_AUX_BIAS", "GELU_AUX", "DRELU_BGRAD", "BGRADA", "BGRADB"])
def test_device_branch_double_precision_stages_the_plain_product(on_the_gpu_branch, x64, epilog):
    """Float64 epilogs: the plain product on the device kernel, the epilog as XLA operations."""
    a, b, inputs = _operands(epilog, (2, 6, 3), (3, 5), "n")
    a, b = a.astype(np.float64), b.astype(np.float64)
    inputs = {k: (v.astype(np.float64) if v.dtype != bool else v) for k, v in inputs.items()}
    got = jax.jit(lambda a, b, ins: nvdispatch.matmul(a, b, epilog=epilog, epilog_inputs=ins or None))(a, b, inputs)
    want, want_aux = expected(a, b, None, 1, None, epilog, inputs)
    y, aux = got if isinstance(got, tuple) else (got, {})
    assert_close(np.asarray(y), want, "float64")
    for name, value in want_aux.items():
        if value.dtype == bool:
            np.testing.assert_array_equal(np.asarray(aux[name]), value)
        else:
            assert_close(np.asarray(aux[name]), value, "float64", name)


@pytest.mark.parametrize("epilog, found", [("RELU_AUX_BIAS", None), ("BGRADB", None), ("RELU", "col")])
def test_where_cublaslt_fuses_only_otherwise_the_device_branch_adapts(on_the_gpu_branch, monkeypatch, epilog, found):
    """Traced where JAX has a GPU, the device branch asks cuBLASLt's heuristic: no fused kernel stages the
    plain product and the epilog in XLA; a kernel only in the column orientation is taken there."""
    from nvdispatch._cuda import lt_descriptors

    monkeypatch.setattr(jax_matmul_kernel, "_jax_has_gpu", lambda: True)
    asked = []

    def probe(problem):
        asked.append(problem.epilog.epilog.name)
        return (found, False, "") if problem.epilog.steps else ("row", False, "")

    monkeypatch.setattr(lt_descriptors, "probe", probe)
    a, b, inputs = _operands(epilog, (2, 6, 3), (3, 13), "n")
    got = jax.jit(lambda a, b, ins: nvdispatch.matmul(a, b, epilog=epilog, epilog_inputs=ins or None))(a, b, inputs)
    want, want_aux = expected(a, b, None, 1, None, epilog, inputs)
    _compare(got, want, want_aux)
    assert epilog in asked


def test_integer_products_on_the_device_branch_are_xla_s(on_the_gpu_branch):
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    b = np.arange(12, dtype=np.int32).reshape(3, 4) - 5
    got = jax.jit(lambda a, b: nvdispatch.matmul(a, b, epilog="RELU"))(a, b)
    np.testing.assert_array_equal(np.asarray(got), np.maximum(a @ b, 0))
    _LAUNCHES.append("xla")  # no kernel staged: XLA's own product


def test_device_branch_nested_transformations_read_operands_in_place(on_the_gpu_branch, x64):
    """jacrev of jacfwd batches the tangent products along two vmapped axes, an operand batched along one and
    broadcast along the other: the staged kernel (which copies nothing) must still read every operand in place."""
    rng = np.random.default_rng(5)
    a, b, bias = (jnp.asarray(rng.standard_normal(s)) for s in ((4, 3), (3, 2), (2,)))

    def loss(b, nv):
        f = nvdispatch.matmul if nv else lambda a, b, **kw: jax.nn.gelu(a @ b + kw["epilog_inputs"]["bias"], approximate=True)
        return jnp.sum(f(a, b, epilog="GELU_BIAS", epilog_inputs={"bias": bias}) ** 2)

    want = np.asarray(jax.hessian(loss)(b, False))
    for transform in (jax.hessian, lambda f: jax.jacrev(jax.jacfwd(f))):
        got = np.asarray(jax.jit(transform(loss), static_argnums=1)(b, True))
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
    x, y = (jnp.asarray(rng.standard_normal(s)) for s in ((5, 1, 4, 3), (7, 3, 2)))
    got = jax.jit(lambda x, y: nvdispatch.matmul(x, y))(x, y)
    np.testing.assert_allclose(np.asarray(got), np.matmul(np.asarray(x), np.asarray(y)), rtol=1e-12)
