"""A linear layer whose engine is picked per call by whether another thread of the process is running.

Where a problem class was calibrated two ways with different winners (``numpy_matmul_calibration``: the engine
running threads of its own, e.g. ``tiled``, first with the cores free; one on the BLAS's threads, e.g. ``gemm``,
first right after a bare product, while the BLAS's worker still spins), the ``inplace`` plan holds both engines'
plans and, before each call, looks at the threads' states (``cpu_contention``: tens of microseconds at most
where a call of such a class takes milliseconds): another thread running or waiting for a CPU takes the busy
plan, else (the OS not saying included) the free one. Results agree within rounding either way (each engine is
checked against the reference when calibrated, and tested against the float64 oracle).
"""

from __future__ import annotations

import logging

from . import cpu_contention

__all__ = ["ContendedPlan"]

_log = logging.getLogger("nvdispatch")


def _engine_of(plan) -> str:
    return getattr(plan, "engine", "ufunc")  # (the executor's own pass: engine ``ufunc``)


class ContendedPlan:
    """The ``free`` plan where no other thread of the process is running at the call, else the ``busy`` one.
    ``free_calls`` and ``busy_calls`` count the calls each took (what ``benchmarks/cpu_matmul_bench.py``
    reports)."""

    needs_release = False
    notes: tuple[str, ...] = ()
    strategy = "inplace"

    def __init__(self, problem, free, busy):
        self.problem = problem
        self.free, self.busy = free, busy
        self.engine = _engine_of(free)
        self.busy_engine = _engine_of(busy)
        self.free_calls = self.busy_calls = 0
        self._look = cpu_contention.probe() or (lambda: None)
        self.direct = None
        if free.direct is not None and busy.direct is not None:
            pick, free_direct, busy_direct = self._pick, free.direct, busy.direct

            def direct(*args):
                return (busy_direct if pick() else free_direct)(*args)

            self.direct = direct

    def _pick(self) -> bool:
        """True where another thread is running now (the busy plan's call), counted and DEBUG-logged."""
        running = self._look()
        if running:
            self.busy_calls += 1
        else:
            self.free_calls += 1
        if _log.isEnabledFor(logging.DEBUG):
            p = self.problem
            if running:
                why = f"engine {self.busy_engine}: {running} other thread(s) of this process running"
            else:
                why = f"engine {self.engine}: " + ("no other thread running" if running == 0 else "the OS does not say")
            _log.debug("numpy matmul %dx%dx%d %s: %s", p.m, p.n, p.k, p.result_dtype, why)
        return bool(running)

    def execute(self, operands, stream=None):
        return (self.busy if self._pick() else self.free).execute(operands, stream)

    @property
    def steps(self) -> tuple[str, ...]:
        head = (
            f"engine {self.engine!r} when the cores are free, {self.busy_engine!r} when another thread of this "
            "process is running (calibrated; the threads' states read before each call)"
        )
        free = tuple(f"cores free: {s}" for s in self.free.steps)
        busy = tuple(f"thread busy: {s}" for s in self.busy.steps)
        return (head, *free, *busy, *self.notes)

    def tuning(self):
        return None

    def release(self) -> None:
        pass
