"""The executor protocol: what every executor (built-in or user-registered) provides.

An executor is a backend that can run operations ("matmul", "fft") for some frameworks and devices.
Dispatch talks to it in three phases, always with a *problem*: an immutable description of the call
(operand dtypes, shapes, strides, device, options...) that also yields the plan-cache key.

``decline(op, problem, coerce=...)``
    ``None`` when the executor takes the call, else a short reason (shown when nobody takes it).
``strategies(op, problem)``
    The ways it can run the call, best first (for matmul: the epilog fusion strategies, see ``_epilog``).
``plan(op, problem, strategy, tuning=None)``
    A :class:`Plan`: everything prepared once (handles, descriptors, workspaces, chosen algorithm).

Plans live in the shared plan cache and are executed many times, each time with the actual operands and
the caller's stream: ``plan.execute(operands, stream)``. GPU executors own streams, devices and
allocation through the same calls; CPU executors ignore the stream.

The built-in executors keep each operation in its own module, ``executors/<executor>_<op>.py``, which
exposes ``decline(problem)``, ``strategies(problem)`` and ``plan(problem, strategy, tuning)``; adding an
operation to an executor is adding one such file.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

__all__ = ["Executor", "Plan", "ModularExecutor"]


@runtime_checkable
class Plan(Protocol):
    """A prepared operation. ``steps`` describe what it does, for ``explain()``.

    ``execute(operands, stream)`` runs it for any call whose call key or problem maps to this plan;
    everything that does not vary per call is bound when the plan is made.

    ``direct`` (optional; None or absent when the plan has none) is a callable the route uses instead of
    ``execute`` when every per-call value other than the arrays is at its default (``alpha`` 1, no ``c``,
    the current stream): ``direct(a, b, *epilog_input_arrays)`` for matmul (epilog inputs in the order the
    caller gave them), ``direct(x)`` for fft. It must return exactly what ``execute`` would.
    """

    strategy: str
    steps: tuple[str, ...]

    def execute(self, operands: Mapping[str, Any], stream: Any = None) -> Any: ...

    def release(self) -> None: ...


class Executor(ABC):
    """Base class of executors. Subclass it (or duck-type the same methods) to register your own."""

    #: the name used by ``set_backend("name")`` and shown by ``explain()``
    name: str = "executor"

    @abstractmethod
    def decline(self, op: str, problem: Any, *, coerce: bool = False) -> str | None:
        """Return ``None`` to take the call, or why not."""

    @abstractmethod
    def strategies(self, op: str, problem: Any) -> tuple[str, ...]:
        """The strategies this executor can run ``problem`` with, best first."""

    @abstractmethod
    def plan(self, op: str, problem: Any, strategy: str, tuning: Any = None) -> Plan:
        """Prepare ``problem`` with ``strategy``; ``tuning`` is a saved autotune choice, if any."""

    def coerce_operand(self, array: Any) -> Any:
        """Convert a foreign operand into this executor's framework (used only under ``coerce=True``)."""
        raise NotImplementedError(f"executor {self.name!r} cannot coerce operands")

    def __repr__(self) -> str:
        return f"<nvdispatch executor {self.name!r}>"


class ModularExecutor(Executor):
    """An executor whose operations live in sibling modules ``executors/<name>_<op>.py``.

    Subclasses say which frameworks and device kinds they own; each operation module decides the rest.
    """

    #: frameworks whose arrays this executor runs natively
    frameworks: frozenset[str] = frozenset()
    #: device kinds ("cpu", "cuda") it runs on
    device_kinds: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self._op_modules: dict[str, Any] = {}

    def unavailable(self) -> str | None:
        """Why this executor cannot run at all here (library missing, no device), or None."""
        return None

    def op_module(self, op: str):
        mod = self._op_modules.get(op)
        if mod is None:
            try:
                mod = importlib.import_module(f"nvdispatch.executors.{self.name}_{op}")
            except ModuleNotFoundError as exc:
                if exc.name != f"nvdispatch.executors.{self.name}_{op}":
                    raise
                mod = False
            self._op_modules[op] = mod
        return mod or None

    def decline(self, op: str, problem: Any, *, coerce: bool = False) -> str | None:
        reason = self.unavailable()
        if reason:
            return reason
        mod = self.op_module(op)
        if mod is None:
            return f"{self.name} does not implement {op}"
        if not coerce:
            if problem.framework not in self.frameworks:
                return f"{self.name} does not take {problem.framework} arrays"
            if problem.device.kind not in self.device_kinds:
                return f"{self.name} does not run on {problem.device}"
        return mod.decline(problem)

    def strategies(self, op: str, problem: Any) -> tuple[str, ...]:
        return tuple(self.op_module(op).strategies(problem))

    def plan(self, op: str, problem: Any, strategy: str, tuning: Any = None) -> Plan:
        return self.op_module(op).plan(problem, strategy, tuning)
