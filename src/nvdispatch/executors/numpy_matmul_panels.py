"""The row-panel engine: a linear layer computed panel of rows by panel of rows, each finished while in cache.

``act(alpha * a @ b + beta * c + bias)`` is cut into panels of the result's rows, each sized to stay in one
core's private cache. A panel is ``np.matmul(a[rows], b, out=result[rows])``, then at once ``alpha``,
``beta * c[rows]``, the bias and the activation in place on that panel, while it is still in cache: the
epilog never makes its own trips through memory, as it does after a whole-result GEMM. On several threads
each thread takes a contiguous share of the rows, panel by panel, its BLAS calls held to one thread
(``blas_threads``) so the cores are not oversubscribed.

Panel size and thread count are the plan's knobs: the defaults come from the core's cache size
(``cpu_caches``); ``Matmul.autotune()`` times a few panel sizes around it (and the whole result as one
panel, i.e. GEMM then epilog) on one and on all threads, and keeps the fastest. Whether this engine beats
the others at all is the calibration's call (``numpy_matmul_calibration``), per machine.
"""

from __future__ import annotations

import copy
import itertools

import numpy as np

from .._matmul_problem import MatmulProblem
from .._tunings import an_int, check_object, require_valid
from . import blas_threads, cpu_caches
from .cpu_threads import CPUS, pool
from .numpy_matmul_calibration import fastest_seconds
from .numpy_matmul_engines import EnginePlan

__all__ = ["PanelPlan", "panel_byte_choices"]

_CPUS = CPUS
#: panel sizes tried when the system does not say how large a core's cache is
_UNKNOWN_CACHE_CHOICES = (1 << 18, 1 << 20, 1 << 22)
#: fewest rows per panel: fewer make BLAS calls too short to be efficient, whatever the cache says
_MIN_ROWS = 16


def _pool():
    return pool("panels", _CPUS - 1)


def panel_byte_choices() -> tuple[int, ...]:
    """Panel sizes (bytes of result) autotuning tries, the default first: a core's private cache, half
    and twice that; fixed sizes where the cache size is unknown. 0 stands for the whole result at once."""
    cache = cpu_caches.private_cache_bytes()
    sizes = (cache, cache // 2, cache * 2) if cache else _UNKNOWN_CACHE_CHOICES
    return (*sizes, 0)


def default_threads() -> int:
    """All cores where NumPy's BLAS can be held to one thread per panel, else one (BLAS threads each)."""
    return _CPUS if blas_threads.controllable() else 1


class PanelPlan(EnginePlan):
    """``EnginePlan`` with engine ``panels``; ``tuning`` may give ``panel_bytes`` and ``threads``."""

    tuning_kind = "numpy-panels"

    @staticmethod
    def validate_tuning(value) -> str | None:
        """Why ``value`` is no tuning of this plan (``{"panel_bytes": int >= 0, "threads": 1 to 4 a core}``)."""
        return check_object(value, {"panel_bytes": an_int(0, 1 << 62), "threads": an_int(1, 4 * _CPUS)})

    def __init__(self, problem: MatmulProblem, tuning=None):
        if tuning is not None:
            require_valid(self, tuning)
        tuning = tuning or {}
        itemsize = np.dtype(problem.result_dtype).itemsize
        self.row_bytes = max(1, problem.n * itemsize)
        self.threads = max(1, int(tuning.get("threads", default_threads())))
        self.panel_rows = self._rows_for(int(tuning.get("panel_bytes", panel_byte_choices()[0])), problem.m)
        super().__init__(problem, "panels")

    def _rows_for(self, panel_bytes: int, m: int) -> int:
        if panel_bytes == 0 or m == 0:
            return max(m, 1)
        return max(_MIN_ROWS, panel_bytes // self.row_bytes)

    def _describe(self) -> tuple[str, ...]:
        p = self.problem
        how = f"panels of {self.panel_rows} rows (~{self.panel_rows * self.row_bytes >> 10} KiB each)"
        where = f"{self.threads} threads, a share of rows each, BLAS 1 thread each"
        where = "on 1 thread" if self.threads == 1 else where
        steps = [f"np.matmul(a[rows], b, out=result[rows]) in {how}, {where} (engine 'panels')"]
        if p.c is not None:
            steps.append("alpha, beta * c[rows] (in place on each panel while in cache)")
        for step in p.epilog.steps:
            steps.append(f"{step} (in place on each panel while in cache)")
        return tuple(steps)

    @property
    def own_threads(self) -> int:
        """The threads a call runs panels on (1: the caller's alone, BLAS threading as it likes)."""
        m = self.problem.m
        return max(1, min(self.threads, -(-m // self.panel_rows))) if m else 1

    def tuning(self):
        return {"panel_bytes": self.panel_rows * self.row_bytes, "threads": self.threads}

    # -- execution ----------------------------------------------------------------------------------------
    def _panels(self, a, b, bias, c, alpha, beta):
        m = a.shape[0]
        out = np.empty((m, b.shape[1]), self.dtype)
        workers = self.own_threads
        rows = self.panel_rows
        act = self.activation

        def finish(r0: int, r1: int) -> None:
            o = out[r0:r1]
            np.matmul(a[r0:r1], b, out=o)
            if alpha != 1:
                np.multiply(o, alpha, out=o, casting="unsafe")
            if c is not None and beta != 0:
                cr = c[r0:r1]
                np.add(o, cr if beta == 1 else np.multiply(cr, beta), out=o, casting="unsafe")
            if bias is not None:
                np.add(o, bias, out=o)
            if act is not None:
                self._finish(o, act)

        def share(lo: int, hi: int) -> None:
            for r0 in range(lo, hi, rows):
                finish(r0, min(r0 + rows, hi))

        if workers <= 1:
            share(0, m)
            return out
        # each thread a contiguous share of the rows: its pages of the fresh result are its own to fault in
        # (threads writing neighbouring panels would contend for the same huge pages)
        per = -(-m // workers)
        with blas_threads.single_threaded():
            helpers = [_pool().submit(share, lo, min(lo + per, m)) for lo in range(per, m, per)]
            try:
                share(0, min(per, m))  # the calling thread takes the first share
            finally:
                for done in helpers:
                    done.result()
        return out

    # -- autotuning ---------------------------------------------------------------------------------------
    def autotune(self, operands, iterations: int = 3):
        """Time panel sizes × thread counts (the first ``preferences.limit`` of them) on the real operands and
        keep the fastest; returns the timings. Each setting on several threads is timed after a short pause
        (BLAS worker threads left spinning by whatever ran before would take a core from it). Trials run on a
        private copy: this (shared, cached) plan changes once, to the best setting."""
        timings = {}
        best = None
        trial = copy.copy(self)
        trial.run = trial._panels  # (the copy's bound method, not this plan's)
        threads = sorted({1, default_threads()}, reverse=True)
        configs = itertools.product(panel_byte_choices(), threads)
        for panel_bytes, workers in itertools.islice(configs, self.problem.plan_preferences.limit):
            trial.panel_rows, trial.threads = self._rows_for(panel_bytes, self.problem.m), workers
            if trial.own_threads > 1:  # after BLAS worker threads (of the last trial, or other code) went idle
                blas_threads.let_workers_sleep()
            trial.execute(operands)  # warm-up
            t = fastest_seconds(lambda: trial.execute(operands), iterations)
            timings[(panel_bytes, workers)] = t
            if best is None or t < best[1]:
                best = ((trial.panel_rows, workers), t)
        trial.panel_rows, trial.threads = best[0]
        steps = trial._describe()
        self.panel_rows, self.threads, self.steps = trial.panel_rows, trial.threads, steps
        return timings
