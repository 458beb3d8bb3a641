"""torch.func over nvdispatch's Torch operators (vmap with in_dims/out_dims/nesting, grad, jacrev, jacfwd, hessian,
per-example gradients) on the CPU, against the same math written with Torch's own float64 ops."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch.func import grad, hessian, jacfwd, jacrev, vmap  # noqa: E402

import nvdispatch  # noqa: E402
from nvdispatch import fft as nfft  # noqa: E402

D = torch.float64


_SEED = iter(range(1, 1 << 30))


def _rand(*shape, complex_=False):
    g = torch.Generator().manual_seed(next(_SEED))
    x = torch.randn(*shape, generator=g, dtype=D)
    if complex_:
        x = torch.complex(x, torch.randn(*shape, generator=g, dtype=D))
    return x


def _close(got, want):
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _close(g, w)
        return
    assert got.shape == want.shape, (got.shape, want.shape)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


# -- matmul -------------------------------------------------------------------------------------------------------
def _ref_matmul(a, b, c=None, *, alpha=1, beta=None, epilog=None, bias=None):
    t = alpha * torch.matmul(a, b)
    if c is not None:
        t = t + (1 if beta is None else beta) * c
    if bias is not None:
        t = t + bias
    if epilog and "RELU" in epilog:
        return torch.relu(t)
    if epilog and "GELU" in epilog:
        return F.gelu(t, approximate="tanh")
    return t


# (per-sample shapes a, b, c, bias; epilog; alpha, beta)
MATMUL_CASES = {
    "plain": ((3, 5), (5, 2), None, None, None, 1, None),
    "a_vector": ((5,), (5, 2), None, None, None, 1, None),
    "b_vector": ((3, 5), (5,), None, None, None, 1, None),
    "both_vectors": ((5,), (5,), None, None, None, 1, None),
    "batched": ((2, 3, 5), (5, 4), None, None, None, 1, None),
    "relu_bias": ((3, 5), (5, 4), None, (4,), "RELU_BIAS", 1, None),
    "gelu_bias_m": ((3, 5), (5, 4), None, (3, 1), "GELU_BIAS", 1, None),
    "bias_vector_a": ((5,), (5, 4), None, (4,), "BIAS", 1, None),
    "alpha_beta_c": ((3, 5), (5, 4), (3, 4), None, None, 0.5, 2.0),
    "c_broadcast_gelu": ((2, 3, 5), (5, 4), (4,), (4,), "GELU_BIAS", -1.5, 0.25),
}
IN_DIMS = {"a": (0, None, None, None), "b": (None, 0, None, None), "ab": (0, 0, None, None),
           "all": (0, 0, 0, 0), "c_bias": (None, None, 0, 0), "moved": (1, -1, None, None)}  # fmt: skip


def _matmul_fn(case, impl):
    *_, epilog, alpha, beta = MATMUL_CASES[case]

    def f(a, b, c, bias):
        if impl == "ref":
            return _ref_matmul(a, b, c, alpha=alpha, beta=beta, epilog=epilog, bias=bias)
        kwargs = {"epilog": epilog, "alpha": alpha, "beta": beta}
        if bias is not None:
            kwargs["epilog_inputs"] = {"bias": bias}
        return nvdispatch.matmul(a, b, c, **kwargs)

    return f


def _matmul_args(case, in_dims, size=3):
    shapes = MATMUL_CASES[case][:4]
    args = []
    for shape, d in zip(shapes, in_dims):
        if shape is None:
            args.append(None)
            continue
        if d is None:
            args.append(_rand(*shape))
        else:
            full = list(shape)
            full.insert(d if d >= 0 else len(shape) + 1 + d, size)
            args.append(_rand(*full))
    dims = tuple(d if s is not None else None for s, d in zip(shapes, in_dims))
    return args, dims


@pytest.mark.parametrize("case", list(MATMUL_CASES))
@pytest.mark.parametrize("dims", list(IN_DIMS))
def test_vmap_matmul(case, dims):
    args, in_dims = _matmul_args(case, IN_DIMS[dims])
    if all(d is None for d in in_dims):
        pytest.skip("nothing vmapped")
    if dims == "moved" and any(len(s) < 2 for s in MATMUL_CASES[case][:2]):
        pytest.skip("dim 1 of a vector sample")
    got = vmap(_matmul_fn(case, "nv"), in_dims=in_dims)(*args)
    want = vmap(_matmul_fn(case, "ref"), in_dims=in_dims)(*args)
    _close(got, want)


def test_vmap_matmul_nested_and_out_dims():
    a, b = _rand(2, 3, 4, 5), _rand(3, 5, 6)
    bias = _rand(6)

    def f(a, b):
        return nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})

    got = vmap(vmap(f, in_dims=(0, 0)), in_dims=(0, None), out_dims=2)(a, b)
    want = torch.relu(a @ b + bias).movedim(0, 2)
    _close(got, want)


def test_vmap_matmul_aux_outputs():
    a, b, bias = _rand(4, 3, 5), _rand(4, 5, 2), _rand(2)
    y, aux = vmap(lambda a, b: nvdispatch.matmul(a, b, epilog="GELU_AUX_BIAS", epilog_inputs={"bias": bias}))(a, b)
    t = a @ b + bias
    _close(y, F.gelu(t, approximate="tanh"))
    _close(aux["gelu_aux"], t)
    y, aux = vmap(lambda a, b: nvdispatch.matmul(a, b, epilog="BGRADB"))(a, b)
    _close(aux["bgradb"], b.sum(-2))
    y, aux = vmap(lambda a: nvdispatch.matmul(a, b[0], epilog="RELU_AUX"))(a)
    assert torch.equal(aux["relu_aux"].to(torch.bool), (a @ b[0]) > 0)


@pytest.mark.parametrize("case", ["plain", "a_vector", "b_vector", "relu_bias", "gelu_bias_m", "alpha_beta_c",
                                  "c_broadcast_gelu"])  # fmt: skip
@pytest.mark.parametrize("transform", [jacrev, jacfwd])
def test_jacobians_matmul(case, transform):
    args, _ = _matmul_args(case, (None,) * 4)
    argnums = tuple(i for i, x in enumerate(args) if x is not None)
    got = transform(_matmul_fn(case, "nv"), argnums=argnums)(*args)
    want = transform(_matmul_fn(case, "ref"), argnums=argnums)(*args)
    _close(got, want)


@pytest.mark.parametrize("case", ["gelu_bias_m", "c_broadcast_gelu"])
def test_hessian_and_grad_matmul(case):
    args, _ = _matmul_args(case, (None,) * 4)
    nv, ref = _matmul_fn(case, "nv"), _matmul_fn(case, "ref")

    def loss(f):
        return lambda a, b, c, bias: (f(a, b, c, bias) ** 2).sum()

    _close(grad(loss(nv), argnums=(0, 1))(*args), grad(loss(ref), argnums=(0, 1))(*args))
    _close(hessian(loss(nv))(*args), hessian(loss(ref))(*args))


@pytest.mark.parametrize("epilog", [None, "RELU_BIAS", "GELU_BIAS"])
def test_per_example_gradients_linear(epilog):
    w, bias, x, t = _rand(4, 6), _rand(4), _rand(8, 6), _rand(8, 4)

    def loss(impl):
        def f(w, bias, x, t):
            if impl == "ref":
                y = _ref_matmul(x, w.mT, epilog=epilog, bias=bias)
            elif epilog is None:
                y = nvdispatch.matmul(x, w.mT) + bias
            else:
                y = nvdispatch.matmul(x, w.mT, epilog=epilog, epilog_inputs={"bias": bias})
            return ((y - t) ** 2).sum()

        return f

    dims = (None, None, 0, 0)
    got = vmap(grad(loss("nv"), argnums=(0, 1)), in_dims=dims)(w, bias, x, t)
    want = vmap(grad(loss("ref"), argnums=(0, 1)), in_dims=dims)(w, bias, x, t)
    _close(got, want)


@pytest.mark.parametrize("epilog", ["GELU_AUX_BIAS", "RELU_AUX_BIAS", "BGRADA", "BGRADB"])
def test_jacobians_aux_outputs(epilog):
    a, b, bias = _rand(3, 5), _rand(5, 4), _rand(4)
    kwargs = {"epilog_inputs": {"bias": bias}} if "BIAS" in epilog else {}

    def nv(a, b):
        y, aux = nvdispatch.matmul(a, b, epilog=epilog, **kwargs)
        return y, *(v for v in aux.values() if v.is_floating_point())

    def ref(a, b):
        t = a @ b + (bias if "BIAS" in epilog else 0)
        if epilog == "GELU_AUX_BIAS":
            return F.gelu(t, approximate="tanh"), t
        if epilog == "RELU_AUX_BIAS":
            return (torch.relu(t),)
        return t, (a.sum(-1) if epilog == "BGRADA" else b.sum(-2))

    for transform in (jacrev, jacfwd):
        _close(transform(nv, argnums=(0, 1))(a, b), transform(ref, argnums=(0, 1))(a, b))


@pytest.mark.parametrize("epilog", ["DGELU", "DRELU"])
def test_jacobians_backward_epilogs(epilog):
    a, b, g = _rand(3, 5), _rand(5, 4), _rand(3, 4)
    name = "gelu_aux" if epilog == "DGELU" else "relu_aux"

    def nv(a, b, g):
        return nvdispatch.matmul(a, b, epilog=epilog, epilog_inputs={name: g if epilog == "DGELU" else g > 0})

    def ref(a, b, g):
        t = a @ b
        if epilog == "DGELU":
            return torch.ops.aten.gelu_backward(t, g, approximate="tanh")
        return torch.where(g > 0, t, torch.zeros((), dtype=t.dtype))

    argnums = (0, 1, 2) if epilog == "DGELU" else (0, 1)
    for transform in (jacrev, jacfwd):
        _close(transform(nv, argnums=argnums)(a, b, g), transform(ref, argnums=argnums)(a, b, g))


@pytest.mark.parametrize("epilog", ["DRELU", "DGELU_BGRAD"])
@pytest.mark.parametrize("in_dims", [(0, 0), (0, None), (None, 0)])
def test_vmap_backward_epilogs(epilog, in_dims):
    a, b = _rand(4, 3, 5) if in_dims[0] == 0 else _rand(3, 5), _rand(5, 2)
    g = _rand(4, 3, 2) if in_dims[1] == 0 else _rand(3, 2)
    name = "gelu_aux" if "GELU" in epilog else "relu_aux"

    def nv(a, g):
        out = nvdispatch.matmul(a, b, epilog=epilog, epilog_inputs={name: g if "GELU" in epilog else g > 0})
        return out if isinstance(out, tuple) else (out, {})

    def ref(a, g):
        t = a @ b
        y = torch.ops.aten.gelu_backward(t, g, approximate="tanh") if "GELU" in epilog else torch.where(g > 0, t, 0.0)
        return y, ({"dgelu_bgrad": y.sum(-2)} if epilog == "DGELU_BGRAD" else {})

    got, want = vmap(nv, in_dims=in_dims)(a, g), vmap(ref, in_dims=in_dims)(a, g)
    _close(got[0], want[0])
    assert got[1].keys() == want[1].keys()
    _close([got[1][k] for k in want[1]], [want[1][k] for k in want[1]])


def test_vmapped_call_is_one_fused_call(monkeypatch):
    """The batching rules fold the vmapped dimension into the operation: one public call, not one per sample."""
    from nvdispatch.integrations import torch_ops

    calls = []
    for module, name in ((torch_ops.linalg, "matmul"), (torch_ops.fft_module, "rfft"),
                         (torch_ops.fft_module, "convolve")):  # fmt: skip
        real = getattr(module, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            if not torch._C._functorch.is_functorch_wrapped_tensor(args[0]):  # the operator's kernel's call
                calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    a, b, bias, x = _rand(6, 3, 5), _rand(6, 5, 2), _rand(6, 2), _rand(6, 16)
    vmap(lambda a, b, bias: nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}))(a, b, bias)
    vmap(nfft.rfft)(x)
    assert calls == ["matmul", "rfft"]
    vmap(lambda x, h: nfft.convolve(x, h), in_dims=(0, None))(x, _rand(9, complex_=True))
    assert calls.count("convolve") == 1


def test_ensemble_vmap_over_weights():
    ws, x = _rand(5, 6, 4), _rand(7, 6)
    got = vmap(lambda w: nvdispatch.matmul(x, w, epilog="RELU"))(ws)
    _close(got, torch.relu(x @ ws))


# -- fft ----------------------------------------------------------------------------------------------------------
FFT_CASES = [
    ("fft", {"n": 6, "axis": 0, "norm": "ortho"}, True),
    ("ifft", {"axis": -1, "norm": "forward"}, True),
    ("rfft", {"n": 10, "axis": 1}, False),
    ("irfft", {"n": 7, "axis": -1, "norm": "ortho"}, True),
    ("hfft", {"n": 8, "axis": 0}, True),
    ("ihfft", {"axis": -1, "norm": "forward"}, False),
    ("fftn", {"s": (4, 5), "axes": (0, 1)}, True),
    ("ifftn", {"axes": (1,), "norm": "ortho"}, True),
    ("rfftn", {}, False),
    ("irfftn", {"s": (6, 8), "norm": "forward"}, True),
    ("fft2", {"norm": "ortho"}, True),
    ("ifft2", {"s": (3, 9)}, True),
    ("rfft2", {"axes": (1, 0)}, False),
    ("irfft2", {}, True),
]


def _fft_ref_kwargs(kwargs):
    out = {}
    for k, v in kwargs.items():
        out[{"axis": "dim", "axes": "dim"}.get(k, k)] = v
    return out


def _ref(func, kwargs):
    return lambda x: getattr(torch.fft, func)(x, **_fft_ref_kwargs(kwargs))


def _nv(func, kwargs):
    return lambda x: getattr(nfft, func)(x, **kwargs)


@pytest.mark.parametrize("func,kwargs,complex_", FFT_CASES, ids=[c[0] for c in FFT_CASES])
@pytest.mark.parametrize("in_dim", [0, 2])
def test_vmap_fft(func, kwargs, complex_, in_dim):
    x = _rand(5, 6, 3, complex_=complex_).movedim(0, in_dim)
    _close(vmap(_nv(func, kwargs), in_dims=in_dim)(x), vmap(_ref(func, kwargs), in_dims=in_dim)(x))
    x = _rand(5, 4, 6, 3, complex_=complex_).movedim(0, in_dim)  # nested: samples (6, 3)
    _close(vmap(vmap(_nv(func, kwargs)), in_dims=in_dim, out_dims=1)(x),
           vmap(vmap(_ref(func, kwargs)), in_dims=in_dim, out_dims=1)(x))  # fmt: skip


def _real_loss(f):
    def loss(x):
        y = f(x)
        return (torch.view_as_real(y.resolve_conj()) if y.is_complex() else y).pow(2).sum()

    return loss


def _realified(f, complex_):
    """``f`` as a map of real tensors (complex input as (..., 2) pairs, complex output too): what jacrev/jacfwd
    take."""

    def g(x):
        y = f(torch.view_as_complex(x) if complex_ else x)
        return torch.view_as_real(y.resolve_conj()) if y.is_complex() else y

    return g


@pytest.mark.parametrize("func,kwargs,complex_", FFT_CASES, ids=[c[0] for c in FFT_CASES])
def test_derivatives_fft(func, kwargs, complex_):
    x = _rand(6, 5, complex_=complex_)
    nv, ref = _nv(func, kwargs), _ref(func, kwargs)
    _close(grad(_real_loss(nv))(x), grad(_real_loss(ref))(x))
    xr = torch.view_as_real(x) if complex_ else x
    for transform in (jacrev, jacfwd):
        _close(transform(_realified(nv, complex_))(xr), transform(_realified(ref, complex_))(xr))
    xs = _rand(4, 6, 5, complex_=complex_)
    _close(vmap(grad(_real_loss(nv)))(xs), vmap(grad(_real_loss(ref)))(xs))


# -- convolve -----------------------------------------------------------------------------------------------------
def _ref_convolve(x, h, n=None, axis=-1):
    n = x.shape[axis] if n is None else n
    if x.is_complex():
        return torch.fft.ifft(torch.fft.fft(x, n, dim=axis) * h, n, dim=axis)
    return torch.fft.irfft(torch.fft.rfft(x, n, dim=axis) * h, n, dim=axis)


@pytest.mark.parametrize("in_dims", [(0, None), (None, 0), (0, 0), (1, 0)])
@pytest.mark.parametrize("complex_", [False, True])
def test_vmap_convolve(in_dims, complex_):
    n, axis = 8, 0
    xs = [5, 8, 3]  # (batch, signal 8 along axis 0 of (8, 3))
    x = _rand(*(xs if in_dims[0] == 0 else [8, 5, 3] if in_dims[0] == 1 else [8, 3]), complex_=complex_)
    spectrum = n if complex_ else n // 2 + 1
    h = _rand(*([5, spectrum, 1] if in_dims[1] == 0 else [spectrum, 1]), complex_=True)
    got = vmap(lambda x, h: nfft.convolve(x, h, n=n, axis=axis), in_dims=in_dims)(x, h)
    want = vmap(lambda x, h: _ref_convolve(x, h, n, axis), in_dims=in_dims)(x, h)
    _close(got, want)


@pytest.mark.parametrize("complex_", [False, True])
def test_derivatives_convolve(complex_):
    x, h = _rand(2, 12, complex_=complex_), _rand(12 if complex_ else 7, complex_=True)
    hr = torch.view_as_real(h)
    xr = torch.view_as_real(x) if complex_ else x

    def nv(x, h):
        return nfft.convolve(x, h)

    for transform in (jacrev, jacfwd):
        got = transform(lambda x, h: _realified(lambda x: nv(x, torch.view_as_complex(h)), complex_)(x),
                        argnums=(0, 1))(xr, hr)  # fmt: skip
        want = transform(lambda x, h: _realified(lambda x: _ref_convolve(x, torch.view_as_complex(h)), complex_)(x),
                         argnums=(0, 1))(xr, hr)  # fmt: skip
        _close(got, want)
    loss = lambda f: lambda x, h: _real_loss(lambda x: f(x, h))(x)  # noqa: E731
    xs = _rand(3, 2, 12, complex_=complex_)
    _close(vmap(grad(loss(nv)), in_dims=(0, None))(xs, h), vmap(grad(loss(_ref_convolve)), in_dims=(0, None))(xs, h))


def test_eager_forward_ad_after_plain_calls():
    """torch.autograd.forward_ad's dual tensors get their tangents, also where plain calls cached their plans."""
    fw = torch.autograd.forward_ad
    a, b, bias, x = _rand(3, 5), _rand(5, 4), _rand(4), _rand(2, 16)
    da, dx = _rand(3, 5), _rand(2, 16)
    for _ in range(3):  # the plain calls' plans, cached and remembered
        nvdispatch.matmul(a, b, epilog="GELU_BIAS", epilog_inputs={"bias": bias})
        nfft.rfft(x, norm="ortho")
    with fw.dual_level():
        y = nvdispatch.matmul(fw.make_dual(a, da), b, epilog="GELU_BIAS", epilog_inputs={"bias": bias})
        s = nfft.rfft(fw.make_dual(x, dx), norm="ortho")
        got = (fw.unpack_dual(y).tangent, fw.unpack_dual(s).tangent)
    t = a @ b + bias
    want = (torch.ops.aten.gelu_backward(da @ b, t, approximate="tanh"), torch.fft.rfft(dx, norm="ortho"))
    _close(got, want)


# -- compiled ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dynamic", [False, True])
def test_compiled_vmap_fullgraph(dynamic):
    a, b, bias, x = _rand(4, 3, 5), _rand(5, 2), _rand(2), _rand(4, 16)

    q = torch.randn(3, 4, 16, generator=torch.Generator().manual_seed(44)).to(torch.float8_e4m3fn)
    w8 = torch.randn(16, 8, generator=torch.Generator().manual_seed(45)).to(torch.float8_e4m3fn)
    sa = torch.tensor([0.5, 1.0, 2.0])

    def fp8(q, sa):
        return nvdispatch.matmul(q, w8, quantization_scales={"a": sa}, options={"result_type": "float32"})

    def f(a, x, q, sa):
        y = vmap(lambda a: nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}))(a)
        return y, vmap(nfft.rfft)(x), vmap(fp8)(q, sa)

    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True, backend="aot_eager", dynamic=dynamic)(a, x, q, sa)
    want8 = torch.stack([float(s) * (qi.double() @ w8.double()) for qi, s in zip(q, sa)])
    _close(got[:2], (torch.relu(a @ b + bias), torch.fft.rfft(x)))
    torch.testing.assert_close(got[2].double(), want8, rtol=1e-6, atol=1e-6)  # float32 sums of exact products


# -- FP8 with vmapped scales ----------------------------------------------------------------------------------------
def test_vmap_fp8_per_sample_scales():
    """A vmapped FP8 scale: each sample its own product (scales, saturation and result_amax per sample)."""
    g = torch.Generator().manual_seed(41)
    x = torch.randn(3, 8, 16, generator=g).to(torch.float8_e4m3fn)
    w = torch.randn(16, 12, generator=g).to(torch.float8_e4m3fn)
    bias = torch.randn(12, generator=g).to(torch.bfloat16)
    sa, sd = torch.tensor([0.5, 1.0, 2.0]), torch.tensor([4.0, 1.0, 0.25])

    def f(x, sa, sd):
        return nvdispatch.matmul(x, w, epilog="RELU_BIAS", epilog_inputs={"bias": bias},
                                 quantization_scales={"a": sa, "b": 2.0, "d": sd},
                                 options={"result_type": "float8_e4m3fn", "result_amax": True})  # fmt: skip

    y, aux = vmap(f)(x, sa, sd)
    assert y.dtype == torch.float8_e4m3fn and y.shape == (3, 8, 12) and aux["result_amax"].shape == (3,)
    xs, wn, bn = (t.float().numpy().astype(np.float64) for t in (x, w, bias))
    for i in range(3):
        t = np.maximum(float(sa[i]) * 2.0 * xs[i] @ wn + bn, 0)  # the NumPy oracle, before scale_d
        np.testing.assert_allclose(float(aux["result_amax"][i]), np.abs(t).max(), rtol=1e-5)
        want = np.clip(float(sd[i]) * t, -448, 448)  # e4m3's saturation; rounding: 3 mantissa bits
        np.testing.assert_allclose(y[i].float().numpy(), want, rtol=2**-4, atol=2**-9 * float(sd[i]))
        one, one_aux = f(x[i], sa[i], sd[i])  # each sample as its own call
        assert torch.equal(y[i].view(torch.uint8), one.view(torch.uint8))
        assert torch.equal(aux["result_amax"][i], one_aux["result_amax"])


def test_vmap_fp8_per_sample_scales_taken_from_strided_views_along_any_dimension():
    """Per-sample slices as vmap hands them: samples along x's middle dimension, scales every other element of a
    larger array (each a 0-d view at its own offset, as on CUDA, where cuBLASLt gets aligned copies of them)."""
    g = torch.Generator().manual_seed(43)
    x = torch.randn(8, 4, 32, generator=g).to(torch.float8_e4m3fn)  # 4 samples along dim 1
    w = torch.randn(24, 32, generator=g).to(torch.float8_e4m3fn).t()  # column-major (TN)
    pool = torch.rand(8, generator=g) + 0.5
    sa, sb = pool[::2], pool[1::2]

    def f(x, sa, sb):
        return nvdispatch.matmul(x, w, quantization_scales={"a": sa, "b": sb}, options={"result_type": "float32"})

    got = vmap(f, in_dims=(1, 0, 0))(x, sa, sb)
    assert got.shape == (4, 8, 24) and got.dtype == torch.float32
    xs, wn = x.float().numpy().astype(np.float64), w.float().numpy().astype(np.float64)
    for i in range(4):  # the NumPy oracle: float32 sums of exact FP8 products
        want = float(sa[i]) * float(sb[i]) * (xs[:, i] @ wn)
        np.testing.assert_allclose(got[i].numpy(), want, rtol=1e-5, atol=1e-5)


# -- FusedMLP -------------------------------------------------------------------------------------------------------
def _np_mlp(x, ws, bs, activation):
    h = x
    for i, (w, b) in enumerate(zip(ws, bs)):
        h = h @ w.T + b
        if i < len(ws) - 1:
            h = np.maximum(h, 0) if activation == "relu" else 0.5 * h * (1 + np.tanh(_GK * (h + 0.044715 * h**3)))
    return h


_GK = math.sqrt(2 / math.pi)


def _fd(f, x, eps=1e-6):
    """The Jacobian of NumPy ``f`` at ``x`` by central differences (``out.shape + x.shape``)."""
    cols = []
    for idx in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += eps
        xm[idx] -= eps
        cols.append((f(xp) - f(xm)) / (2 * eps))
    out = np.stack(cols, axis=-1)
    return out.reshape(*out.shape[:-1], *x.shape)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_fused_mlp_under_transforms(activation):
    """vmap (inputs; an ensemble of stacked models), per-example gradients, jacrev, jacfwd and hessian through
    FusedMLP, against NumPy central differences (each layer one fused matmul call under the transforms)."""
    from torch.func import functional_call, stack_module_state

    from nvdispatch.integrations.torch_mlp import FusedMLP

    torch.manual_seed(43)
    models = [FusedMLP([4, 5, 3], activation=activation, relu_backward="drelu", dtype=D) for _ in range(2)]
    mlp = models[0]
    xs = _rand(3, 2, 4)
    params = {k: v.detach() for k, v in mlp.named_parameters()}
    names = ["0.weight", "2.weight"], ["0.bias", "2.bias"]
    np_p = {k: v.numpy() for k, v in params.items()}

    def oracle(x, p=np_p):
        return _np_mlp(x, [p[k] for k in names[0]], [p[k] for k in names[1]], activation)

    got = vmap(mlp)(xs)
    np.testing.assert_allclose(got.detach().numpy(), oracle(xs.numpy()), rtol=1e-12, atol=1e-12)
    stacked, _ = stack_module_state(models)
    ens = vmap(lambda p, x: functional_call(mlp, p, (x,)), in_dims=(0, None))(stacked, xs[0])
    for i, m in enumerate(models):
        np.testing.assert_allclose(ens[i].detach().numpy(), oracle(xs[0].numpy(), {k: v.detach().numpy()
                                   for k, v in m.named_parameters()}), rtol=1e-12, atol=1e-12)  # fmt: skip

    def loss(p, x):
        return functional_call(mlp, p, (x,)).sin().sum()

    per_example = vmap(grad(loss), in_dims=(None, 0))(params, xs)
    for k in params:
        for i in range(3):

            def f(v, k=k, i=i):
                return np.sin(oracle(xs[i].numpy(), {**np_p, k: v})).sum()

            np.testing.assert_allclose(per_example[k][i].numpy(), _fd(f, np_p[k]), rtol=1e-6, atol=1e-6)
    x0 = xs[0, 0]
    want = _fd(lambda v: oracle(v), x0.numpy())
    for transform in (jacrev, jacfwd):
        np.testing.assert_allclose(transform(mlp)(x0).detach().numpy(), want, rtol=1e-6, atol=1e-6)
    hess = hessian(lambda x: mlp(x).sin().sum())(x0)
    want = _fd(lambda v: _fd(lambda u: np.sin(oracle(u)).sum(), v, 1e-4), x0.numpy(), 1e-4)
    np.testing.assert_allclose(hess.detach().numpy(), want, rtol=1e-4, atol=1e-5)
