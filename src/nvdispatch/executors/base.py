"""The executor protocol: what every executor (built-in or user-registered) provides, receives and returns.

An executor is a backend that can run operations (``"matmul"``, ``"fft"``) for some frameworks and devices.
The core talks to it in three phases, always with a *problem*: an immutable, hashable description of the
call that is also the plan-cache key (with the executor's ``name`` and the strategy).

``name`` : str
    What ``set_backend("name")`` selects and ``explain()`` shows (plans are cached per executor object;
    saved autotune choices per name).
``decline(op, problem, *, coerce=False) -> str | None``
    ``None`` to take the call, else a short reason (listed by ``NoExecutorError`` when nobody takes it).
    ``coerce`` is True when a ``set_backend(..., coerce=True)`` lets it take other frameworks' operands
    (it then receives them converted by ``coerce_operand``).
``strategies(op, problem) -> tuple[str, ...]``
    The ways it can run a call it took, best first; at least one (names are free; the built-ins use
    ``"native"``, ``"framework_fused"``, ``"inplace"``, ``"plain"``). ``preferences={"strategy": ...}`` and
    ``Matmul.autotune`` choose among them.
``plan(op, problem, strategy, tuning=None) -> Plan``
    Everything prepared once (handles, descriptors, workspaces, chosen algorithm): an object with
    ``execute(operands, stream)`` and optionally ``steps`` (for ``explain``), ``strategy``, ``release()``,
    ``tuning()`` (a JSON-able autotune choice) and ``direct`` (see :class:`Plan`). ``tuning`` is a choice
    saved by ``plan_cache.save``, if any.
``fused_epilogs`` : ``"all"`` or a set of epilog names (default: none)
    The matmul epilogs its plans apply themselves. For any other epilog the core asks the executor about
    the same matmul *without* the epilog (``problem.epilog`` is ``DEFAULT``, no epilog inputs) and applies
    the epilog's steps to its result itself, with the array operations of its memory kind (NumPy's, Torch's or
    CuPy's; for other kinds such a call is declined). An executor that lists an epilog must return
    exactly what the built-ins return for it.

**What a problem carries.** Matmul (``nvdispatch._matmul_problem.MatmulProblem``): ``framework`` (the
caller's, for messages), ``memory`` (the memory kinds every operand is handed over as: ``"host"``,
``"cuda"``, ``"torch.Tensor"``..., see :mod:`nvdispatch._memory`), ``device`` (``kind``, ``index``),
``a``/``b``/``c`` (``ArraySig``: ``dtype``, ``shape``, ``strides``; ``c`` None when absent), ``result_dtype``,
``result_shape``, ``m``, ``n``, ``k``, ``batch_shape``,
``promoted_shape``, ``a_vector``/``b_vector`` (1-D operands promoted as in PEP 465), ``epilog`` (its table
row: ``epilog.epilog`` the ``Epilog``, ``inputs``, ``outputs``, ``steps``), ``inputs`` (the epilog inputs'
signatures), ``bias_axis``, ``options`` (``MatmulOptions``), ``autograd``. FFT
(``nvdispatch._fft_problem.FFTProblem``): ``framework``, ``device``, ``func`` (``"fft"``, ``"rfftn"``...),
``kind`` (``"c2c"``/``"r2c"``/``"c2r"``), ``direction``, ``dtype``, ``result_dtype``, ``shape``, ``axes``,
``lengths``, ``norm``, ``out_shape``, ``memory``.

**What ``execute`` receives.** ``operands``, a mapping: for matmul ``"a"``, ``"b"``, ``"alpha"``, ``"beta"``
(None when not given), ``"c"`` when given, and each epilog input by name (``"bias"``, ``"relu_aux"``,
``"gelu_aux"``) the executor fuses; for fft ``"x"``. Arrays come as the views their adapters hand out
(``OperandInfo.array``: a NumPy array for host memory, the framework's own array for its own kind).
``stream``: the caller's stream (None: the current one; CPU executors ignore it).

**What ``execute`` returns.** An array of the memory kind it received (under ``coerce``: the executor's own),
of ``problem.result_shape`` (fft: ``problem.out_shape``) and ``problem.result_dtype``; for an epilog with
outputs, ``(result, aux)`` with ``aux`` a dict holding exactly the epilog's output names. Inputs are never
modified. The route hands the result to the operands' adapter, which returns it as the caller's type.

**Checked at the boundary.** For executors other than nvdispatch's own, the core checks every answer
(:mod:`nvdispatch._executor_contract`): a ``decline`` that cannot take ``coerce`` or returns something other
than a string or None, no strategies, a ``plan`` without ``execute``, a result of the wrong type, shape or
dtype, or the wrong aux keys raise :class:`~nvdispatch.errors.ExecutorContractError` naming the executor
and the method.

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

    ``needs_release`` (optional, default True): False declares that ``release`` frees nothing, so a call may
    run the plan without pinning it in the plan cache (a cheaper hot path); the plan must then stay usable
    after ``release``.

    ``any_length(lengths_given)`` (optional; nvdispatch's own executors): a plan that runs every extent of its
    problem's operand (same dtype and rank; each extent >= 2) exactly as the plan of that extent would, or None
    where none does (the executor takes every such extent with the same strategy). ``lengths_given``: the calls
    give the transform's length (``n``/``s``), else it is the operand's. The route keeps it under the call's
    any-length key (:func:`nvdispatch._call_key.any_length_key`): a new extent then costs no planning.
    """

    strategy: str
    steps: tuple[str, ...]

    def execute(self, operands: Mapping[str, Any], stream: Any = None) -> Any: ...

    def release(self) -> None: ...


class Executor(ABC):
    """Base class of executors. Subclass it (or duck-type the same methods) to register your own."""

    #: the name used by ``set_backend("name")`` and shown by ``explain()``
    name: str = "executor"
    #: the matmul epilogs its plans apply themselves ("all", or a set of names); the core applies the others
    fused_epilogs: str | frozenset[str] = frozenset()

    @abstractmethod
    def decline(self, op: str, problem: Any, *, coerce: bool = False) -> str | None:
        """Return ``None`` to take the call, or why not."""

    @abstractmethod
    def strategies(self, op: str, problem: Any) -> tuple[str, ...]:
        """The strategies this executor can run ``problem`` with, best first."""

    @abstractmethod
    def plan(self, op: str, problem: Any, strategy: str, tuning: Any = None) -> Plan:
        """Prepare ``problem`` with ``strategy``; ``tuning`` is a saved autotune choice, if any."""

    def folds_conjugates(self, op: str, problem: Any, strategy: str) -> bool:
        """Whether ``strategy``'s plans of ``problem`` read its operands marked ``conj`` (``ArraySig.conj``: memory
        holding the conjugates of their values) conjugating them. False (the default): the route hands this
        executor copies of their values instead, and such marks never reach it."""
        return False

    def coerce_operand(self, array: Any) -> Any:
        """Convert a foreign operand into this executor's framework (used only under ``coerce=True``)."""
        raise NotImplementedError(f"executor {self.name!r} cannot coerce operands")

    def __repr__(self) -> str:
        return f"<nvdispatch executor {self.name!r}>"


class ModularExecutor(Executor):
    """An executor whose operations live in sibling modules ``executors/<name>_<op>.py``.

    Subclasses say which memory kinds and device kinds they take; each operation module decides the rest.
    """

    #: the memory kinds of operand views it runs on (``nvdispatch._memory``: ``HOST``, ``CUDA``...)
    memory: frozenset[str] = frozenset()
    #: device kinds ("cpu", "cuda") it runs on
    device_kinds: frozenset[str] = frozenset()
    fused_epilogs = "all"

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
            if not self.memory & problem.memory:
                kinds = ", ".join(sorted(problem.memory)) or "none"
                return (
                    f"{self.name} takes {' or '.join(sorted(self.memory))} memory; these {problem.framework} "
                    f"arrays are handed over as {kinds}"
                )
            if problem.device.kind not in self.device_kinds:
                return f"{self.name} does not run on {problem.device}"
        return mod.decline(problem)

    def strategies(self, op: str, problem: Any) -> tuple[str, ...]:
        return tuple(self.op_module(op).strategies(problem))

    def folds_conjugates(self, op: str, problem: Any, strategy: str) -> bool:
        folds = getattr(self.op_module(op), "folds_conjugates", None)
        return folds is not None and bool(folds(problem, strategy))

    def plan(self, op: str, problem: Any, strategy: str, tuning: Any = None) -> Plan:
        return self.op_module(op).plan(problem, strategy, tuning)
