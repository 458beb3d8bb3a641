"""FFT through ``cupy.fft`` for CuPy arrays, with the cuFFT plans kept in nvdispatch's shared plan cache.

On first execution the plan makes a cuFFT plan with ``cupyx.scipy.fftpack.get_fft_plan`` for the actual
operand layout and keeps it (so it lives, is counted and is evicted with the shared cache); later calls
run ``cupy.fft.<func>`` under ``with plan:``. Layouts ``get_fft_plan`` cannot describe (padding/trimming,
non-contiguous axes, hfft/ihfft...) run with CuPy's own per-device plan cache instead. Work is queued on
CuPy's current stream, or on ``stream=``; nothing synchronizes.
"""

from __future__ import annotations

from .._fft_problem import FFTProblem
from .cupy import stream_context


def decline(problem: FFTProblem) -> str | None:
    if problem.long_double:
        return "long double is computed on the CPU only (NumPy executor, scipy.fft's pocketfft)"
    return None


def strategies(problem: FFTProblem) -> tuple[str, ...]:
    return ("cupy.fft",)


def plan(problem: FFTProblem, strategy: str, tuning=None):
    return CupyFFTPlan(problem, strategy)


_VALUE_TYPE = {"c2c": "C2C", "r2c": "R2C", "c2r": "C2R"}


class CupyFFTPlan:
    def __init__(self, problem: FFTProblem, strategy: str):
        import cupy

        self.problem = p = problem
        self.strategy = strategy
        self.fn = getattr(cupy.fft, p.func)
        if p.ndim_api:
            self.kwargs = {"s": p.lengths, "axes": p.axes, "norm": p.norm}
        else:
            self.kwargs = {"n": p.lengths[0], "axis": p.axes[0], "norm": p.norm}
        self.cufft_plan = None
        self._tried = False
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        self.steps = (
            f"cupy.fft.{p.func}(x, {args}) on CuPy's current stream (or stream=)",
            "cuFFT plan from cupyx.scipy.fftpack.get_fft_plan, kept in nvdispatch's plan cache",
            p.describe(),
        )

    def _make_cufft_plan(self, x):
        self._tried = True
        p = self.problem
        if (
            p.needs_resize
            or p.func in ("hfft", "ihfft")
            or p.dtype not in ("complex64", "complex128", "float32", "float64")
        ):
            return
        if p.kind != "r2c" and p.dtype in ("float32", "float64"):
            return  # CuPy promotes real input itself; let its cache plan the promoted array
        try:
            from cupyx.scipy.fftpack import get_fft_plan

            axes = p.axes if p.ndim_api else p.axes[0]
            shape = tuple(p.lengths) if p.ndim_api else None
            self.cufft_plan = get_fft_plan(x, shape=shape, axes=axes, value_type=_VALUE_TYPE[p.kind])
        except Exception:  # noqa: BLE001 - a layout get_fft_plan cannot describe: CuPy's cache plans it
            self.cufft_plan = None

    def execute(self, operands, stream=None):
        x = operands["x"]
        if self.problem.empty:  # cuFFT cannot plan a zero-size batch
            import cupy

            with stream_context(stream):
                return cupy.zeros(self.problem.out_shape, dtype=self.problem.result_dtype)
        if not self._tried:
            self._make_cufft_plan(x)
        ctx = stream_context(stream)
        with ctx:
            if self.cufft_plan is not None:
                try:
                    with self.cufft_plan:
                        return self.fn(x, **self.kwargs)
                except (ValueError, RuntimeError):
                    self.cufft_plan = None  # CuPy rejected the plan for this call: plan per call instead
            return self.fn(x, **self.kwargs)

    def release(self) -> None:
        self.cufft_plan = None

