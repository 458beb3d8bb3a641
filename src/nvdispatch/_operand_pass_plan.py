"""A plan run on operands that pass through a step of their own first: the shape shared by the plans a call key
leads to when its operands are not what the plan was made on as they come (cast by an autocast region:
:class:`~nvdispatch._autocast_plan.AutocastPlan`; lazy views copied: :class:`~nvdispatch._copying_plan.CopyingPlan`).

Such a plan keeps a hold on the plan it runs (a :class:`~nvdispatch._plan_cache.PlanHold`) until it is released
itself, so that plan's eviction from its own key cannot release it under a call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["OperandPassPlan"]


class OperandPassPlan:
    """``plan`` run on operands of which those named ``names`` are replaced by ``prepare(name, x)`` first; the Plan
    protocol (``execute``, ``direct`` where ``plan`` has one, ``steps``, ``strategy``, ``problem``, ``release``).
    ``hold``: the caller's hold on ``plan`` (``plan_cache.hold(plan)``), closed when this one is released.
    ``arguments``: the names of the direct call's arguments, in order (a matmul's ``a``, ``b``, then its epilog's
    input; a transform's ``x``). ``step``: what the pass does, in words (the first of ``steps``).
    ``on_stream(stream)``: a context making a ``stream=`` argument current, so that the pass is queued (and its
    results allocated) where the plan then runs; None where streams do not apply (the CPU).

    Examples
    --------
    >>> import numpy as np
    >>> class Hold:
    ...     def close(self): print("released")
    >>> class Plan:
    ...     strategy, steps = "plain", ("matmul",)
    ...     def execute(self, operands, stream=None): return operands["a"] @ operands["b"]
    >>> p = OperandPassPlan(Plan(), Hold(), ["a"], ("a", "b"), lambda name, x: 2 * x, "a doubled")
    >>> p.steps
    ('a doubled', 'matmul')
    >>> p.execute({"a": np.eye(2), "b": np.ones((2, 2))})[0, 0]
    np.float64(2.0)
    >>> p.release()
    released
    """

    def __init__(
        self,
        plan: Any,
        hold: Any,
        names: Iterable[str],
        arguments: tuple[str, ...],
        prepare: Callable[[str, Any], Any],
        step: str,
        on_stream: Callable[[Any], Any] | None = None,
    ):
        self.plan = plan
        self.problem = getattr(plan, "problem", None)
        self.strategy = plan.strategy
        self.steps = (step, *plan.steps)
        self._names = frozenset(names)
        self._prepare = prepare
        self._on_stream = on_stream
        self._hold = hold
        direct = getattr(plan, "direct", None)
        if direct is None:
            self.direct = None
        else:
            self._direct_names = tuple(name if name in self._names else None for name in arguments)
            self._inner_direct = direct
            self.direct = self._direct

    def prepare_operands(self, operands: dict[str, Any], stream: Any = None) -> dict[str, Any]:
        """``operands`` (by name) with those named passed, on ``stream`` (None: the current one)."""
        prepare, names, on = self._prepare, self._names, self._on_stream
        with contextlib.nullcontext() if stream is None or on is None else on(stream):
            return {name: (prepare(name, x) if name in names else x) for name, x in operands.items()}

    def execute(self, operands: dict[str, Any], stream: Any = None) -> Any:
        return self.plan.execute(self.prepare_operands(operands, stream), stream)

    def _direct(self, *arrays: Any) -> Any:
        prepare = self._prepare
        return self._inner_direct(
            *(x if name is None else prepare(name, x) for x, name in zip(arrays, self._direct_names, strict=True))
        )

    def release(self) -> None:
        """Let go of the plan run."""
        self._hold.close()
