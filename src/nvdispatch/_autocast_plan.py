"""The plan a call runs under an autocast region: its operands cast first, then the plan of the cast problem.

Inside an autocast region (see :mod:`nvdispatch._precision`) a call's problem is that of its operands cast
(float32 tensors become bfloat16 ones, say), and so is its plan. The call's key holds the operands as the caller
gave them and the region, so it leads here: an :class:`AutocastPlan` casts the same operands of every call with
that key and runs the cast problem's plan. A stateful ``Matmul`` planned in a region holds one too. It keeps a
hold on that plan (a :class:`~nvdispatch._plan_cache.PlanHold`) until it is released itself, so the plan's
eviction from its own key cannot release it under a call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ._operand_pass_plan import OperandPassPlan

__all__ = ["AutocastPlan"]


class AutocastPlan(OperandPassPlan):
    """``plan`` run on operands of which those named ``names`` are cast to ``dtype`` by ``cast(x, dtype)`` first;
    see :class:`~nvdispatch._operand_pass_plan.OperandPassPlan` for ``hold`` and ``on_stream`` (here: the casts
    are queued, and their results allocated, where the plan then runs)."""

    def __init__(
        self,
        plan: Any,
        hold: Any,
        names: Iterable[str],
        dtype: str,
        cast: Callable[[Any, str], Any],
        on_stream: Callable[[Any], Any] | None = None,
    ):
        names = tuple(names)
        problem = getattr(plan, "problem", None)
        # the direct call's arguments: a, b, then the epilog's input (an epilog takes at most one)
        arguments = ("a", "b", *(() if problem is None else problem.epilog.inputs))
        step = f"autocast: {', '.join(names)} cast to {dtype} first"
        super().__init__(plan, hold, names, arguments, lambda _name, x: cast(x, dtype), step, on_stream)
        self._dtype = dtype

    def __repr__(self) -> str:
        return f"<AutocastPlan {', '.join(sorted(self._names))} -> {self._dtype} of {self.plan!r}>"
