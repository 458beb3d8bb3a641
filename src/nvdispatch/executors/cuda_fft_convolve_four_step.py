"""The ``four-step`` strategy of ``fft.convolve`` on the ``"cuda"`` executor: long signals in three passes
over memory, the multiply by ``h`` folded into the middle one (the kernels and their traffic model:
:mod:`nvdispatch.device.fft_four_step`).

For C-contiguous signals along the last axis of a length ``n = n1 * n2`` the device engine splits
(``n > 1024``; ``x`` not padded or trimmed by ``n``), real or complex, with one C-contiguous filter row for
all signals. Memory: the result, plus one complex intermediate of the batch and the permuted filter
(scratch from the caller's allocator, on its stream).
"""

from __future__ import annotations

import math

import numpy as np

from .._fft_convolve import ConvolveProblem
from .cuda_numba import c_contiguous, numba_reason, on_device
from .cuda_numba_launch import StepLauncher

__all__ = ["SHORTEST", "four_step_reason", "FourStepConvolvePlan"]

#: lengths up to this run in one kernel (``device-fused``); the four-step starts beyond
SHORTEST = 1024


def four_step_reason(problem: ConvolveProblem) -> str | None:
    """Why the four-step strategy does not apply, or None."""
    why = numba_reason()
    if why:
        return why
    from ..device.fft_four_step import split

    f = problem.forward
    n = f.lengths[0]
    if f.axes[0] != len(f.shape) - 1:
        return "the four-step kernels transform along the last axis"
    if n <= SHORTEST:
        return f"n={n} runs in one kernel (device-fused)"
    if split(n) is None:
        return f"n={n} is no product of two device-engine lengths (2**a 3**b 5**c 7**d, 2..4096)"
    if f.needs_resize:
        return "x is padded or trimmed by n"
    if f.kind != "r2c" and f.dtype != f.compute_dtype:
        return f"{f.dtype} x would be promoted first"
    if not c_contiguous(f):
        return "x is not C-contiguous"
    if problem.filter_rows != "one" or not problem.filter.c_contiguous:
        return "h must be one C-contiguous row for all signals"
    return None


class FourStepConvolvePlan:
    """permute h -> column pass -> middle pass (FFT, * h, inverse FFT) -> inverse column pass."""

    def __init__(self, problem: ConvolveProblem, strategy: str, variant=None):
        """``variant``: a :class:`~nvdispatch.device.fft_four_step.FourStepVariant` (the split and the knobs of
        the passes), else the engine's defaults."""
        from .._cuda import arrays, runtime
        from ..device.fft_four_step import FourStepConvolution

        self.problem, self.strategy = problem, strategy
        f, inv = problem.forward, problem.inverse
        self.device_index = f.device.index if f.device.index is not None else runtime.current_device()
        self.rows = math.prod(f.shape[:-1])
        knobs = {} if variant is None else variant.knobs()
        self.engine = FourStepConvolution(f.lengths[0], f.real_dtype, f.kind == "r2c", **knobs)
        self.complex_dtype = np.dtype(f.compute_dtype)
        work, hp = self.engine.work_shapes(self.rows)
        item = self.complex_dtype.itemsize
        self.filter_offset = -(-math.prod(work) * item // 256) * 256
        self.scratch_bytes = self.filter_offset + math.prod(hp) * item + 16  # + the (1, 1) dummy
        self._several = runtime.device_count() > 1
        with on_device(self.device_index, self._several):
            self.engine.compile(problem.filter.dtype)
        steps = self.engine.steps(self.rows, f.dtype, problem.filter.dtype)
        self.launcher = StepLauncher(steps, 6, self.device_index, self._several, f"convolve {strategy}")
        self._pointer = arrays.pointer_getter(f.framework)
        self.steps = (
            *self.engine.describe(),
            self.launcher.how,
            f"result {inv.result_dtype}{list(inv.out_shape)}",
            problem.describe(),
        )

    def execute(self, operands, stream=None):
        from .._cuda import arrays, memory, streams

        f, inv = self.problem.forward, self.problem.inverse
        fw, dev = f.framework, self.device_index
        x, h = operands["x"], operands["h"]
        s = streams.stream_pointer(stream, fw, dev)
        out, out_ptr = arrays.empty(arrays.result_kind(x, fw), inv.out_shape, inv.result_dtype, dev, s)
        if self.rows == 0:
            return out
        scratch = memory.scratch(self.scratch_bytes, fw, dev, s)
        try:
            base = scratch.ptr  # the intermediate, then the permuted filter, then the (1, 1) dummy
            pointer = self._pointer
            work = (base, base + self.filter_offset, base + self.scratch_bytes - 16)
            self.launcher(s, (pointer(x), out_ptr, pointer(h), *work))
        finally:
            scratch.release()  # stream-ordered: reused only after the passes
        return out

    def release(self) -> None:
        pass
