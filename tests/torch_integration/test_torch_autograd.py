"""Backward through the ``nvdispatch::`` operators, eagerly and in compiled graphs, against float64 references
written here in NumPy: the chain rule by hand for matmul (every forward and backward epilog, biases along N and M,
batched and 1-D operands, alpha/beta/c), and for the transforms the derivative of each NumPy transform read off
as a real-linear map (``grad_j = dL/dRe x_j + i dL/dIm x_j``, Torch's convention for complex tensors)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import nvdispatch
from tests.matmul.matmul_reference import gelu, gelu_grad

torch = pytest.importorskip("torch")

M, K, N = 5, 4, 6
MODES = ["eager", "compiled"]


def _t(*shape, seed=0, dtype=torch.float64, grad=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    if dtype.is_complex:  # an imaginary part of its own: a conjugation shows
        x = torch.complex(x, torch.randn(*shape, generator=g, dtype=torch.float64))
    return x.to(dtype).requires_grad_(grad)


def _run(fn, mode):
    return fn if mode == "eager" else torch.compile(fn, backend="aot_eager", fullgraph=True)


def _n(x):
    return x.detach().numpy()


def _sum_to(x: np.ndarray, shape) -> np.ndarray:
    """``x`` summed over the dimensions it was broadcast along from ``shape``."""
    while x.ndim > len(shape):
        x = x.sum(0)
    for i, size in enumerate(shape):
        if size == 1 and x.shape[i] != 1:
            x = x.sum(i, keepdims=True)
    return x


# -- matmul, forward epilogs ----------------------------------------------------------------------------------------
def _np_forward_grads(epilog, a, b, bias, c, alpha, beta, w, v):
    """Gradients of ``L = sum(w * y) + sum(v * gelu_aux)`` for ``y = epilog(alpha a@b + beta c + bias)``."""
    pa = a[None] if a.ndim == 1 else a
    pb = b[:, None] if b.ndim == 1 else b
    t = alpha * (pa @ pb)
    shape = t.shape
    squeeze = (a.ndim == 1, b.ndim == 1)

    def promote(x):
        if squeeze == (True, True):
            return x[..., None, None]
        return x[..., None, :] if squeeze[0] else (x[..., None] if squeeze[1] else x)

    if c is not None:
        t = t + beta * promote(np.broadcast_to(c, np.matmul(a, b).shape))
    if bias is not None:
        t = t + (bias.reshape(1, -1) if bias.ndim == 1 else bias)
    gt = promote(w)
    if "RELU" in epilog:
        gt = gt * (t > 0)
    elif "GELU" in epilog:
        gt = gt * gelu_grad(t) + (promote(v) if v is not None else 0)
    grads = {
        "a": _sum_to(alpha * gt @ np.swapaxes(pb, -1, -2), pa.shape).reshape(a.shape),
        "b": _sum_to(alpha * np.swapaxes(pa, -1, -2) @ gt, pb.shape).reshape(b.shape),
    }
    if bias is not None:
        grads["bias"] = _sum_to(gt, (1, bias.shape[0]) if bias.ndim == 1 else bias.shape).reshape(bias.shape)
    if c is not None:
        grads["c"] = _sum_to(beta * np.broadcast_to(gt, shape).reshape(np.matmul(a, b).shape), c.shape)
    return grads


FORWARD = ["DEFAULT", "RELU", "GELU", "BIAS", "RELU_BIAS", "GELU_BIAS", "RELU_AUX", "RELU_AUX_BIAS", "GELU_AUX",
           "GELU_AUX_BIAS"]  # fmt: skip
LAYOUTS = {
    "2d": ((M, K), (K, N)),
    "batched-a": ((2, M, K), (K, N)),  # a linear layer over a batch: the BGRADB product on flattened rows
    "batched-both": ((3, M, K), (3, K, N)),
    "broadcast": ((2, 1, M, K), (3, K, N)),
    "a-vector": ((K,), (2, K, N)),
    "b-vector": ((M, K), (K,)),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("epilog", FORWARD)
def test_forward_epilog_gradients(epilog, layout, mode):
    sa, sb = LAYOUTS[layout]
    if "BIAS" in epilog and len(sb) == 1:
        pytest.skip("a bias needs an N axis")
    a, b = _t(*sa), _t(*sb, seed=1)
    bias = _t(N, seed=2) if "BIAS" in epilog else None
    inputs = {"bias": bias} if bias is not None else None
    y = nvdispatch.matmul(a.detach(), b.detach(), epilog=epilog, epilog_inputs=inputs)
    y = y[0] if isinstance(y, tuple) else y
    w = _t(*y.shape, seed=3, grad=False)
    v = _t(*y.shape, seed=4, grad=False) if "GELU_AUX" in epilog else None

    def loss(a, b, bias):
        out = nvdispatch.matmul(a, b, alpha=1.5, epilog=epilog, epilog_inputs=None if bias is None else {"bias": bias})
        if isinstance(out, tuple):
            out, aux = out
            return (out * w).sum() + ((aux["gelu_aux"] * v).sum() if v is not None else 0)
        return (out * w).sum()

    _run(loss, mode)(a, b, bias).backward()
    want = _np_forward_grads(epilog, _n(a), _n(b), None if bias is None else _n(bias), None, 1.5, None, _n(w),
                             None if v is None else _n(v))  # fmt: skip
    for name, tensor in (("a", a), ("b", b), ("bias", bias)):
        if tensor is not None:
            np.testing.assert_allclose(_n(tensor.grad), want[name], rtol=1e-10, atol=1e-10, err_msg=name)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("rows", [(M,), (2, M)], ids=["2d", "batched-a"])
@pytest.mark.parametrize("epilog", ["DEFAULT", "BIAS", "RELU_BIAS", "GELU_BIAS"])
def test_a_transposed_weight_gets_its_gradient_in_its_own_layout(epilog, rows, mode):
    """``b = w.mT`` of an ``(N, K)`` weight, as ``torch.nn.functional.linear``: the weight's gradient is the NumPy
    chain rule's, written in ``w``'s row-major layout (``gt^T @ a``, the bias gradient by BGRADA), no copy of it."""
    from torch.profiler import profile

    a, w = _t(*rows, K), _t(N, K, seed=1)
    bias = _t(N, seed=2) if "BIAS" in epilog else None
    out_w = _t(*rows, N, seed=3, grad=False)

    def loss(a, w, bias):
        inputs = None if bias is None else {"bias": bias}
        return (nvdispatch.matmul(a, w.mT, alpha=1.5, epilog=epilog, epilog_inputs=inputs) * out_w).sum()

    fn = _run(loss, mode)
    fn(a, w, bias).backward()
    want = _np_forward_grads(epilog, _n(a), _n(w).T, None if bias is None else _n(bias), None, 1.5, None, _n(out_w),
                             None)  # fmt: skip
    np.testing.assert_allclose(_n(w.grad), want["b"].T, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(_n(a.grad), want["a"], rtol=1e-10, atol=1e-10)
    if bias is not None:
        np.testing.assert_allclose(_n(bias.grad), want["bias"], rtol=1e-10, atol=1e-10)
    assert w.grad.stride() == w.stride()
    w.grad = None
    with profile(record_shapes=True) as prof:
        fn(a, w, bias).backward()
    copies = [(e.name, e.input_shapes) for e in prof.events()
              if e.name in ("aten::copy_", "aten::clone", "aten::contiguous") and [N, K] in e.input_shapes]  # fmt: skip
    assert not copies, copies


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", ["bias-m", "bias-batched-rows", "alpha-beta-c", "c-broadcast", "float32-f32",
                                  "bf16-f32-bias", "complex"])  # fmt: skip
def test_more_gradients(case, mode):
    dtype, bias_dtype = torch.float64, torch.float64
    a, b, c, beta, alpha, epilog = _t(M, K), _t(K, N, seed=1), None, None, 1.5, "GELU_BIAS"
    bias = _t(N, seed=2)
    if case == "bias-m":
        bias = _t(M, 1, seed=2)
    elif case == "bias-batched-rows":
        a, bias = _t(3, M, K), _t(3, 1, N, seed=2)
    elif case in ("alpha-beta-c", "c-broadcast"):
        c, beta, epilog = (_t(M, N, seed=5) if case == "alpha-beta-c" else _t(N, seed=5)), 0.5, "RELU_BIAS"
    elif case == "float32-f32":
        dtype = bias_dtype = torch.float32
    elif case == "bf16-f32-bias":
        dtype, bias_dtype = torch.bfloat16, torch.float32
    elif case == "complex":
        dtype = bias_dtype = torch.complex128
        a, b, bias, alpha, epilog = (
            _t(M, K, dtype=dtype),
            _t(K, N, seed=1, dtype=dtype),
            _t(N, dtype=dtype),
            1 - 2j,
            "BIAS",
        )
    a, b, bias = (x.detach().to(dt).requires_grad_() for x, dt in ((a, dtype), (b, dtype), (bias, bias_dtype)))
    if c is not None:
        c = c.detach().to(dtype).requires_grad_()
    out_dtype = dtype
    w = (
        _t(M, N, seed=3, grad=False, dtype=out_dtype)
        if bias.dim() < 3 and a.dim() == 2
        else _t(3, M, N, seed=3, grad=False, dtype=out_dtype)
    )

    def loss(a, b, bias, c):
        out = nvdispatch.matmul(a, b, c, alpha=alpha, beta=beta, epilog=epilog, epilog_inputs={"bias": bias})
        return (out * w.conj()).real.sum()

    _run(loss, mode)(a, b, bias, c).backward()
    f64 = lambda x: None if x is None else _n(x.detach().to(torch.complex128 if dtype.is_complex else torch.float64))
    want = _np_forward_grads(epilog, f64(a), f64(b), f64(bias), f64(c), alpha, beta, np.conj(f64(w)), None)
    want = {k: np.conj(v) for k, v in want.items()}  # Torch's convention: the conjugate Wirtinger derivative
    tol = {torch.float64: 1e-10, torch.complex128: 1e-10, torch.float32: 2e-5, torch.bfloat16: 3e-2}[dtype]
    for name, tensor in (("a", a), ("b", b), ("bias", bias), ("c", c)):
        if tensor is not None:
            assert tensor.grad.dtype == tensor.dtype, name
            got = _n(tensor.grad.to(torch.complex128 if dtype.is_complex else torch.float64))
            scale = max(1.0, float(np.abs(want[name]).max()))
            np.testing.assert_allclose(got, want[name], rtol=tol, atol=tol * scale, err_msg=name)


# -- matmul, backward epilogs ----------------------------------------------------------------------------------------
def _gelu_second(x: np.ndarray) -> np.ndarray:
    h = 1e-5
    return (gelu_grad(x + h) - gelu_grad(x - h)) / (2 * h)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("epilog", ["DRELU", "DRELU_BGRAD", "DGELU", "DGELU_BGRAD", "BGRADA", "BGRADB"])
def test_backward_epilog_gradients(epilog, mode):
    a, b = _t(M, K), _t(K, N, seed=1)
    mask = _t(M, N, seed=2, grad=False) > 0
    pre = _t(M, N, seed=3)
    inputs = {"relu_aux": mask} if "DRELU" in epilog else ({"gelu_aux": pre} if "DGELU" in epilog else None)
    w = _t(M, N, seed=4, grad=False)

    def loss(a, b, pre):
        out = nvdispatch.matmul(a, b, alpha=1.5, epilog=epilog, epilog_inputs=(
            {"gelu_aux": pre} if "DGELU" in epilog else inputs))  # fmt: skip
        if isinstance(out, tuple):
            out, aux = out
            (value,) = aux.values()
            return (out * w).sum() + (value * vv).sum()
        return (out * w).sum()

    aux_shape = {"DRELU_BGRAD": (N,), "DGELU_BGRAD": (N,), "BGRADA": (M,), "BGRADB": (N,)}.get(epilog)
    vv = _t(*aux_shape, seed=5, grad=False) if aux_shape else None
    _run(loss, mode)(a, b, pre).backward()
    na, nb, z = _n(a), _n(b), 1.5 * _n(a) @ _n(b)
    gy = _n(w) + (_n(vv)[None, :] if epilog.endswith("_BGRAD") else 0)
    if "DRELU" in epilog:
        gt = gy * _n(mask)
    elif "DGELU" in epilog:
        gt = gy * gelu_grad(_n(pre))
        np.testing.assert_allclose(_n(pre.grad), gy * z * _gelu_second(_n(pre)), rtol=1e-6, atol=1e-6)
    else:
        gt = gy
    want_a, want_b = 1.5 * gt @ nb.T, 1.5 * na.T @ gt
    if epilog == "BGRADA":
        want_a = want_a + _n(vv)[:, None]
    if epilog == "BGRADB":
        want_b = want_b + _n(vv)[None, :]
    np.testing.assert_allclose(_n(a.grad), want_a, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(_n(b.grad), want_b, rtol=1e-10, atol=1e-10)


# -- transforms: derivatives of NumPy's transforms read off as real-linear maps ---------------------------------------
def _np_gradient(f, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Torch's gradient of ``L = Re(sum(conj(w) * f(x)))`` for a real-linear ``f``, from ``f`` on basis vectors."""
    flat = np.zeros(x.size, dtype=x.dtype)
    grad = np.zeros(x.size, dtype=x.dtype)
    for j in range(x.size):
        for unit in (1, 1j) if np.iscomplexobj(x) else (1,):
            flat[:] = 0
            flat[j] = unit
            d = np.real(np.sum(np.conj(w) * f(flat.reshape(x.shape))))
            grad[j] += d * unit
    return grad.reshape(x.shape)


TRANSFORMS = {
    "fft": ({"n": 7}, {"n": 7}),
    "ifft": ({"n": 4, "axis": 0, "norm": "ortho"}, {"n": 4, "axis": 0, "norm": "ortho"}),
    "rfft": ({"n": 10}, {"n": 10}),
    "irfft": ({"n": 9, "norm": "forward"}, {"n": 9, "norm": "forward"}),
    "hfft": ({"n": 8}, {"n": 8}),
    "ihfft": ({"n": 3, "norm": "ortho"}, {"n": 3, "norm": "ortho"}),
    "fftn": ({"s": (3, 8), "axes": (0, 1)}, {"s": (3, 8), "axes": (0, 1)}),
    "ifftn": ({}, {}),
    "rfftn": ({"s": (5, 6), "axes": (0, 1), "norm": "forward"}, {"s": (5, 6), "axes": (0, 1), "norm": "forward"}),
    "irfftn": ({"s": (4, 7), "axes": (0, 1)}, {"s": (4, 7), "axes": (0, 1)}),
    "fft2": ({"s": (5, 5)}, {"s": (5, 5)}),
    "ifft2": ({"norm": "ortho"}, {"norm": "ortho"}),
    "rfft2": ({}, {}),
    "irfft2": ({"s": (4, 6)}, {"s": (4, 6)}),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("func", list(TRANSFORMS))
def test_transform_gradients(func, mode):
    ours, theirs = TRANSFORMS[func]
    real = func in ("rfft", "ihfft", "rfftn", "rfft2")
    x = _t(4, 5, dtype=torch.float64 if real else torch.complex128)
    y = getattr(nvdispatch.fft, func)(x.detach(), **ours)
    w = _t(*y.shape, seed=1, dtype=y.dtype, grad=False)
    fn = _run(lambda x: (torch.conj(w) * getattr(nvdispatch.fft, func)(x, **ours)).real.sum(), mode)
    fn(x).backward()
    want = _np_gradient(lambda v: getattr(np.fft, func)(v, **theirs), _n(x), _n(w))
    assert x.grad.dtype == x.dtype
    np.testing.assert_allclose(_n(x.grad), want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", ["real", "real-complex-filter", "complex-padded", "axis0"])
def test_convolve_gradients(case, mode):
    n, axis = None, -1
    x, h = _t(3, 8), _t(5, seed=1)
    if case == "real-complex-filter":
        h = _t(3, 5, seed=1, dtype=torch.complex128)
    elif case == "complex-padded":
        x, h, n = _t(3, 8, dtype=torch.complex128), _t(10, seed=1, dtype=torch.complex128), 10
    elif case == "axis0":
        x, h, n, axis = _t(3, 8), _t(3, 1, seed=1), 4, 0
    y = nvdispatch.fft.convolve(x.detach(), h.detach(), n=n, axis=axis)
    w = _t(*y.shape, seed=2, dtype=y.dtype, grad=False)
    fn = _run(lambda x, h: (torch.conj(w) * nvdispatch.fft.convolve(x, h, n=n, axis=axis)).real.sum(), mode)
    fn(x, h).backward()
    length = n if n is not None else x.shape[axis]

    def conv(xv, hv):
        if np.iscomplexobj(xv):
            return np.fft.ifft(np.fft.fft(xv, length, axis) * hv, length, axis)
        return np.fft.irfft(np.fft.rfft(xv, length, axis) * hv, length, axis)

    nx, nh, nw = _n(x), _n(h), _n(w)
    np.testing.assert_allclose(_n(x.grad), _np_gradient(lambda v: conv(v, nh), nx, nw), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(_n(h.grad), _np_gradient(lambda v: conv(nx, v), nh, nw), rtol=1e-10, atol=1e-10)


def test_gelu_reference_is_the_tanh_form():
    assert math.isclose(gelu(np.array(1.0)), 0.8411919906082768, rel_tol=1e-12)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(("a_shape", "b_shape"), [((5, 0), (0, 6)), ((2, 5, 0), (0, 6)), ((0, 4), (4, 6)),
                                                  ((2, 0, 4), (4, 6)), ((0,), (0, 6))])  # fmt: skip
def test_zero_size_products_have_gradients(a_shape, b_shape, bias):
    # an empty inner (or outer) dimension: the gradients are the NumPy products of empty operands, zeros or empty
    a, b = _t(*a_shape), _t(*b_shape, seed=1)
    kwargs = {"epilog": "BIAS", "epilog_inputs": {"bias": _t(b_shape[-1], seed=2)}} if bias else {}
    w = _t(*np.matmul(np.empty(a_shape), np.empty(b_shape)).shape, seed=3, grad=False)
    (nvdispatch.matmul(a, b, **kwargs) * w).sum().backward()
    na, nb, nw = _n(a), _n(b), _n(w)
    pa = na[None] if na.ndim == 1 else na
    gw = nw[None] if na.ndim == 1 else nw
    np.testing.assert_array_equal(_n(a.grad), (gw @ nb.T).reshape(a_shape))
    np.testing.assert_array_equal(_n(b.grad), _sum_to(np.swapaxes(pa, -1, -2) @ gw, b_shape))
    if bias:
        np.testing.assert_allclose(_n(kwargs["epilog_inputs"]["bias"].grad), _sum_to(gw, (1, b_shape[-1]))[0])
