"""A transform given ``out=`` inside a ``torch.autocast`` region is not autocast, as Torch's own ops with ``out=``
are not: Torch's autocast op reference says "calls that explicitly supply an out=... Tensor are allowed in
autocast-enabled regions, but won't go through autocasting" (its autocast kernels are registered for the functional
overloads only). So ``torch.matmul(a, b, out=c)`` in a bfloat16 CPU region computes in float32 (and refuses a
bfloat16 ``out``), and ``torch.fft.fft(x, out=y)`` of float16/bfloat16 input there is refused (Torch's CPU FFTs
transform no half precision outside a region). nvdispatch's public functions taking ``out=`` are the 14 transforms
(``matmul`` and ``fft.convolve`` take none): given ``out=`` in a region they compute as they do outside it (float16
by Torch's half-precision FFT rule, its complex32/float16 result written into ``out``; bfloat16 refused with a typed
error naming ``x``), eagerly on both fronts and compiled with ``fullgraph=True``; ``explain()`` says the region was
not applied because of ``out=``. Values against the float64 NumPy oracle; inputs never modified."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
from nvdispatch import errors, plan_cache

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental:UserWarning")

FUNCS = ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft", "fftn", "ifftn", "rfftn", "irfftn", "fft2", "ifft2",
         "rfft2", "irfft2")  # fmt: skip
REGIONS = {"bfloat16": torch.bfloat16, "float16": torch.float16}
#: normwise tolerances: a float32 transform of 64 values, and a result rounded to half precision
RTOL_FLOAT32, RTOL_HALF = 2e-5, 4e-3


def _x(dtype=torch.float16, shape=(4, 16), seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def _oracle(func, x) -> np.ndarray:
    """``numpy.fft.<func>`` in double precision of ``x``'s values."""
    return getattr(np.fft, func)(x.detach().to(torch.complex128 if x.is_complex() else torch.float64).numpy())


def _assert_close(got, want, rtol):
    got = got.detach().resolve_conj()
    got = got.to(torch.complex128 if got.is_complex() else torch.float64).numpy()
    scale = max(float(np.abs(want).max()), 1.0)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale)


def _half_result(func):
    """The dtype a float16 transform gives outside a region (Torch's half-precision rule)."""
    return torch.float16 if func in ("irfft", "hfft", "irfftn", "irfft2") else torch.complex32


# -- Torch's own rule, as the installed Torch applies it (what nvdispatch follows) ----------------------------------
def test_torchs_own_ops_given_out_are_not_autocast_in_a_cpu_region():
    a, b = _x(torch.float32, (4, 5)), _x(torch.float32, (5, 3), seed=1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.matmul(a, b).dtype == torch.bfloat16  # the functional op is autocast
        c = torch.empty(4, 3)
        assert torch.matmul(a, b, out=c) is c  # the out= op is not: it computes in float32
        with pytest.raises(RuntimeError, match="dtype"):  # and wants out in the operands' dtype
            torch.matmul(a, b, out=torch.empty(4, 3, dtype=torch.bfloat16))
        x = _x(torch.float16, (8,))
        assert torch.fft.fft(x).dtype == torch.complex64  # autocast: computed in float32
        with pytest.raises(RuntimeError, match="Half"):  # not autocast: Torch's CPU FFT has no half precision
            torch.fft.fft(x, out=torch.empty(8, dtype=torch.complex64))
    np.testing.assert_allclose(c.double().numpy(), a.double().numpy() @ b.double().numpy(), rtol=1e-5, atol=1e-5)


# -- eager: as outside the region -----------------------------------------------------------------------------------
@pytest.mark.parametrize("region", ["bfloat16", "float16"])
@pytest.mark.parametrize("func", FUNCS)
def test_a_half_precision_transform_given_out_in_a_region_computes_as_outside_it(fft_front, func, region):
    x = _x(torch.float16)
    before = x.clone()
    outside = getattr(nvdispatch.fft, func)(x)
    assert outside.dtype == _half_result(func)
    out = torch.empty_like(outside)
    wide = torch.empty(outside.shape, dtype=torch.complex64 if outside.is_complex() else torch.float32)
    with torch.autocast("cpu", dtype=REGIONS[region]):
        inside = getattr(nvdispatch.fft, func)(x)  # the region's call, for contrast
        got = getattr(nvdispatch.fft, func)(x, out=out)
        got_wide = getattr(nvdispatch.fft, func)(x, out=wide)
    assert got is out and got_wide is wide
    assert inside.dtype == (torch.complex64 if outside.is_complex() else torch.float32)
    torch.testing.assert_close(out, outside, rtol=0, atol=0)  # the call outside the region, exactly
    torch.testing.assert_close(wide, outside.to(wide.dtype), rtol=0, atol=0)  # its rounding, not the region's
    _assert_close(out, _oracle(func, x), RTOL_HALF)
    _assert_close(inside, _oracle(func, x), RTOL_FLOAT32)
    assert torch.equal(x, before)


@pytest.mark.parametrize("func", ["fft", "irfft", "rfftn"])
def test_a_float32_transform_given_out_in_a_region_matches_torchs_own_out_call(fft_front, func):
    x = _x(torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        own = getattr(torch.fft, func)(x)
        out, own_out = torch.empty_like(own), torch.empty_like(own)
        getattr(torch.fft, func)(x, out=own_out)
        got = getattr(nvdispatch.fft, func)(x, out=out)
    assert got is out and out.dtype == own_out.dtype
    _assert_close(out, _oracle(func, x), RTOL_FLOAT32)


def test_bfloat16_given_out_in_a_region_is_refused_naming_x_and_out(fft_front):
    x = _x(torch.bfloat16)
    out = torch.empty(4, 9, dtype=torch.complex64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert nvdispatch.fft.rfft(x).dtype == torch.complex64  # the region's call takes it
        with pytest.raises(RuntimeError):  # as Torch's own out= call refuses it
            torch.fft.rfft(x, out=torch.empty(4, 9, dtype=torch.complex64))
        with pytest.raises(errors.UnsupportedDtypeError, match="out=") as info:
            nvdispatch.fft.rfft(x, out=out)
    assert info.value.argument == "x" and info.value.got == "bfloat16"
    assert "Torch autocast('cpu', bfloat16)" in str(info.value)


def test_a_callback_call_given_out_in_a_region_is_refused_as_outside_it():
    # prolog/epilog calls promote no half-precision input, in a region or not: the error says nothing of out=
    x = _x(torch.float16)
    out = torch.empty(4, 16, dtype=torch.complex64)
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(errors.UnsupportedDtypeError) as info:
        nvdispatch.fft.fft(x, out=out, epilog=lambda v, i: 2 * v)
    assert info.value.argument == "x" and "out=" not in str(info.value)
    y = _x(torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert nvdispatch.fft.fft(y, out=out, epilog=lambda v, i: 2 * v) is out
    _assert_close(out, 2 * _oracle("fft", y), RTOL_FLOAT32)


def test_the_region_is_back_after_an_out_call_and_after_its_error(fft_front):
    x = _x(torch.float16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        nvdispatch.fft.fft(x, out=torch.empty(4, 16, dtype=torch.complex64))
        assert torch.is_autocast_enabled("cpu")
        with pytest.raises(errors.UnsupportedDtypeError):
            nvdispatch.fft.fft(x.to(torch.bfloat16), out=torch.empty(4, 16, dtype=torch.complex64))
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert nvdispatch.fft.fft(x).dtype == torch.complex64


def test_a_region_on_another_device_type_leaves_an_out_call_as_it_is(fft_front):
    x = _x(torch.float16)
    out = torch.empty(4, 16, dtype=torch.complex32)
    saved = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)  # the thread's CUDA region, also where no GPU is
    try:
        assert nvdispatch.fft.fft(x, out=out) is out
    finally:
        torch.set_autocast_enabled("cuda", saved[0])
    torch.testing.assert_close(out, nvdispatch.fft.fft(x), rtol=0, atol=0)


def test_a_recorded_call_given_out_in_a_region_is_not_autocast_either():
    # an input that requires grad takes the operators (autograd records the call): their autocast kernel stays off
    x = _x(torch.float16).requires_grad_()
    out = torch.empty(4, 9, dtype=torch.complex64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert nvdispatch.fft.rfft(x, out=out) is out
        inside = nvdispatch.fft.rfft(x)
    assert inside.dtype == torch.complex64 and inside.grad_fn is not None
    plain = nvdispatch.fft.rfft(x.detach())
    assert plain.dtype == torch.complex32
    torch.testing.assert_close(out.detach(), plain.to(torch.complex64), rtol=0, atol=0)
    _assert_close(out, _oracle("rfft", x), RTOL_HALF)


# -- the caches: the region's call and the out= call never serve each other -----------------------------------------
@pytest.mark.parametrize("first", ["region", "out"])
def test_no_cache_serves_the_regions_call_to_an_out_call_or_back(fft_front, first):
    plan_cache.clear()
    x = _x(torch.float16)
    want = _oracle("rfft", x)
    order = ["region", "out", "region", "out", "out", "region"] if first == "region" else \
        ["out", "region", "out", "region", "region", "out"]  # fmt: skip
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for kind in order:
            if kind == "region":
                y = nvdispatch.fft.rfft(x)
                assert y.dtype == torch.complex64
                _assert_close(y, want, RTOL_FLOAT32)
            else:
                out = torch.empty(4, 9, dtype=torch.complex64)
                assert nvdispatch.fft.rfft(x, out=out) is out
                torch.testing.assert_close(out, nvdispatch.fft.rfft(x.float()).to(torch.complex32).to(torch.complex64),
                                           rtol=0, atol=0)  # fmt: skip
                _assert_close(out, want, RTOL_HALF)
    assert nvdispatch.fft.rfft(x).dtype == torch.complex32  # and the call outside the region is its own


# -- compiled with fullgraph=True ------------------------------------------------------------------------------------
@pytest.mark.parametrize("func", ["fft", "irfft", "rfft2", "ihfft"])
def test_a_compiled_transform_given_out_in_a_region_computes_as_outside_it(func):
    torch._dynamo.reset()
    x = _x(torch.float16)
    outside = getattr(nvdispatch.fft, func)(x)

    def f(t, o):  # the region's call and the out= call, side by side in one graph
        return getattr(nvdispatch.fft, func)(t), getattr(nvdispatch.fft, func)(t, out=o)

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    out = torch.empty(outside.shape, dtype=torch.complex64 if outside.is_complex() else torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside, got = compiled(x, out)
        assert torch.is_autocast_enabled("cpu")
    assert inside.dtype == out.dtype
    torch.testing.assert_close(out, outside.to(out.dtype), rtol=0, atol=0)
    _assert_close(out, _oracle(func, x), RTOL_HALF)
    _assert_close(inside, _oracle(func, x), RTOL_FLOAT32)


def test_a_region_entered_inside_a_compiled_function_leaves_its_out_call_alone():
    torch._dynamo.reset()
    x = _x(torch.float16)

    def f(t, o):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return nvdispatch.fft.fftn(t, out=o), nvdispatch.fft.fftn(t)

    out = torch.empty(4, 16, dtype=torch.complex64)
    got, inside = torch.compile(f, backend="aot_eager", fullgraph=True)(x, out)
    assert inside.dtype == torch.complex64
    torch.testing.assert_close(out, nvdispatch.fft.fftn(x).to(torch.complex64), rtol=0, atol=0)
    _assert_close(out, _oracle("fftn", x), RTOL_HALF)


# -- explain() --------------------------------------------------------------------------------------------------------
def test_explain_says_the_region_is_not_applied_because_of_out():
    x = _x(torch.float16)
    out = torch.empty(4, 9, dtype=torch.complex64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        e = nvdispatch.explain(nvdispatch.fft.rfft, x, out=out)
        plain = nvdispatch.explain(nvdispatch.fft.rfft, x)
        f32 = nvdispatch.explain(nvdispatch.fft.rfft, x.float(), out=out)
    assert e.precision.startswith(
        "Torch autocast('cpu', bfloat16) not applied: out= is given, and torch autocasts no call given an explicit "
        "out= (its float16 input would have been cast to float32 first); torch's rule for float16 input"
    )
    assert plain.precision.startswith("Torch autocast('cpu', bfloat16): float16 input cast to float32 first")
    assert f32.precision is None or "autocast" not in f32.precision  # a dtype the region would not cast
    assert nvdispatch.explain(nvdispatch.fft.rfft, x, out=out).precision.startswith("torch's rule")  # no region


# -- CUDA (-m gpu): Torch's CUDA autocast lists no FFT, so an out= call there is what it is outside the region ------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch with CUDA")
@pytest.mark.parametrize("func", ["fft", "irfft", "rfftn"])
def test_cuda_transforms_given_out_in_a_cuda_region(func):
    torch._dynamo.reset()
    # power-of-two lengths (Torch's CUDA half-precision domain; a c2r transform's last length is 2 * (m - 1))
    x = _x(torch.float16, shape=(4, 9) if func == "irfft" else (4, 16)).cuda()
    outside = getattr(nvdispatch.fft, func)(x)
    compiled = torch.compile(lambda t, o: getattr(nvdispatch.fft, func)(t, out=o), backend="aot_eager",
                             fullgraph=True)  # fmt: skip
    out, out_compiled, own_out = (torch.empty_like(outside) for _ in range(3))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert getattr(nvdispatch.fft, func)(x, out=out) is out
        compiled(x, out_compiled)
        getattr(torch.fft, func)(x, out=own_out)  # Torch's own out= call (its CUDA FFTs take float16)
        assert torch.is_autocast_enabled("cuda")
    for got in (out, out_compiled):
        torch.testing.assert_close(got, outside, rtol=0, atol=0)
        _assert_close(got.cpu(), _oracle(func, x.cpu()), RTOL_HALF)
    assert own_out.dtype == out.dtype
