"""Torch's half-precision FFT convention (``torch.fft`` on CUDA: float16 and complex32 computed in float32, the
result complex32, or float16 for real results), on the CPU (where Torch's own CPU build refuses half) and on CUDA
(``-m gpu``): every public transform eagerly, through the ``nvdispatch::fft`` operator (``opcheck``: fake kernel
against the real one, autograd registration, AOT dispatch), compiled with ``fullgraph=True``, and its gradient.
Values against the NumPy complex128 oracle of the half-precision input's exact values (gradients against Torch's
own float64 transforms), with half-precision tolerance; bfloat16, which Torch does not transform, a typed error."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import nvdispatch
from nvdispatch import errors

torch = pytest.importorskip("torch")

from nvdispatch.integrations import torch_ops  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental:UserWarning")

ONE_D = ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft")
N_D = ("fftn", "ifftn", "rfftn", "irfftn", "fft2", "ifft2", "rfft2", "irfft2")
FUNCS = ONE_D + N_D
REAL_INPUT_ONLY = ("rfft", "ihfft", "rfftn", "rfft2")
REAL_RESULT = ("irfft", "hfft", "irfftn", "irfft2")
#: normwise tolerance of a half-precision result computed in float32: a few float16 roundings of the largest value
RTOL = 4e-3
SHAPE = (4, 16)
ODD_SHAPE = (3, 10)


def _pow2(func: str) -> tuple[int, int]:
    """An input whose transform lengths are powers of two (Torch's CUDA half-precision domain; a c2r transform's
    last length is ``2 * (m - 1)``)."""
    return (4, 9) if func in REAL_RESULT else SHAPE


def _half(shape, dtype=torch.float16, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    if dtype == torch.complex32:
        x = torch.complex(x, torch.randn(*shape, generator=g, dtype=torch.float64))
    return x.to(dtype).to(device)


def _exact(x) -> np.ndarray:
    """The half-precision tensor's values, exactly, in double precision (the oracle's input)."""
    wide = torch.complex128 if x.is_complex() else torch.float64
    return x.detach().cpu().to(wide).numpy()


def _values(y) -> np.ndarray:
    return y.detach().cpu().to(torch.complex128 if y.is_complex() else torch.float64).resolve_conj().numpy()


def _result_dtype(func: str):
    return torch.float16 if func in REAL_RESULT else torch.complex32


def _assert_close(got, want, what=""):
    scale = max(float(np.abs(want).max()), 1.0)
    np.testing.assert_allclose(_values(got), want, rtol=RTOL, atol=RTOL * scale, err_msg=what)


def _cases():
    out = []
    for func in FUNCS:
        for dtype in (torch.float16, torch.complex32):
            if dtype == torch.complex32 and func in REAL_INPUT_ONLY:
                continue
            out.append(pytest.param(func, dtype, id=f"{func}-{str(dtype)[6:]}"))
    return out


def _operator_args(func, x, norm="backward"):
    if func in ONE_D:
        return (x, func, None, -1, None, None, norm)
    axes = [-2, -1] if func.endswith("2") else None
    return (x, func[:-1] + "n" if func.endswith("2") else func, None, -1, None, axes, norm)


# -- eager ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("lengths", ["pow2", "any"])
@pytest.mark.parametrize("norm", ["backward", "ortho"])
@pytest.mark.parametrize(("func", "dtype"), _cases())
def test_half_input_gives_torchs_half_result_dtype_and_the_oracles_values(func, dtype, norm, lengths):
    x = _half(_pow2(func) if lengths == "pow2" else ODD_SHAPE, dtype)
    before = x.clone()
    y = getattr(nvdispatch.fft, func)(x, norm=norm)
    assert isinstance(y, torch.Tensor) and y.dtype == _result_dtype(func)
    want = getattr(np.fft, func)(_exact(x), norm=norm)
    assert tuple(y.shape) == want.shape
    _assert_close(y, want, func)
    assert torch.equal(x.view(torch.int16 if dtype == torch.float16 else torch.int32),
                       before.view(torch.int16 if dtype == torch.float16 else torch.int32))  # fmt: skip


@pytest.mark.parametrize("func", ["fft", "rfft", "irfft", "fftn", "irfftn"])
def test_half_input_with_n_or_s_pads_and_trims_as_for_float32(func):
    x = _half((4, 12))
    kw = {"n": 8} if func in ONE_D else {"s": (8, 16), "axes": (0, 1)}
    y = getattr(nvdispatch.fft, func)(x, **kw)
    assert y.dtype == _result_dtype(func)
    _assert_close(y, getattr(np.fft, func)(_exact(x), **kw), func)


def test_out_takes_the_half_precision_result():
    x = _half(SHAPE)
    out = torch.empty(4, 9, dtype=torch.complex32)
    assert nvdispatch.fft.rfft(x, out=out) is out
    _assert_close(out, np.fft.rfft(_exact(x)))
    with pytest.raises(errors.UnsupportedDtypeError, match="out"):
        nvdispatch.fft.rfft(x, out=torch.empty(4, 9, dtype=torch.float16))


def test_bfloat16_is_refused_naming_the_argument():
    x = _half(SHAPE).to(torch.bfloat16)
    for func in ("fft", "rfft", "irfft", "fftn"):
        with pytest.raises(errors.UnsupportedDtypeError, match=r"x: .*torch\.fft transforms.*bfloat16"):
            getattr(nvdispatch.fft, func)(x)
        with pytest.raises(errors.UnsupportedDtypeError, match="bfloat16"):
            torch_ops.fft_op(*_operator_args(func, x))


def test_complex32_to_a_real_input_transform_is_refused_as_complex64_is():
    with pytest.raises(errors.UnsupportedDtypeError, match="x: .*real floating.*complex32"):
        nvdispatch.fft.rfft(_half(SHAPE, torch.complex32))


def test_explain_says_the_transform_computes_in_float32_and_casts_to_half():
    e = nvdispatch.explain(nvdispatch.fft.rfft, _half(SHAPE))
    assert "computed in float32" in e.precision and "complex32" in e.precision, e.precision
    assert e.problem.dtype == "float32" and e.problem.compute_dtype == "complex64"
    e = nvdispatch.explain(nvdispatch.fft.irfft, _half(SHAPE, torch.complex32))
    assert "computed in float32" in e.precision and "float16" in e.precision, e.precision


def test_other_frameworks_keep_their_own_half_precision_rules():
    x = np.random.default_rng(0).standard_normal(16).astype(np.float16)
    assert nvdispatch.fft.fft(x).dtype == np.complex64  # numpy.fft's rule
    assert nvdispatch.fft.irfft(x.astype(np.complex64)).dtype == np.float32
    assert nvdispatch.fft.irfft(x).dtype == np.float16


# -- the operator: opcheck, compile, autograd --------------------------------------------------------------------------
@pytest.mark.parametrize(("func", "dtype"), _cases())
def test_operator_passes_opcheck_and_gives_the_public_functions_result(func, dtype):
    x = _half(SHAPE, dtype)
    args = _operator_args(func, x, "ortho")
    torch.library.opcheck(torch_ops.fft_op, args)
    y = torch_ops.fft_op(*args)
    assert y.dtype == _result_dtype(func) and y.is_contiguous()
    _assert_close(y, getattr(np.fft, func)(_exact(x), norm="ortho"), func)


def test_half_transforms_compile_into_one_graph_without_breaks():
    x, z = _half(SHAPE), _half(SHAPE, torch.complex32, seed=1)
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def every(x, z):
        return {f: getattr(nvdispatch.fft, f)(x) for f in FUNCS} | {
            f"{f}-c": getattr(nvdispatch.fft, f)(z) for f in FUNCS if f not in REAL_INPUT_ONLY
        }

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        out = torch.compile(every, backend=keep, fullgraph=True)(x, z)
    assert len(graphs) == 1
    targets = [str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    assert targets.count("nvdispatch.fft.default") == len(out)
    for key, y in out.items():
        func, src = (key[:-2], z) if key.endswith("-c") else (key, x)
        assert y.dtype == _result_dtype(func), key
        _assert_close(y, getattr(np.fft, func)(_exact(src)), key)


def _loss(y, seed=5):
    g = torch.Generator().manual_seed(seed)
    wide = torch.view_as_real(y.to(torch.complex128).resolve_conj()) if y.is_complex() else y.to(torch.float64)
    return (wide * torch.randn(wide.shape, generator=g, dtype=torch.float64).to(wide.device)).sum()


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize(("func", "dtype"), _cases())
def test_gradient_has_the_inputs_half_dtype_and_float64_values(func, dtype, compiled):
    x = _half(SHAPE, dtype).requires_grad_()
    fn = lambda t: getattr(nvdispatch.fft, func)(t, norm="ortho")  # noqa: E731
    if compiled:
        fn = torch.compile(fn, backend="aot_eager", fullgraph=True)
    _loss(fn(x)).backward()
    assert x.grad.dtype == dtype  # Torch's gradient of a half transform (its CUDA autograd) has the input's dtype
    # the oracle: Torch's own transform of the exact values, in double precision
    wide = x.detach().to(torch.complex128 if x.is_complex() else torch.float64).requires_grad_()
    _loss(getattr(torch.fft, func)(wide, norm="ortho")).backward()
    _assert_close(x.grad, _values(wide.grad), func)


# -- CUDA (torch.fft's own half precision there) -------------------------------------------------------------------
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch with CUDA")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("lengths", ["pow2", "any"])
@pytest.mark.parametrize(("func", "dtype"), _cases())
def test_cuda_half_input_gives_torchs_dtype_and_the_oracles_values(func, dtype, lengths):
    x = _half(_pow2(func) if lengths == "pow2" else ODD_SHAPE, dtype, device="cuda")
    y = getattr(nvdispatch.fft, func)(x, norm="ortho")
    assert y.device == x.device and y.dtype == _result_dtype(func)
    _assert_close(y, getattr(np.fft, func)(_exact(x), norm="ortho"), func)
    if lengths == "pow2":  # Torch's own CUDA half transform (powers of two only): same dtype and shape, close values
        want = getattr(torch.fft, func)(x, norm="ortho")
        assert want.dtype == y.dtype and want.shape == y.shape
        _assert_close(y, _values(want), f"{func} against torch.fft")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize(("func", "dtype"), _cases())
def test_cuda_operator_opcheck_compile_and_gradient_dtype_match_torchs(func, dtype):
    x = _half(_pow2(func), dtype, device="cuda")
    torch.library.opcheck(torch_ops.fft_op, _operator_args(func, x, "ortho"))
    fn = torch.compile(lambda t: getattr(nvdispatch.fft, func)(t, norm="ortho"), backend="aot_eager", fullgraph=True)
    xg = x.clone().requires_grad_()
    y = fn(xg)
    _assert_close(y, getattr(np.fft, func)(_exact(x), norm="ortho"), func)
    _loss(y).backward()
    ref = x.clone().requires_grad_()
    _loss(getattr(torch.fft, func)(ref, norm="ortho")).backward()  # Torch's own CUDA half autograd
    assert xg.grad.dtype == ref.grad.dtype == dtype
    wide = x.to(torch.complex128 if x.is_complex() else torch.float64).requires_grad_()
    _loss(getattr(torch.fft, func)(wide, norm="ortho")).backward()
    _assert_close(xg.grad, _values(wide.grad), func)
