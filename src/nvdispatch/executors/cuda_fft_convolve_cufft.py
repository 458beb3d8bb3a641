"""The launch sequence the cuFFT strategies of ``fft.convolve`` on the ``"cuda"`` executor share (``unfused``,
``cufft-lto``, ``cufft-lto-load``): cuFFT forward into a scratch spectrum, the filter step, cuFFT inverse
(unnormalised) into the result, all on the caller's stream.

A strategy is a subclass of :class:`CufftConvolvePlan` that says how it makes the two cuFFT plans and where
the multiply by ``h / n`` happens: in a store callback of the forward plan (pointed at ``h`` in
:meth:`~CufftConvolvePlan.before_forward`), in a load callback of the inverse plan, or in a multiply kernel
on the spectrum (both in :meth:`~CufftConvolvePlan.between_transforms`). The spectrum is the plan's own
scratch, so the inverse may overwrite it (no protective copy); the scratch is stream-ordered, reused only
after the inverse.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .._fft_convolve import ConvolveProblem
from .cuda_fft import misaligned, staged_input

__all__ = ["CufftConvolvePlan"]


class CufftConvolvePlan:
    """cuFFT forward -> scratch spectrum -> the filter step -> cuFFT inverse -> the result.

    ``make_forward()`` and ``make_inverse()`` make the two cuFFT plans, in that order (the forward one is
    released when the inverse one cannot be made)."""

    def __init__(
        self,
        problem: ConvolveProblem,
        strategy: str,
        make_forward: Callable[[], Any],
        make_inverse: Callable[[], Any],
    ):
        self.problem, self.strategy = problem, strategy
        self.forward = make_forward()
        try:
            self.inverse = make_inverse()
        except BaseException:
            self.forward.release()
            raise
        self.device_index = self.forward.device_index
        f = problem.forward
        self.spectrum_bytes = math.prod(f.out_shape) * np.dtype(f.compute_dtype).itemsize

    def before_forward(self, operands: dict, stream: int) -> None:
        """The strategy's step before the forward transform is queued on ``stream`` (a raw handle)."""

    def between_transforms(self, spectrum, operands: dict, stream: int) -> None:
        """The strategy's step on ``spectrum`` (the scratch) between the two transforms, on ``stream``."""

    def execute(self, operands, stream=None):
        from .._cuda import arrays, cufft, memory, runtime, streams

        f, inv = self.problem.forward, self.problem.inverse
        fw, dev = f.framework, self.device_index
        x = operands["x"]
        runtime.bind_context(dev)
        s = streams.stream_pointer(stream, fw, dev)
        self.before_forward(operands, s)
        spectrum = memory.scratch(self.spectrum_bytes, fw, dev, s)
        in_ptr, staged = arrays.view(x, fw).ptr, None
        if misaligned(in_ptr, self.forward.alignment):  # cuFFT rejects it (a real view of complex data)
            staged = staged_input(in_ptr, self.forward.span_bytes, fw, dev, s)
            in_ptr = staged.ptr
        self.forward.cufft.execute(in_ptr, spectrum.ptr, s, cufft.FORWARD)
        if staged is not None:
            staged.release()  # stream-ordered: reused only after the forward transform
        self.between_transforms(spectrum, operands, s)
        out, out_ptr = arrays.empty(arrays.result_kind(x, fw), inv.out_shape, inv.result_dtype, dev, s)
        self.inverse.cufft.execute(spectrum.ptr, out_ptr, s, cufft.INVERSE)
        spectrum.release()  # stream-ordered: reused only after the inverse
        return out

    @property
    def workspace_bytes(self) -> int:
        return self.forward.workspace_bytes + self.inverse.workspace_bytes

    def release(self) -> None:
        self.forward.release()
        self.inverse.release()
