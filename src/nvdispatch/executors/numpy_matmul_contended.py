"""A linear layer whose engine is picked per call by whether another thread of the process is running.

Where a problem class was calibrated two ways with different winners (``numpy_matmul_calibration``: the engine
running threads of its own, e.g. ``tiled``, first with the cores free; one on the BLAS's threads, e.g. ``gemm``,
first right after a bare product, while the BLAS's worker still spins), the ``inplace`` plan holds both engines'
plans and, before each call, looks at the threads' states (``cpu_contention``: microseconds, where a call of such
a class takes milliseconds): another thread running or waiting for a CPU takes the busy plan, else (the OS not
saying included) the free one. Results agree within rounding either way (each engine is checked against the
reference when calibrated, and tested against the float64 oracle).

**Its own spinning worker.** The busy engine's own call leaves the BLAS's worker spinning for a while
(``blas_threads.SETTLE_SECONDS``), so in a loop of this call alone the look would see a thread running before every
call and keep the busy engine for good. So where the busy engine keeps finding a thread running within that while
after its own last call, every ``explore``-th such call the plan tries the free engine instead, for as long as that
worker may spin; if the look then finds the cores free the loop stays on the free engine, else (another thread's
work: a program mixing other BLAS calls between these) the busy engine goes on and the next try comes twice as
many calls later (up to :data:`EXPLORE_MOST`).
"""

from __future__ import annotations

import logging
import time

from . import blas_threads, cpu_contention

__all__ = ["ContendedPlan", "EXPLORE_FIRST", "EXPLORE_MOST"]

#: calls of the busy engine right after its own last one before the free engine is tried, at first ...
EXPLORE_FIRST = 4
#: ... doubled after each try that found another thread still running, up to this
EXPLORE_MOST = 1024
_log = logging.getLogger("nvdispatch")
_clock = time.perf_counter


def _engine_of(plan) -> str:
    return getattr(plan, "engine", "ufunc")  # (the executor's own pass: engine ``ufunc``)


class ContendedPlan:
    """The ``free`` plan where no other thread of the process is running at the call, else the ``busy`` one
    (see the module notes for the tries of the free one). ``free_calls`` and ``busy_calls`` count the calls each
    took (what ``benchmarks/cpu_matmul_bench.py`` reports)."""

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
        self._busy_end = -float("inf")  # when the busy engine's last call ended
        self._trial_until: float | None = None  # trying the free engine until then
        self._own = 0  # busy calls in a row that found a thread running soon after the busy engine's own last one
        self._explore = EXPLORE_FIRST
        self.direct = None
        if free.direct is not None and busy.direct is not None:
            pick, free_direct, busy_direct = self._pick, free.direct, busy.direct

            def direct(*args):
                if pick():
                    out = busy_direct(*args)
                    self._busy_end = _clock()
                    return out
                return free_direct(*args)

            self.direct = direct

    def _pick(self) -> bool:
        """True for the busy plan's call, False for the free one's; counted and DEBUG-logged."""
        now = _clock()
        trial = self._trial_until
        if trial is not None and now < trial:
            return self._took(False, "trying it while the BLAS worker the busy engine's own last call left may spin")
        running = self._look()
        if trial is not None:  # the try is over: the look says whether the thread running was that worker
            self._trial_until = None
            self._explore = min(EXPLORE_MOST, 2 * self._explore) if running else EXPLORE_FIRST
        if not running:
            self._own = 0
            return self._took(False, "no other thread running" if running == 0 else "the OS does not say")
        if now - self._busy_end < blas_threads.SETTLE_SECONDS:
            self._own += 1
            if self._own >= self._explore:
                self._own = 0
                self._trial_until = self._busy_end + blas_threads.SETTLE_SECONDS
                return self._took(False, f"trying it though {running} other thread(s) running: perhaps only the BLAS "
                                         "worker the busy engine's own last call left spinning")  # fmt: skip
        else:
            self._own = 0
        return self._took(True, f"{running} other thread(s) of this process running")

    def _took(self, busy: bool, why: str) -> bool:
        if busy:
            self.busy_calls += 1
        else:
            self.free_calls += 1
        if _log.isEnabledFor(logging.DEBUG):
            p = self.problem
            engine = self.busy_engine if busy else self.engine
            _log.debug("numpy matmul %dx%dx%d %s: engine %s: %s", p.m, p.n, p.k, p.result_dtype, engine, why)
        return busy

    def execute(self, operands, stream=None):
        if self._pick():
            out = self.busy.execute(operands, stream)
            self._busy_end = _clock()
            return out
        return self.free.execute(operands, stream)

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
