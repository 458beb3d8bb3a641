"""The ``unfused`` strategy of ``fft.convolve`` on the ``"cuda"`` executor: cuFFT forward, one multiply
kernel, cuFFT inverse, on the caller's stream (the cuFFT launch sequence:
:mod:`.cuda_fft_convolve_cufft`).

It is the three-kernel form CuPy's and Torch's ``ifft(fft(x) * h)`` run, less their separate normalisation
pass: the ``1/n`` is applied by the multiply (``y *= h / n``, in place on the spectrum this plan owns), and
cuFFT's C2R may overwrite that spectrum (no protective copy). Traffic: ``4P + 2`` traversals of the signal
(``P``: cuFFT's passes for ``n``). The timed choice keeps it as the candidate every fused strategy must
beat.
"""

from __future__ import annotations

import math

import numpy as np

from .._fft_convolve import ConvolveProblem
from .cuda_fft import CudaFFTPlan, layout
from .cuda_fft_convolve_cufft import CufftConvolvePlan
from .cuda_numba import numba_reason, on_device
from .cuda_numba_launch import StepLauncher

__all__ = ["unfused_reason", "UnfusedConvolvePlan"]


def unfused_reason(problem: ConvolveProblem) -> str | None:
    """Why the unfused strategy does not apply, or None."""
    why = numba_reason()
    if why:
        return why
    f = problem.forward
    if f.empty:
        return "an empty batch"
    if f.axes[0] != len(f.shape) - 1:
        return "the multiply kernel filters along the last axis"
    if problem.filter_rows is None or not problem.filter.c_contiguous:
        return "h must be C-contiguous, one row for all signals or the spectrum's shape"
    for p in (f, problem.inverse):
        lay = layout(p)
        if isinstance(lay, str):
            return lay
        if lay["loops"]:
            return "the batch needs several cuFFT launches"
    return None


class UnfusedConvolvePlan(CufftConvolvePlan):
    """cuFFT forward -> ``y *= h / n`` (one kernel, in place) -> cuFFT inverse."""

    def __init__(self, problem: ConvolveProblem, strategy: str):
        from ..device.fft_filter import multiply_by_filter

        f, inv = problem.forward, problem.inverse
        super().__init__(problem, strategy, lambda: CudaFFTPlan(f, "cufft"), lambda: CudaFFTPlan(inv, "cufft"))
        self.n_mid = f.out_shape[-1]
        self.rows = math.prod(f.out_shape[:-1])
        self.per_row = problem.filter_rows == "each"
        self.scale = np.dtype(f.real_dtype).type(1.0 / f.lengths[0])
        self.real_n = f.lengths[0] if f.kind == "r2c" else 0
        from .._cuda import arrays, runtime

        self._several = runtime.device_count() > 1
        self._multiply = multiply_by_filter
        self._compile()
        self.launcher = StepLauncher(self._steps(), 2, self.device_index, self._several, f"convolve {strategy}")
        self._pointer = arrays.pointer_getter(f.framework)
        self.steps = (
            self.forward.steps[0],
            f"cufftExec on the caller's stream into a scratch spectrum ({f.compute_dtype}{list(f.out_shape)})",
            f"multiply the spectrum by h / {f.lengths[0]} in place (one kernel; "
            f"{'one row per signal' if self.per_row else 'one row for all'}; {self.launcher.how})",
            self.inverse.steps[0],
            "cufftExec of the inverse on the caller's stream (it may overwrite the scratch spectrum)",
            problem.describe(),
        )

    def _steps(self) -> tuple:
        """The multiply's launch on the operands ``(spectrum, h)``."""
        from ..device.fft_filter import multiply_step
        from ..device.kernel_steps import ArrayArg

        f = self.problem.forward
        y = ArrayArg(0, (self.rows, self.n_mid), np.dtype(f.compute_dtype))
        h = ArrayArg(1, (self.rows if self.per_row else 1, self.n_mid), np.dtype(self.problem.filter.dtype))
        return (multiply_step(y, h, self.per_row, self.scale, self.real_n),)

    def _compile(self) -> None:
        from numba.cuda import types
        from numba.np.numpy_support import from_dtype

        f = self.problem.forward
        argtypes = (
            types.Array(from_dtype(np.dtype(f.compute_dtype)), 2, "C"),
            types.Array(from_dtype(np.dtype(self.problem.filter.dtype)), 2, "C"),
            types.int64,
            from_dtype(np.dtype(f.real_dtype)),
            types.int64,
        )
        with on_device(self.device_index, self._several):
            self._multiply.compile(argtypes)

    def between_transforms(self, spectrum, operands: dict, stream: int) -> None:
        self.launcher(stream, (spectrum.ptr, self._pointer(operands["h"])))
