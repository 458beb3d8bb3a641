"""The row-panel engine: a linear layer computed panel of rows by panel of rows, each finished while in cache.

``act(alpha * a @ b + beta * c + bias)`` is cut into panels of the result's rows, each sized to stay in one
core's private cache. A panel is ``np.matmul(a[rows], b, out=result[rows])``, then at once ``alpha``,
``beta * c[rows]``, the bias and the activation in place on that panel (bias and RELU in one compiled sweep
where the extension is built, as engine ``sweep`` does), while it is still in cache: the
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
import threading

import numpy as np

from .._matmul_problem import MatmulProblem
from .._tunings import an_int, check_object, require_valid
from . import blas_threads, cpu_caches
from .cpu_autotune import TuningProposal, propose
from .cpu_threads import CPUS, pool
from .numpy_matmul_engines import SWEEP_ACTIVATIONS, EnginePlan, cblas_operand, gemm_kernel, sweep_kernel, swept

__all__ = ["PanelPlan", "panel_byte_choices"]

_CPUS = CPUS
#: panel sizes tried when the system does not say how large a core's cache is
_UNKNOWN_CACHE_CHOICES = (1 << 18, 1 << 20, 1 << 22)
#: fewest rows per panel: fewer make BLAS calls too short to be efficient, whatever the cache says
_MIN_ROWS = 16


def _pool():
    return pool("cpu", _CPUS - 1)


def panel_byte_choices() -> tuple[int, ...]:
    """Panel sizes (bytes of result) autotuning tries, the default first: a core's private cache, half
    and twice that; fixed sizes where the cache size is unknown. 0 stands for the whole result at once."""
    cache = cpu_caches.private_cache_bytes()
    sizes = (cache, cache // 2, cache * 2) if cache else _UNKNOWN_CACHE_CHOICES
    return (*sizes, 0)


def default_threads() -> int:
    """All cores where NumPy's BLAS can be held to one thread per panel, else one (BLAS threads each)."""
    return _CPUS if blas_threads.controllable() else 1


class _Shares:
    """Panels ``0 .. count-1`` dealt to ``threads`` threads: each takes from the front of a contiguous run of
    its own (its pages of the fresh result are its own to fault in: threads writing neighbouring panels
    would contend for the same huge pages), and once its run is done, from the back of the longest run left
    (a thread the machine's other load slows down is helped instead of waited for)."""

    def __init__(self, count: int, threads: int):
        per = -(-count // threads)
        self._runs = [[lo, min(lo + per, count)] for lo in range(0, count, per)]
        self._lock = threading.Lock()

    def take(self, thread: int) -> int | None:
        """The next panel for ``thread`` (None: all are taken)."""
        # on one line: no line event (where a trace function may raise) between taking and leaving the lock
        with self._lock: return self._next(thread)  # noqa: E701 # fmt: skip

    def _next(self, thread: int) -> int | None:
        if thread < len(self._runs):
            run = self._runs[thread]
            if run[0] < run[1]:
                run[0] += 1
                return run[0] - 1
        longest = max(self._runs, key=lambda run: run[1] - run[0])
        if longest[0] < longest[1]:
            longest[1] -= 1
            return longest[1]
        return None


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
        rows = self._rows_for(int(tuning.get("panel_bytes", panel_byte_choices()[0])), problem.m)
        #: the knobs, in one attribute (autotune's commit replaces it at once): (panel_rows, threads)
        self._setting = (rows, max(1, int(tuning.get("threads", default_threads()))))
        super().__init__(problem, "panels")
        #: the compiled bias + activation sweep each panel is finished with, where the extension has it
        self.panel_sweep = sweep_kernel()
        #: NumPy's BLAS gemm and the sweep in one compiled call per panel (engine ``gemm``'s), where available
        self.panel_gemm = gemm_kernel(problem.result_dtype) if problem.result_dtype in ("float32", "float64") else None

    @property
    def panel_rows(self) -> int:
        return self._setting[0]

    @property
    def threads(self) -> int:
        return self._setting[1]

    def with_setting(self, setting: tuple[int, int]) -> PanelPlan:
        """A private copy of this plan with knobs ``(panel_rows, threads)``."""
        trial = copy.copy(self)
        trial._setting = tuple(setting)
        trial.run = trial._panels  # (the copy's bound method, not this plan's)
        return trial

    def _rows_for(self, panel_bytes: int, m: int) -> int:
        if panel_bytes == 0 or m == 0:
            return max(m, 1)
        return max(_MIN_ROWS, panel_bytes // self.row_bytes)

    def _describe(self) -> tuple[str, ...]:
        p = self.problem
        how = f"panels of {self.panel_rows} rows (~{self.panel_rows * self.row_bytes >> 10} KiB each)"
        where = f"{self.threads} threads, a share of rows each, BLAS 1 thread each"
        where = "on 1 thread" if self.threads == 1 else where
        product = "np.matmul(a[rows], b, out=result[rows])"
        if self.panel_gemm is not None and p.c is None and self.activation in SWEEP_ACTIVATIONS:
            product = "NumPy's BLAS gemm from C, beta=1 into the zeroed result[rows], then the sweep, in one call,"
        steps = [f"{product} in {how}, {where} (engine 'panels')"]
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
        workers = self.own_threads
        rows = self.panel_rows
        act = self.activation
        sweep = self.panel_sweep if act in SWEEP_ACTIVATIONS and (bias is not None or act is not None) else None
        compiled = self._compiled_panels(a, b, bias, c, alpha, beta)
        out = np.empty((m, b.shape[1]), self.dtype) if compiled is None else compiled[0]

        def finish_in_python(r0: int, r1: int) -> None:
            o = out[r0:r1]
            np.matmul(a[r0:r1], b, out=o)
            if alpha != 1:
                np.multiply(o, alpha, out=o, casting="unsafe")
            if c is not None and beta != 0:
                cr = c[r0:r1]
                np.add(o, cr if beta == 1 else np.multiply(cr, beta), out=o, casting="unsafe")
            if sweep is not None:  # bias and RELU in one compiled sweep of the panel
                swept(sweep, o, bias, act == "relu")
                return
            if bias is not None:
                np.add(o, bias, out=o)
            if act is not None:
                self._finish(o, act)

        finish = finish_in_python if compiled is None else compiled[1]
        if workers <= 1:
            for r0 in range(0, m, rows):
                finish(r0, min(r0 + rows, m))
            return out
        shares = _Shares(-(-m // rows), workers)

        def share(thread: int) -> None:
            while (i := shares.take(thread)) is not None:
                finish(i * rows, min((i + 1) * rows, m))

        with blas_threads.single_threaded():
            _pool().run(share, range(workers))
        return out

    def _compiled_panels(self, a, b, bias, c, alpha, beta):
        """``(zeroed result, finish(r0, r1))`` where each panel can be one compiled call (NumPy's BLAS gemm with
        beta=1 into the zeroed rows, then bias and RELU swept while they are in cache); None where not (another
        activation, ``c``, a layout or bias the call cannot read)."""
        if self.panel_gemm is None or self.activation not in SWEEP_ACTIVATIONS or (c is not None and beta != 0):
            return None
        ta, lda = cblas_operand(a, self.dtype)
        tb, ldb = cblas_operand(b, self.dtype)
        if lda is None or ldb is None or isinstance(alpha, complex) or np.iscomplexobj(alpha):
            return None
        m, k = a.shape
        n = b.shape[1]
        at = None
        if bias is not None:
            if bias.size != n or bias.dtype != self.dtype:
                return None
            bias = np.ascontiguousarray(bias)
            at = bias.__array_interface__["data"][0]
        kernel, address, ilp64, kind = self.panel_gemm
        out = np.zeros((m, n), self.dtype)
        item = self.dtype.itemsize
        a0, b0, o0 = (x.__array_interface__["data"][0] for x in (a, b, out))
        a_row = item if ta else lda * item  # bytes from one row of a to the next as the product reads it
        relu, alpha = self.activation == "relu", float(alpha)

        def finish(r0: int, r1: int) -> None:
            rows = r1 - r0
            kernel(address, ilp64, kind, ta, tb, rows, n, k, alpha, a0 + r0 * a_row, lda, b0, ldb, 1.0,
                   o0 + r0 * n * item, n, at, relu, rows)  # fmt: skip

        finish.keep = (a, b, bias, out)  # (the arrays whose addresses it holds, alive as long as it is)
        return out, finish

    # -- autotuning ---------------------------------------------------------------------------------------
    def propose_tuning(self, operands, iterations: int = 3) -> TuningProposal:
        """Time panel sizes x thread counts (the first ``preferences.limit`` of them) on the real operands, on
        private copies of this plan, and propose the fastest (``cpu_autotune``)."""
        threads = sorted({1, default_threads()}, reverse=True)
        configs = itertools.product(panel_byte_choices(), threads)
        settings = [
            ((panel_bytes, workers), (self._rows_for(panel_bytes, self.problem.m), workers))
            for panel_bytes, workers in itertools.islice(configs, self.problem.plan_preferences.limit)
        ]
        return propose(self, settings, operands, iterations, own_threads=lambda trial: trial.own_threads)

    def autotune(self, operands, iterations: int = 3):
        """:meth:`propose_tuning` and commit the proposal to this plan at once; returns the timings."""
        proposal = self.propose_tuning(operands, iterations)
        proposal.commit()
        return proposal.timings
