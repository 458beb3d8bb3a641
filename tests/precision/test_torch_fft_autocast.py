"""The FFTs follow ``torch.autocast`` regions as Torch's own FFTs do (issue 29): Torch's CPU autocast lists every
``torch.fft`` transform under its float32 policy (float16/bfloat16 input computed in float32, a complex64/float32
result), its CUDA autocast lists none. Every public transform and ``fft.convolve``, eagerly (on both fronts, and
recorded by autograd), through the ``nvdispatch::`` operators and compiled with ``fullgraph=True``; a region
entered or left between two calls; the stateful ``FFT`` planned on one side of a region and executed on the other;
``explain()``. Dtypes against Torch's own ops in the same region; values against the float64 NumPy oracle of the
cast input (float16/bfloat16 values are exact in float32, so the oracle is of the half-precision values)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import nvdispatch
from nvdispatch import errors, plan_cache
from nvdispatch._adapters import CPU, Device
from nvdispatch._adapters.torch import TorchAdapter
from nvdispatch._adapters.torch_autocast import ffts_follow_region
from nvdispatch._precision import PrecisionConvention, fft_autocast_target

torch = pytest.importorskip("torch")

from nvdispatch.integrations import torch_ops  # noqa: E402
from tests.precision.autocast_regions import autocast_region  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental:UserWarning")

FUNCS = ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft", "fftn", "ifftn", "rfftn", "irfftn", "fft2", "ifft2",
         "rfft2", "irfft2")  # fmt: skip
HALF = {"float16": torch.float16, "bfloat16": torch.bfloat16}
#: normwise tolerance of a float32 transform of 64 values
RTOL = 2e-5


def _x(dtype=torch.float16, shape=(4, 16), seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    if dtype in (torch.complex32, torch.complex64):
        x = torch.complex(x, torch.randn(*shape, generator=g, dtype=torch.float64))
    return x.to(dtype).to(device)


def _oracle(func, x) -> np.ndarray:
    """``numpy.fft.<func>`` in double precision of ``x``'s values (exact: a half-precision value is one in
    float32, the dtype the region computes in)."""
    wide = torch.complex128 if x.is_complex() else torch.float64
    return getattr(np.fft, func)(x.detach().cpu().to(wide).numpy())


def _assert_close(got, want, rtol=RTOL, what=""):
    got = got.detach().cpu().resolve_conj()
    got = got.to(torch.complex128 if got.is_complex() else torch.float64).numpy()
    scale = max(float(np.abs(want).max()), 1.0)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale, err_msg=what)


# -- the rule --------------------------------------------------------------------------------------------------
def test_torchs_own_autocast_lists_its_ffts_on_the_cpu_and_not_on_cuda():
    # what nvdispatch reads of Torch (its dispatcher's autocast kernels), as Torch 2.13's autocast_mode lists them
    assert ffts_follow_region("cpu") is True
    assert ffts_follow_region("cuda") is False
    C = torch._C
    assert C._dispatch_has_kernel_for_dispatch_key("aten::fft_rfft", "AutocastCPU")
    assert not C._dispatch_has_kernel_for_dispatch_key("aten::fft_rfft", "AutocastCUDA")


@pytest.mark.parametrize(("dtype", "target"), [("float16", "float32"), ("bfloat16", "float32"), ("float32", None),
                                               ("float64", None), ("complex32", None), ("complex64", None)])  # fmt: skip
def test_the_fft_rule_widens_half_precision_real_input_only_where_the_ffts_follow_the_region(dtype, target):
    follows = PrecisionConvention(autocast="bfloat16", autocast_reason="r", fft_autocast=True)
    assert fft_autocast_target(follows, dtype) == target
    assert fft_autocast_target(PrecisionConvention(autocast="bfloat16"), dtype) is None  # ffts ignore it there
    assert fft_autocast_target(PrecisionConvention(fft_autocast=True), dtype) is None  # no region
    assert fft_autocast_target(None, dtype) is None


def test_the_torch_convention_says_whether_the_ffts_follow_the_region_per_device_type():
    adapter = TorchAdapter()
    assert adapter.precision_convention(CPU).fft_autocast is False
    with torch.autocast("cpu", dtype=torch.bfloat16):
        conv = adapter.precision_convention(CPU)
        assert conv.fft_autocast is True and conv.autocast_reason == "Torch autocast('cpu', bfloat16)"
        assert adapter.precision_convention(Device("cuda", 0)).fft_autocast is False  # no CUDA region
    with autocast_region("cuda", torch.float16):
        conv = adapter.precision_convention(Device("cuda", 0))
        assert conv.autocast == "float16" and conv.fft_autocast is False  # Torch's CUDA FFTs ignore regions
        assert adapter.precision_convention(CPU).fft_autocast is False


# -- eager: dtypes as Torch's own FFTs in the region, values as the oracle -------------------------------------
@pytest.mark.parametrize("region", ["bfloat16", "float16"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("func", FUNCS)
def test_eager_transforms_in_a_cpu_region_have_torchs_dtype_and_the_cast_inputs_values(fft_front, func, dtype, region):
    x = _x(HALF[dtype])
    with torch.autocast("cpu", dtype=HALF[region]):
        got = getattr(nvdispatch.fft, func)(x)
        again = getattr(nvdispatch.fft, func)(x)  # a repeated call: no cache may serve it another dtype
        own = getattr(torch.fft, func)(x)
    assert got.dtype == again.dtype == own.dtype
    assert own.dtype in (torch.complex64, torch.float32)
    assert got.shape == own.shape
    _assert_close(got, _oracle(func, x))
    _assert_close(again, _oracle(func, x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64, torch.complex32])
@pytest.mark.parametrize("func", ["fft", "ifftn", "irfft"])
def test_dtypes_the_region_does_not_cast_are_transformed_as_outside_it(func, dtype):
    x = _x(dtype)
    outside = getattr(nvdispatch.fft, func)(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = getattr(nvdispatch.fft, func)(x)
    assert inside.dtype == outside.dtype
    if dtype != torch.complex32:  # (Torch's CPU FFTs refuse complex32, in a region or not)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert inside.dtype == getattr(torch.fft, func)(x).dtype
    torch.testing.assert_close(inside, outside)


def test_a_region_toggled_between_two_calls_changes_the_result_dtype(fft_front):
    x = _x(torch.float16)
    want = _oracle("rfft", x)
    dtypes = []
    for inside in (False, True, False, True, True, False):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=inside):
            y = nvdispatch.fft.rfft(x)
        dtypes.append(y.dtype)
        _assert_close(y, want, rtol=RTOL if inside else 4e-3)
    c32, c64 = torch.complex32, torch.complex64
    assert dtypes == [c32, c64, c32, c64, c64, c32]


def test_a_region_on_another_device_type_leaves_the_transform_alone():
    x = _x(torch.float16)
    with autocast_region("cuda", torch.bfloat16):  # a CUDA region says nothing of CPU tensors
        assert nvdispatch.fft.fft(x).dtype == torch.complex32
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
        assert nvdispatch.fft.fft(x).dtype == torch.complex32
    with pytest.raises(errors.UnsupportedDtypeError, match="autocast"):  # outside a CPU region: refused, saying so
        nvdispatch.fft.fft(x.to(torch.bfloat16))


def test_a_device_type_autocast_does_not_know_has_no_region():
    x = torch.empty(4, 8, dtype=torch.float16, device="meta")
    assert TorchAdapter().autocast_region(x) is None
    outside = nvdispatch.fft.rfft(x)  # the operator's meta kernel, as torch.fft's on meta tensors
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = nvdispatch.fft.rfft(x)
        assert inside.dtype == outside.dtype == torch.fft.rfft(x).dtype  # the CPU region is not the meta device's
    assert inside.is_meta and inside.shape == outside.shape == (4, 5)


def test_the_region_runs_the_float32_calls_plan_and_keeps_no_plan_of_its_own(fft_front):
    plan_cache.clear()
    x = _x(torch.bfloat16)
    nvdispatch.fft.rfft(x.float())  # the float32 call's plan
    before = plan_cache.misses
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for _ in range(3):
            assert nvdispatch.fft.rfft(x).dtype == torch.complex64
    assert plan_cache.misses == before  # the cast operand found the float32 call's plan: nothing keyed by region
    with pytest.raises(errors.UnsupportedDtypeError):  # and no cache serves the call outside the region
        nvdispatch.fft.rfft(x)


def test_recorded_calls_in_a_region_give_torchs_gradient_to_the_half_precision_leaf():
    x = _x(torch.float16).requires_grad_()
    mine = x.detach().clone().requires_grad_()
    weight = torch.randn(4, 9, generator=torch.Generator().manual_seed(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = nvdispatch.fft.rfft(mine)
        own = torch.fft.rfft(x)
    assert got.dtype == own.dtype == torch.complex64
    (got.real * weight).sum().backward()
    (own.real * weight).sum().backward()
    assert mine.grad.dtype == x.grad.dtype == torch.float16  # the cast back to the leaf's dtype, recorded
    torch.testing.assert_close(mine.grad, x.grad)


# -- the operators, compiled -----------------------------------------------------------------------------------
@pytest.mark.parametrize("region", ["bfloat16", "float16"])
@pytest.mark.parametrize("func", FUNCS)
def test_compiled_transforms_in_a_cpu_region_have_torchs_dtype_and_the_cast_inputs_values(func, region):
    torch._dynamo.reset()
    x = _x(HALF[region])  # the region's own dtype: the input a model in that region hands over

    def f(t):
        return getattr(nvdispatch.fft, func)(t)

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    with torch.autocast("cpu", dtype=HALF[region]):
        got = compiled(x)
        own = getattr(torch.fft, func)(x)
    assert got.dtype == own.dtype
    _assert_close(got, _oracle(func, x))


def test_a_compiled_function_follows_a_region_toggled_between_its_calls():
    torch._dynamo.reset()
    x = _x(torch.float16)
    compiled = torch.compile(lambda t: nvdispatch.fft.irfft(t) * 2, backend="aot_eager", fullgraph=True)
    dtypes = []
    for inside in (False, True, False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=inside):
            y = compiled(x)
        dtypes.append(y.dtype)
        _assert_close(y, 2 * _oracle("irfft", x), rtol=RTOL if inside else 4e-3)
    assert dtypes == [torch.float16, torch.float32, torch.float16, torch.float32]


@pytest.mark.skipif(not (shutil.which("c++") or shutil.which("g++")), reason="Inductor needs a C++ compiler")
def test_the_default_backend_compiles_the_regions_cast():
    torch._dynamo.reset()
    x = _x(torch.bfloat16)
    compiled = torch.compile(lambda t: nvdispatch.fft.rfft(t) * 2, fullgraph=True)  # Inductor
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = compiled(x)
        own = torch.fft.rfft(x) * 2
    assert got.dtype == own.dtype == torch.complex64
    _assert_close(got, 2 * _oracle("rfft", x))


def test_a_compiled_region_inside_the_function_casts_as_torchs_own_fft():
    torch._dynamo.reset()
    x = _x(torch.bfloat16)

    def f(t):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return nvdispatch.fft.fft2(t), torch.fft.fft2(t)

    got, own = torch.compile(f, backend="aot_eager", fullgraph=True)(x)
    assert got.dtype == own.dtype == torch.complex64
    _assert_close(got, _oracle("fft2", x))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_fft_operator_casts_in_its_autocast_kernel(dtype):
    x = _x(dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch_ops.fft_op(x, "hfft", None, -1, None, None, "ortho")
        c = torch_ops.convolve_op(x, torch.ones(9, dtype=dtype), None, -1)
    assert y.dtype == c.dtype == torch.float32
    _assert_close(y, np.fft.hfft(x.double().numpy(), norm="ortho"))
    _assert_close(c, x.double().numpy())  # a filter spectrum of ones: the signal itself


def test_the_operator_computes_in_the_regions_precision_eagerly_and_compiled():
    # eager operator, compiled operator (the autocast kernel runs where AOT tracing sees it) and public function agree
    torch._dynamo.reset()
    x = _x(torch.float16)
    args = ("rfftn", None, -1, None, [0, 1], "forward")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager = torch_ops.fft_op(x, *args)
        compiled = torch.compile(lambda t: torch_ops.fft_op(t, *args), backend="aot_eager", fullgraph=True)(x)
        public = nvdispatch.fft.rfftn(x, axes=(0, 1), norm="forward")
    assert eager.dtype == compiled.dtype == public.dtype == torch.complex64
    torch.testing.assert_close(eager, compiled)
    torch.testing.assert_close(eager, public)


# -- fft.convolve: the composition of Torch's own ops in the region --------------------------------------------
@pytest.mark.parametrize("h_dtype", [torch.float32, torch.complex64, torch.float16, torch.complex32])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_convolve_in_a_region_follows_the_composition_of_torchs_own_ffts(dtype, h_dtype):
    x = _x(dtype, shape=(3, 16))
    h = _x(h_dtype, shape=(9,), seed=1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = nvdispatch.fft.convolve(x, h)
        own = torch.fft.irfft(torch.fft.rfft(x) * h, n=16)
        e = nvdispatch.explain(nvdispatch.fft.convolve, x, h)
    assert got.dtype == own.dtype == torch.float32
    wide = torch.complex128 if h.is_complex() else torch.float64
    want = np.fft.irfft(np.fft.rfft(x.double().numpy()) * h.to(wide).numpy(), n=16)
    _assert_close(got, want)
    assert e.precision.startswith("Torch autocast('cpu', bfloat16): x (")


def test_convolve_in_a_region_eagerly_and_compiled_agree():
    torch._dynamo.reset()
    x, h = _x(torch.float16, shape=(2, 8)), _x(torch.complex64, shape=(5,), seed=2)
    with torch.autocast("cpu", dtype=torch.float16):
        eager = nvdispatch.fft.convolve(x, h)
        compiled = torch.compile(lambda a, b: nvdispatch.fft.convolve(a, b), backend="aot_eager", fullgraph=True)(x, h)
    assert eager.dtype == compiled.dtype == torch.float32
    torch.testing.assert_close(eager, compiled)
    with pytest.raises(errors.UnsupportedDtypeError):  # half-precision signals are refused outside a region
        nvdispatch.fft.convolve(x, h)


# -- the stateful FFT: its precision is its operand's, which no region changes ----------------------------------
@pytest.mark.parametrize("planned_inside", [False, True])
def test_an_fft_planned_on_one_side_of_a_region_executes_the_same_on_the_other(planned_inside):
    x = _x(torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=planned_inside):
        f = nvdispatch.fft.FFT(x, axes=(1,)).plan()
    with f, torch.autocast("cpu", dtype=torch.bfloat16, enabled=not planned_inside):
        got = f.execute()
        own = torch.fft.rfft(x, dim=1)
    assert got.dtype == own.dtype == torch.complex64
    _assert_close(got, _oracle("rfft", x))


def test_the_stateful_fft_refuses_half_precision_operands_inside_a_region_too():
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(errors.UnsupportedDtypeError, match="autocast"):
        nvdispatch.fft.FFT(_x(torch.bfloat16))


# -- explain() -------------------------------------------------------------------------------------------------
def test_explain_names_the_region_it_follows():
    x = _x(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        e = nvdispatch.explain(nvdispatch.fft.irfft2, x)
    assert e.precision == (
        "Torch autocast('cpu', bfloat16): bfloat16 input cast to float32 first, as torch's own FFTs in the region "
        "(complex64 transform, float32 result)"
    )
    assert "precision: Torch autocast('cpu', bfloat16)" in str(e)
    outside = nvdispatch.explain(nvdispatch.fft.irfft2, x.to(torch.float16))
    assert outside.precision.startswith("torch's rule for float16 input")


# -- CUDA (-m gpu): Torch's CUDA autocast lists no FFT, so a region changes nothing --------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("region", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("func", FUNCS)
def test_cuda_transforms_in_a_cuda_region_have_torchs_dtype(func, region):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    torch._dynamo.reset()  # one lambda compiled per case: Dynamo's recompile limit counts them all otherwise
    # power-of-two lengths (Torch's CUDA half-precision domain; a c2r transform's last length is 2 * (m - 1))
    shape = (4, 9) if func in ("irfft", "hfft", "irfftn", "irfft2") else (4, 16)
    for dtype in (torch.float16, torch.float32):
        x = _x(dtype, shape=shape, device="cuda")
        with torch.autocast("cuda", dtype=region):
            got = getattr(nvdispatch.fft, func)(x)
            own = getattr(torch.fft, func)(x)
            compiled = torch.compile(lambda t: getattr(nvdispatch.fft, func)(t), backend="aot_eager",
                                     fullgraph=True)(x)  # fmt: skip
        assert got.dtype == own.dtype == compiled.dtype, (dtype, got.dtype, own.dtype, compiled.dtype)
        rtol = RTOL if dtype == torch.float32 else 4e-3
        _assert_close(got, _oracle(func, x), rtol=rtol)
        _assert_close(compiled, _oracle(func, x), rtol=rtol)
    x = _x(torch.bfloat16, shape=shape, device="cuda")
    with torch.autocast("cuda", dtype=region):
        with pytest.raises(RuntimeError):  # Torch's CUDA FFTs refuse bfloat16 in a region too
            getattr(torch.fft, func)(x)
        with pytest.raises(errors.UnsupportedDtypeError):
            getattr(nvdispatch.fft, func)(x)
