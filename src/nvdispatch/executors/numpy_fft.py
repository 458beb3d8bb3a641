"""FFT on the CPU for NumPy arrays: ``scipy.fft`` when SciPy is installed, else ``numpy.fft``.

``scipy.fft`` keeps single precision and runs batched/n-D transforms over ``workers`` threads: on one thread
or on all cores the process may use, whichever was measured faster for the transform's shape
(:mod:`.numpy_fft_workers`). ``numpy.fft`` (the fallback) computed in double precision before NumPy 2.0, so its
result is cast back to the problem's dtype. The input is never written to.
"""

from __future__ import annotations

import numpy as np

from .._fft_problem import FFTProblem
from . import numpy_fft_workers

try:  # pragma: no cover - exercised through whichever is installed
    # SciPy's own (pocketfft) implementation, called directly: going through the public ``scipy.fft``
    # multimethods would come back to nvdispatch when it is the active ``scipy.fft`` backend.
    from scipy.fft import _pocketfft as _scipy_fft
except ImportError:  # pragma: no cover - no SciPy (or a SciPy without it): numpy.fft
    _scipy_fft = None


def decline(problem: FFTProblem) -> str | None:
    return None


def strategies(problem: FFTProblem) -> tuple[str, ...]:
    return ("scipy",) if _scipy_fft is not None else ("numpy",)


def plan(problem: FFTProblem, strategy: str, tuning=None):
    return NumpyFFTPlan(problem, strategy)


class NumpyFFTPlan:
    needs_release = False  # holds nothing to free: calls need not pin it (see the plan cache)

    def __init__(self, problem: FFTProblem, strategy: str):
        self.problem = problem
        self.strategy = strategy
        lib = _scipy_fft if strategy == "scipy" else np.fft
        self.fn = getattr(lib, problem.func)
        self.result_dtype = np.dtype(problem.result_dtype)
        p = problem
        if p.ndim_api:
            self.kwargs = {"s": p.lengths, "axes": p.axes, "norm": p.norm}
        else:
            self.kwargs = {"n": p.lengths[0], "axis": p.axes[0], "norm": p.norm}
        if strategy == "scipy":
            workers = self.kwargs["workers"] = numpy_fft_workers.workers_for(p, self.fn, self.kwargs)
            if workers == 1:
                how = "scipy.fft (pocketfft on one thread: measured faster for this shape, or one 1-D transform)"
            else:
                how = "scipy.fft (pocketfft on all cores: measured faster for this shape)"
        else:
            how = f"numpy.fft (pocketfft), result cast to {p.result_dtype}"
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        module = "scipy.fft" if strategy == "scipy" else "numpy.fft"
        self.steps = (f"{module}.{p.func}(x, {args}) via {how}", p.describe())

    def execute(self, operands, stream=None):
        x = operands["x"]
        if x.dtype.kind not in "fc":  # DLPack views of exotic dtypes never reach here; be safe anyway
            x = x.astype(self.problem.compute_dtype)
        out = self.fn(x, **self.kwargs)
        if out.dtype != self.result_dtype:
            out = out.astype(self.result_dtype, copy=False)
        return out

    def release(self) -> None:
        pass
