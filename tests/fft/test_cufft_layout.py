"""The raw cuda executor's cuFFT advanced-layout computation (pure Python: runs without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from nvdispatch._detect import Device, detect
from nvdispatch._fft_problem import build_fft_problem
from nvdispatch.executors import cuda_fft
from nvdispatch.executors.cuda_fft import layout

GPU = Device("cuda", 0)


def problem(x, func="fftn", **kw):
    return build_fft_problem(func, detect("x", x), "cupy", GPU, **kw)


def test_batched_last_axis():
    lay = layout(problem(np.zeros((64, 128), np.complex64), "fft"))
    assert lay["n"] == [128] and lay["batch"] == 64 and lay["idist"] == 128 and lay["istride"] == 1


def test_first_axis_is_strided_batch():
    lay = layout(problem(np.zeros((128, 64), np.complex64), "fft", axis=0))
    assert lay["n"] == [128] and lay["istride"] == 64 and lay["batch"] == 64 and lay["idist"] == 1


def test_middle_axis_loops_outer_batch():
    lay = layout(problem(np.zeros((3, 16, 40), np.complex64), "fft", axis=1))
    assert lay["batch"] == 40 and len(lay["loops"]) == 1 and lay["loops"][0][0] == 3


def test_r2c_and_c2r_embeds():
    lay = layout(problem(np.zeros((8, 30), np.float32), "rfftn", axes=(0, 1)))
    assert lay["n"] == [8, 30] and lay["inembed"][1] == 30 and lay["onembed"][1] == 16
    lay = layout(problem(np.zeros((8, 16), np.complex64), "irfftn", axes=(0, 1)))
    assert lay["n"] == [8, 30] and lay["inembed"][1] == 16 and lay["onembed"][1] == 30


def test_strided_view_uses_embeds():
    x = np.zeros((8, 20), np.complex64)[:, ::2]
    lay = layout(problem(x, "fftn", axes=(0, 1)))
    assert lay["istride"] == 2 and lay["inembed"][1] == 10


@pytest.mark.parametrize(
    "x, func, kw, why",
    [
        (np.zeros((8, 8), np.complex64), "fft", {"n": 16}, "padding"),
        (np.zeros((8, 8), np.complex64), "hfft", {}, "hfft"),
        (np.zeros((8, 8), np.float32), "fft", {}, "promoted"),
        (np.zeros((8, 6), np.complex64).T, "fftn", {"axes": (0, 1)}, "nested"),
        (np.zeros((2,) * 4, np.complex64), "fftn", {}, "at most 3"),
        (np.zeros((8, 6), np.float32), "rfftn", {"axes": (1, 0)}, "innermost"),
    ],
)
def test_declines_with_reason(x, func, kw, why):
    assert why in layout(problem(x, func, **kw))


def test_input_alignment_is_the_complex_type_for_real_input_too():
    """cuFFT requires input pointers aligned to the transform's complex type (CUFFT_INVALID_VALUE otherwise): a real
    view of complex data (``z.imag``) starts one real element in, and is staged in aligned scratch."""
    single = problem(np.zeros(8, np.float32), "rfft")
    double = problem(np.zeros(8, np.float64), "rfft")
    assert (cuda_fft.input_alignment(single), cuda_fft.input_alignment(double)) == (8, 16)
    assert cuda_fft.input_alignment(problem(np.zeros(8, np.complex128), "fft")) == 16
    z = np.zeros((6, 8), np.complex128)
    imag = z.view(np.float64)[:, 1::2]
    assert cuda_fft.misaligned(imag.ctypes.data, 16) and not cuda_fft.misaligned(z.ctypes.data, 16)
    lay = layout(problem(imag, "rfft"))  # the layout is described as it lies: strides (16, 2) real elements
    assert lay["istride"] == 2 and lay["idist"] == 16 and lay["span"] == 5 * 16 + 7 * 2 + 1


@pytest.mark.parametrize(("func", "dtype", "n"), [("rfft", np.float32, None), ("irfft", np.complex64, 29)])
def test_outer_batch_launches_at_odd_real_offsets_are_declined(func, dtype, n):
    """An outer-batch launch of a real side (the input of rfft, the result of irfft) starting at an odd real
    element would be misaligned for cuFFT: declined (the torch/cupy executors run it)."""
    lay = layout(problem(np.zeros((3, 15, 41), dtype), func, axis=1, n=n))  # real side's outer stride: 15 * 41
    assert isinstance(lay, str) and "aligned" in lay
    even = n if n is None else 30
    assert isinstance(layout(problem(np.zeros((3, 16, 41), dtype), func, axis=1, n=even)), dict)
