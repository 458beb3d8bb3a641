"""``nvdispatch.fft.convolve`` on the raw ``"cuda"`` executor.

``device-fused``
    One generated kernel per call (:mod:`nvdispatch.device.fft_callback_kernel`): load -> block FFT ->
    multiply by ``h`` in registers -> inverse block FFT -> scale -> store. The signal is read once and
    written once. Taken along the last axis of a C-contiguous ``x``, for lengths the device engine has
    (2**a 3**b 5**c 7**d up to 4096), with a C-contiguous filter that is one row for all signals (shape
    ``(m,)``, ``(1, ..., m)``) or one row per signal (the spectrum's shape).
``cufft-lto``
    Larger sizes: cuFFT's forward transform with the multiply linked in as an LTO store callback, then
    cuFFT's inverse (two passes over the signal instead of the three of fft, multiply, ifft).

Otherwise the executor declines and the Torch/CuPy executors run fft, multiply, ifft.
"""

from __future__ import annotations

import math

import numpy as np

from .._fft_callbacks import Callback, CallbackFFTProblem, DataLayout
from .._fft_convolve import ConvolveProblem
from ..errors import CallbackError
from .cuda_fft import CudaFFTPlan, layout
from .cuda_fft_callbacks import (
    LtoCallbackPlan,
    NumbaStreams,
    c_contiguous,
    decline_by,
    lto_reason,
    numba_reason,
    numba_view,
    on_device,
    strategies_by,
)


def times_filter_row(v, i, h):
    """Epilog of the cuFFT route: one filter row for every signal."""
    return v * h[i % h.shape[0]]


def times_filter_flat(v, i, h):
    """Epilog of the cuFFT route: a filter of the spectrum's shape."""
    return v * h[i]


def fused_reason(problem: ConvolveProblem) -> str | None:
    why = numba_reason()
    if why:
        return why
    from ..device.fft_callback_kernel import covers

    p = problem.forward
    if p.axes[0] != len(p.shape) - 1:
        return "the device engine transforms along the last axis"
    if not covers(p.lengths[0]):
        return f"n={p.lengths[0]} is not a device-engine length (2**a 3**b 5**c 7**d, 2..4096)"
    if not c_contiguous(p):
        return "x is not C-contiguous"
    if problem.filter_rows is None or not problem.filter.c_contiguous:
        return "h must be C-contiguous, one row for all signals or the spectrum's shape"
    return None


def _lto_problem(problem: ConvolveProblem) -> CallbackFFTProblem | str:
    f = problem.filter
    rows = problem.filter_rows
    if problem.forward.axes[0] != len(problem.forward.shape) - 1 or rows is None or not f.c_contiguous:
        return "h must be C-contiguous, one row for all signals or the spectrum's shape, along the last axis"
    size = math.prod(f.shape)
    shape = (f.shape[-1],) if rows == "one" else (size,)
    flat = DataLayout(f.framework, f.device, f.dtype, shape, (1,))
    fn = times_filter_row if rows == "one" else times_filter_flat
    return CallbackFFTProblem(problem.forward, None, Callback("epilog", fn, (flat,)))


def lto_convolve_reason(problem: ConvolveProblem) -> str | None:
    cb = _lto_problem(problem)
    if isinstance(cb, str):
        return cb
    why = lto_reason(cb)
    if why:
        return why
    inv = layout(problem.inverse)
    return inv if isinstance(inv, str) else None


_REASONS = (("device-fused", fused_reason), ("cufft-lto", lto_convolve_reason))


def decline(problem: ConvolveProblem) -> str | None:
    return decline_by(problem, problem.forward.autograd, _REASONS)


def strategies(problem: ConvolveProblem) -> tuple[str, ...]:
    return strategies_by(problem, _REASONS)


def plan(problem: ConvolveProblem, strategy: str, tuning=None):
    if strategy == "device-fused":
        return FusedConvolvePlan(problem, strategy)
    return LtoConvolvePlan(problem, strategy)


class FusedConvolvePlan:
    """One kernel: load -> FFT -> * h -> inverse FFT -> store."""

    def __init__(self, problem: ConvolveProblem, strategy: str):
        from numba.cuda import types
        from numba.np.numpy_support import from_dtype

        from .._cuda import runtime
        from ..device.fft_callback_kernel import KernelSpec, build_callback_kernel

        self.problem, self.strategy = problem, strategy
        p = problem.forward
        self.device_index = p.device.index if p.device.index is not None else runtime.current_device()
        n = p.lengths[0]
        self.rows = math.prod(p.shape[:-1])
        self.n_mid = p.out_shape[-1]
        self.per_row = problem.filter_rows == "each"
        spec = KernelSpec(
            p.kind, n, p.real_dtype, "forward", p.shape[-1], scale=1.0 / n, convolve=True, filter_per_row=self.per_row
        )
        self.spec = spec
        self.kernel = build_callback_kernel(spec)
        argtypes = [
            types.Array(from_dtype(np.dtype(p.dtype)), 2, "C"),
            types.Array(from_dtype(np.dtype(problem.inverse.result_dtype)), 2, "C"),
            types.Array(from_dtype(np.dtype(problem.filter.dtype)), 2, "C"),
        ]
        self._several = runtime.device_count() > 1
        try:
            with on_device(self.device_index, self._several):
                self.kernel.compile(argtypes)
        except Exception as exc:  # noqa: BLE001
            raise CallbackError("h", "a filter the generated convolution kernel compiles for", str(exc)) from exc
        self._streams = NumbaStreams()
        F = self.kernel.first
        self.steps = (
            f"one generated Numba kernel per call: load x -> block {p.kind} FFT n={n} -> multiply by h "
            f"({'one row per signal' if self.per_row else 'one row for all'}) in registers -> block "
            f"{self.kernel.second.fft_type} inverse FFT -> scale 1/{n} -> store "
            f"({F.elements_per_thread} elements/thread, {F.ffts_per_block} FFTs/block)",
            f"grid {self.kernel.grid(self.rows)} x block {self.kernel.block_dim}, "
            f"{self.kernel.shared_memory_size} B shared memory, on the caller's stream",
            problem.describe(),
        )

    def execute(self, operands, stream=None):
        from .._cuda import arrays, streams

        p, inv = self.problem.forward, self.problem.inverse
        fw = p.framework
        x, h = operands["x"], operands["h"]
        s = streams.stream_pointer(stream, fw, self.device_index)
        kind = arrays.result_kind(x, fw)
        out, _ = arrays.empty(kind, inv.out_shape, inv.result_dtype, self.device_index, s)
        if self.rows == 0:
            return out
        with on_device(self.device_index, self._several):
            xv = numba_view(x, fw, (self.rows, p.shape[-1]))
            ov = numba_view(out, kind, (self.rows, self.spec.n_out))
            hv = numba_view(h, fw, (self.rows if self.per_row else 1, self.n_mid))
            self.kernel.launch(xv, ov, hv, (), (), self._streams(s))
        return out

    def release(self) -> None:
        pass


class LtoConvolvePlan:
    """cuFFT forward with ``* h`` as LTO store callback, then cuFFT inverse."""

    def __init__(self, problem: ConvolveProblem, strategy: str):
        self.problem, self.strategy = problem, strategy
        self.forward = LtoCallbackPlan(_lto_problem(problem), "cufft-lto")
        self.inverse = CudaFFTPlan(problem.inverse, "cufft")
        self.steps = (*self.forward.steps[:-1], *self.inverse.steps[:-1], problem.describe())

    def execute(self, operands, stream=None):
        y = self.forward.execute({"x": operands["x"], "epilog_data": (operands["h"],)}, stream)
        return self.inverse.execute({"x": y}, stream)

    def release(self) -> None:
        self.forward.release()
        self.inverse.release()
