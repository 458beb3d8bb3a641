"""A poisoning executor for plan-lifetime tests: the NumPy executor's results, but a plan that was released
raises (and records the violation) when executed or its steps read, so "released while still in use" fails loudly."""

from __future__ import annotations

import threading

from nvdispatch.executors import builtin
from nvdispatch.executors.base import Executor

#: every execution of a released plan seen by any PoisonedPlan (a test asserts it stays empty)
VIOLATIONS: list[str] = []


class PlanUsedAfterRelease(AssertionError):
    pass


class PoisonedPlan:
    """Wraps a real plan; ``release()`` poisons it. ``workspace_bytes`` is what the test says."""

    def __init__(self, inner, nbytes: int = 0, gate: threading.Event | None = None):
        self.inner = inner
        self.strategy = inner.strategy
        self.problem = inner.problem
        self.workspace_bytes = nbytes
        self.released = 0
        self.executions = 0
        self.gate = gate  # when set, execute waits on it (to hold a call in flight)
        self.started = threading.Event()

    def execute(self, operands, stream=None):
        self._check()
        self.started.set()
        if self.gate is not None:
            assert self.gate.wait(10), "the test never opened the gate"
        self._check()  # released while this call ran?
        self.executions += 1
        return self.inner.execute(operands, stream)

    @property
    def steps(self):
        self._check()  # read from a plan released meanwhile (explain() not holding it, say)?
        return self.inner.steps

    def _check(self):
        if self.released:
            VIOLATIONS.append(repr(self.problem)[:80])
            raise PlanUsedAfterRelease(f"a released plan was used ({self.problem!r:.80})")

    def release(self):
        self.released += 1
        self.inner.release()


class PoisoningExecutor(Executor):
    """The NumPy executor's plans wrapped in :class:`PoisonedPlan` (every plan it made is in ``plans``)."""

    name = "poisoning"

    def __init__(self, nbytes: int = 0, gate: threading.Event | None = None):
        self.inner = builtin("numpy")
        self.nbytes = nbytes
        self.gate = gate
        self.plans: list[PoisonedPlan] = []
        self._lock = threading.Lock()

    def decline(self, op, problem, *, coerce=False):
        return self.inner.decline(op, problem, coerce=coerce)

    def strategies(self, op, problem):
        return self.inner.strategies(op, problem)

    def plan(self, op, problem, strategy, tuning=None):
        plan = PoisonedPlan(self.inner.plan(op, problem, strategy, tuning), self.nbytes, self.gate)
        with self._lock:
            self.plans.append(plan)
        return plan
