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

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

from ._adapters import adapter_for
from ._detect import detect
from ._plan_cache import plan_cache

__all__ = ["CopyingPlan", "keep_copying_plan"]


class CopyingPlan:
    """``plan`` run on operands of which those named ``names`` are replaced by copies of their values first (their
    adapter's view: ``detect(name, x).array``); the Plan protocol (``execute``, ``direct`` where ``plan`` has one,
    ``steps``, ``strategy``, ``problem``, ``release``). ``hold``: the caller's hold on ``plan``, closed when this
    one is released. ``arguments``: the names of the direct call's arguments, in order (a matmul's ``a``, ``b``,
    then its epilog's input; a transform's ``x``). ``on_stream(stream)``: a context making a ``stream=`` argument
    current, so that the copies are made where the plan then runs; None where streams do not apply.

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
        self.plan = plan
        self.problem = getattr(plan, "problem", None)
        self.strategy = plan.strategy
        self.steps = (f"copy the values of {', '.join(names)} (lazy views), at each call", *plan.steps)
        self._names = frozenset(names)
        self._on_stream = on_stream
        self._hold = hold
        direct = getattr(plan, "direct", None)
        if direct is None:
            self.direct = None
        else:
            self._direct_names = tuple(name if name in self._names else None for name in arguments)
            self._inner_direct = direct
            self.direct = self._direct

    def copy_operands(self, operands: dict[str, Any], stream: Any = None) -> dict[str, Any]:
        """``operands`` (by name) with those named replaced by copies of their values, made on ``stream`` (None:
        the current one)."""
        names, on = self._names, self._on_stream
        with contextlib.nullcontext() if stream is None or on is None else on(stream):
            return {name: (detect(name, x).array if name in names else x) for name, x in operands.items()}

    def execute(self, operands: dict[str, Any], stream: Any = None) -> Any:
        return self.plan.execute(self.copy_operands(operands, stream), stream)

    def _direct(self, *arrays: Any) -> Any:
        return self._inner_direct(
            *(x if name is None else detect(name, x).array for x, name in zip(arrays, self._direct_names, strict=True))
        )

    def release(self) -> None:
        """Let go of the copies' plan."""
        self._hold.close()

    def __repr__(self) -> str:
        return f"<CopyingPlan {', '.join(sorted(self._names))} of {self.plan!r}>"


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
