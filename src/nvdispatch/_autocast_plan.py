"""The plan a call runs under an autocast region: its operands cast first, then the plan of the cast problem.

Inside an autocast region (see :mod:`nvdispatch._precision`) a call's problem is that of its operands cast
(float32 tensors become bfloat16 ones, say), and so is its plan. The call's key holds the operands as the caller
gave them and the region, so it leads here: an :class:`AutocastPlan` casts the same operands of every call with
that key and runs the cast problem's plan. A stateful ``Matmul`` planned in a region holds one too. It keeps a
hold on that plan (a :class:`~nvdispatch._plan_cache.PlanHold`) until it is released itself, so the plan's
eviction from its own key cannot release it under a call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["AutocastPlan"]


class AutocastPlan:
    """``plan`` run on operands of which those named ``names`` are cast to ``dtype`` by ``cast(x, dtype)`` first
    (the Plan protocol: ``execute``, ``direct`` where ``plan`` has one, ``steps``, ``strategy``, ``release``).
    ``hold``: the caller's hold on ``plan`` (``plan_cache.hold(plan)``), closed when this one is released.
    ``on_stream(stream)``: a context making a ``stream=`` argument current, so that the casts are queued (and
    their results allocated) where the plan then runs; None where streams do not apply (the CPU)."""

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
        self.plan = plan
        self.problem = getattr(plan, "problem", None)
        self.strategy = plan.strategy
        self.steps = (f"autocast: {', '.join(names)} cast to {dtype} first", *plan.steps)
        self._names = frozenset(names)
        self._dtype = dtype
        self._cast = cast
        self._on_stream = on_stream
        self._hold = hold
        direct = getattr(plan, "direct", None)
        if direct is None:
            self.direct = None
        else:
            # the direct call's arguments: a, b, then the epilog's input (an epilog takes at most one)
            inputs = () if self.problem is None else tuple(self.problem.epilog.inputs)
            self._direct_cast = tuple(name in self._names for name in ("a", "b", *inputs))
            self._inner_direct = direct
            self.direct = self._direct

    def cast_operands(self, operands: dict[str, Any], stream: Any = None) -> dict[str, Any]:
        """``operands`` (by name) with those the region casts cast, on ``stream`` (None: the current one)."""
        cast, dtype, names = self._cast, self._dtype, self._names
        on = self._on_stream
        with contextlib.nullcontext() if stream is None or on is None else on(stream):
            return {name: (cast(x, dtype) if name in names else x) for name, x in operands.items()}

    def execute(self, operands: dict[str, Any], stream: Any = None) -> Any:
        return self.plan.execute(self.cast_operands(operands, stream), stream)

    def _direct(self, *arrays: Any) -> Any:
        cast, dtype = self._cast, self._dtype
        return self._inner_direct(
            *(cast(x, dtype) if flag else x for x, flag in zip(arrays, self._direct_cast, strict=True))
        )

    def release(self) -> None:
        """Let go of the cast problem's plan."""
        self._hold.close()

    def __repr__(self) -> str:
        return f"<AutocastPlan {', '.join(sorted(self._names))} -> {self._dtype} of {self.plan!r}>"
