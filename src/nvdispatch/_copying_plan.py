"""The plan a repeated call on lazy views runs where its executor takes copies of their values: the copies made
anew, then the plan made for them.

A Torch CUDA conjugate view (``x.mH``) that the executor chosen does not fold into its plan (the Torch executor, a
reducing epilog) reaches it as a copy of its values (``OperandInfo.materialized``), made by its adapter at each
call: the view's values may have changed since. Its call key (whose signatures name the conjugation) leads here, so
a repeated call costs that copy and no detection, selection or plan lookup: a :class:`CopyingPlan` makes the copies
of the same operands of every call with that key (their adapter's view, as detection makes it) and runs the plan
of the copies' problem, on which it keeps a hold (a :class:`~nvdispatch._plan_cache.PlanHold`) until it is
released itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ._adapters import adapter_for
from ._detect import detect
from ._operand_pass_plan import OperandPassPlan
from ._plan_cache import plan_cache

__all__ = ["CopyingPlan", "keep_copying_plan"]


class CopyingPlan(OperandPassPlan):
    """``plan`` run on operands of which those named ``names`` are replaced by copies of their values first (their
    adapter's view: ``detect(name, x).array``); see :class:`~nvdispatch._operand_pass_plan.OperandPassPlan` for
    ``hold``, ``arguments`` and ``on_stream`` (here: the copies are made where the plan then runs).

    Examples
    --------
    >>> import numpy as np
    >>> class Hold:
    ...     def close(self): print("released")
    >>> class Plan:
    ...     strategy, steps = "plain", ("matmul",)
    ...     def execute(self, operands, stream=None): return operands["a"] @ operands["b"]
    >>> p = CopyingPlan(Plan(), Hold(), ["a"], ("a", "b"))
    >>> p.execute({"a": np.eye(2), "b": np.ones((2, 2))})[0, 0]
    np.float64(1.0)
    >>> p.release()
    released
    """

    def __init__(
        self,
        plan: Any,
        hold: Any,
        names: Iterable[str],
        arguments: tuple[str, ...],
        on_stream: Callable[[Any], Any] | None = None,
    ):
        names = tuple(names)
        step = f"copy the values of {', '.join(names)} (lazy views), at each call"
        super().__init__(plan, hold, names, arguments, _copy, step, on_stream)

    def __repr__(self) -> str:
        return f"<CopyingPlan {', '.join(sorted(self._names))} of {self.plan!r}>"


def _copy(name: str, x: Any) -> Any:
    return detect(name, x).array


def keep_copying_plan(
    plan: Any, names: tuple[str, ...], arguments: tuple[str, ...], call_key: Any, key: Any, like: Any, device: Any
) -> None:
    """Keep under ``call_key`` the :class:`CopyingPlan` of ``plan`` (made on copies of the values of the operands
    ``names``, by ``like``'s adapter; on a call's ``stream=`` where ``device`` is a GPU), cached as ``key`` beside
    ``plan``. ``arguments``: the direct call's argument names, in order."""
    ad = adapter_for(like)

    def make(_tuning):
        on_stream = None
        if device.kind == "cuda":
            on_stream = lambda stream: ad.native_stream_context(stream, device.index)  # noqa: E731
        return CopyingPlan(plan, plan_cache.hold(plan), names, arguments, on_stream)

    plan_cache.let_go(plan_cache.acquire_or_create(key, make, alias=call_key))
