"""The one route every call takes: call key → plan cache → (on a miss) detect → select → plan → store
→ execute → wrap.

A *call key* is built from the operands' adapter signatures (dtype, shape, strides, device...), the
call's other arguments and the backend state keys; it is looked up first in the shared plan cache. On a
miss the full path runs: detection (:mod:`nvdispatch._adapters`), validation into a *problem*, executor
selection (:mod:`nvdispatch._backends`), strategy and plan (cached under the problem key), and the plan is
stored under the call key too, so the next identical call costs one lookup. Operation front-ends
(``linalg``, ``fft``) build their call keys and problems; nothing here knows what a matmul or an FFT is.

DEBUG logging on ``logging.getLogger("nvdispatch")`` says which executor, strategy and plan (cache hit or
miss) each call took.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import _backends
from . import _executor_contract as _contract
from ._adapters import (
    adapter_for,
    adapter_for_class,
    adapter_named,
    call_key_memo_by_class,
    precision_key_by_class,
    signature_by_class,
)
from ._call_key_memo import CallKeyMemo
from ._detect import Device, OperandInfo, common_placement, detect
from ._plan_cache import plan_cache
from ._precision import PrecisionConvention, autocast_targets
from .errors import InvalidArgumentError, MixedOperandsError, NoExecutorError, PlanStateError

__all__ = [
    "Selection",
    "detect_all",
    "placement",
    "select",
    "keep_or_select",
    "choose_strategy",
    "get_plan",
    "acquire_plan",
    "plan_key",
    "store",
    "signature_of",
    "signature_function",
    "refuse_recorded_call",
    "signature_by_class",
    "call_key_memo_by_class",
    "precision_key_by_class",
    "precision_convention",
    "autocast_operands",
    "debug_enabled",
    "log_hit",
    "wrap_result",
    "log",
    "Explanation",
]

log = logging.getLogger("nvdispatch")


# -- call keys -----------------------------------------------------------------------------------------------
def signature_of(cls: type):
    """The adapter-signature function for arrays of class ``cls``, or None (no adapter claims the class, its
    adapter has no signature, or it wraps results: those calls take the full path every time). Cached per
    class in ``signature_by_class``, which call-key builders read first; the class's call-key memo (where its
    adapter has a guard) is made alongside, in ``call_key_memo_by_class``."""
    ad = adapter_for_class(cls)
    sig = None if ad is None or ad.wraps else ad.signature_for(cls)
    guard = None if sig is None else ad.guard_for(cls)
    call_key_memo_by_class[cls] = None if guard is None else CallKeyMemo(guard)
    precision_key_by_class[cls] = None if sig is None else ad.precision_key
    signature_by_class[cls] = sig
    return sig


def precision_convention(x: Any, device: Device) -> PrecisionConvention | None:
    """The precision convention of operand ``x``'s framework for a matmul on ``device``, now (see
    :mod:`nvdispatch._precision`); None where it has none."""
    ad = adapter_for(x)
    return None if ad is None else ad.precision_convention(device)


def autocast_operands(
    infos: dict[str, OperandInfo], convention: PrecisionConvention | None, x: Any, stream: Any = None
) -> tuple[dict[str, OperandInfo], tuple[str, ...] | None]:
    """``infos`` with the operands ``convention``'s autocast region casts cast by operand ``x``'s adapter (on
    ``stream`` where one is given for a GPU call: where the product will read them), and their names; ``infos``
    as they are and None where no region applies."""
    if convention is None or convention.autocast is None:
        return infos, None
    targets = autocast_targets(convention.autocast, {name: info.dtype for name, info in infos.items()})
    if targets is None:
        return infos, None
    ad = adapter_for(x)
    device = infos["a"].device
    out = dict(infos)
    with ad.native_stream_context(stream if device.kind == "cuda" else None, device.index):
        for name, dtype in targets.items():
            out[name] = detect(name, ad.cast(infos[name].array, dtype))
    return out, tuple(targets)


def refuse_recorded_call(problem: Any) -> None:
    """For a call whose operand requires grad: raise :class:`PlanStateError` where a stateful object
    (``Matmul``, ``FFT``) planned ``problem`` for calls autograd does not record, and grad mode is on (autograd
    records this one): the plan's executor may drop the graph (raw cuBLASLt/cuFFT), or its direct call have no
    derivative."""
    if not problem.autograd and sys.modules["torch"].is_grad_enabled():
        raise PlanStateError(
            "execute",
            "grad mode as at plan(): the plan was made for calls autograd does not record",
            "a call autograd records (an operand requires grad and grad mode is on)",
            "call plan() again with grad mode on, or execute under torch.no_grad()",
        )


def signature_function(cls: type):
    """:func:`signature_of` ``cls``, read from ``signature_by_class`` where it is known already (the routes inline
    this on their hot paths)."""
    sig = signature_by_class.get(cls, signature_of)
    return signature_of(cls) if sig is signature_of else sig


#: logging's per-level cache of ``log``: ``.get(DEBUG) is False`` says "not logging" without a method call
_log_levels = getattr(log, "_cache", {})


def debug_enabled() -> bool:
    """Whether DEBUG records of ``log`` are emitted (cheap when they are not)."""
    return _log_levels.get(logging.DEBUG) is not False and log.isEnabledFor(logging.DEBUG)


def log_hit(op: str, plan) -> None:
    """The DEBUG record of a ``op`` call served from the plan cache by its call key."""
    log.debug("%s: plan cache hit (call key): plan %s, strategy %r", op, type(plan).__name__, plan.strategy)


def store(key: Hashable | None, plan) -> None:
    """Keep ``plan`` under call key ``key`` too (no-op without a key)."""
    if key is not None:
        try:
            plan_cache.put(key, plan)
        except TypeError:
            pass


def wrap_result(result, like):
    """``result`` as the type of the caller's operand ``like`` (only adapters with ``wraps`` change it)."""
    ad = adapter_for(like)
    if ad is None or not ad.wraps:
        return result
    if isinstance(result, tuple):
        out, aux = result
        return ad.wrap(out, like), {k: ad.wrap(v, like) for k, v in aux.items()}
    return ad.wrap(result, like)


def detect_all(named: Mapping[str, Any]) -> dict[str, OperandInfo]:
    """Detect every operand that is not None."""
    return {name: detect(name, x) for name, x in named.items() if x is not None}


def placement(infos: dict[str, OperandInfo]) -> tuple[str, Device]:
    """The operands' common framework and device; mixed ones are allowed only under a coercing backend."""
    for info in infos.values():
        # an adapter whose arrays hold other arrays' blocks (Dask) places calls that mix them
        place = getattr(adapter_named(info.framework), "placement", None)
        if place is not None:
            return place(infos)
    try:
        return common_placement(infos)
    except MixedOperandsError:
        if _backends.any_coercing():
            first = next(iter(infos.values()))
            return "mixed", first.device
        raise


@dataclass
class Selection:
    """The executor chosen for a problem, and why the others before it declined."""

    executor: Any
    coerce: bool
    declined: list[tuple[str, str]] = field(default_factory=list)


def select(op: str, problem: Any) -> Selection:
    """Ask each candidate executor in backend order; the first that does not decline runs the call."""
    declined: list[tuple[str, str]] = []
    requested: list[tuple[str, str]] = []
    for cand in _backends.candidates(problem.framework, problem.device.kind):
        reason = _contract.decline(cand.executor, op, problem, cand.coerce)
        if reason is None:
            for name, why in requested:  # set_backend("cuda") on a machine without a GPU, say
                log.info("%s: backend %r was asked for but declined (%s); executor %r runs it instead",
                         op, name, why, cand.executor.name)
            return Selection(cand.executor, cand.coerce, declined)
        declined.append((cand.executor.name, reason))
        if _backends.is_requested(cand.executor):
            requested.append(declined[-1])
    if declined:
        tried = "; ".join(f"{name}: {why}" for name, why in declined)
        hint = f"executors tried: {tried}"
    else:
        hint = "no executor is registered for these operands (check set_backend/skip_backend)"
    raise NoExecutorError(
        "backend",
        f"an executor able to run this {op}",
        f"{problem.framework} operands on {problem.device}",
        hint,
        declined=declined,
    )


def strategies_of(executor: Any, op: str, problem: Any) -> tuple[str, ...]:
    """The strategies ``executor`` can run ``problem`` with, best first (a user executor's answer checked)."""
    return _contract.strategies(executor, op, problem)


def keep_or_select(selection: Selection | None, op: str, problem: Any) -> Selection:
    """``selection``'s executor when it takes ``problem`` (a stateful object re-planning keeps the executor
    it was planned with, whatever backend state is active now), else a fresh :func:`select`."""
    if selection is not None:
        why = selection.executor.decline(op, problem, coerce=selection.coerce)
        if why is None:
            return selection
        log.debug("%s: executor %s declines the new operands (%s); selecting again", op, selection.executor.name, why)
    return select(op, problem)


def choose_strategy(executor: Any, op: str, problem: Any, preferred: str | None = None) -> str:
    """The epilog/plan strategy: the caller's preference, a loaded autotune choice, or the executor's best."""
    available = strategies_of(executor, op, problem)
    if preferred is not None:
        if preferred not in available:
            raise InvalidArgumentError(
                "preferences.strategy", f"one of {available} (what {executor.name} can run here)", repr(preferred)
            )
        return preferred
    if plan_cache.has_tunings():
        tuned = plan_cache.tuning_for(choice_key(executor, op, problem))
        if tuned and tuned.get("strategy") in available:
            return tuned["strategy"]
    return available[0]


def choice_key(executor: Any, op: str, problem: Any) -> tuple:
    return ("choice", op, executor.name, problem)


def plan_key(executor: Any, op: str, problem: Any, strategy: str) -> tuple:
    """The plan-cache key of (problem, executor, strategy). A user executor is told apart by identity too:
    two of them may share a name (a class re-defined in a notebook), never their plans."""
    who = executor.name if _contract.trusted(executor) else (executor.name, id(executor))
    return (op, who, strategy, problem)


def get_plan(executor: Any, op: str, problem: Any, strategy: str):
    """The cached plan for (problem, executor, strategy), planned on a miss (to look at, not to run)."""
    plan = acquire_plan(executor, op, problem, strategy)
    plan_cache.let_go(plan)
    return plan


def acquire_plan(executor: Any, op: str, problem: Any, strategy: str):
    """:func:`get_plan`, pinned for the caller until ``plan_cache.let_go(plan)`` (``_execute.run`` does it)."""
    key = plan_key(executor, op, problem, strategy)
    if not debug_enabled():
        return plan_cache.acquire_or_create(key, lambda tuning: _plan(executor, op, problem, strategy, tuning))
    made = []

    def factory(tuning):
        made.append(True)
        return _plan(executor, op, problem, strategy, tuning)

    plan = plan_cache.acquire_or_create(key, factory)
    log.debug(
        "%s: executor %r, strategy %r, plan %s (plan cache %s)",
        op,
        executor.name,
        strategy,
        type(plan).__name__,
        "miss: planned" if made else "hit",
    )
    return plan


def _plan(executor: Any, op: str, problem: Any, strategy: str, tuning: Any):
    from ._execute import raise_if_out_of_memory

    try:
        return _contract.plan(executor, op, problem, strategy, tuning)
    except Exception as exc:
        raise_if_out_of_memory(exc)
        raise


def explain_selected(name: str, op: str, problem: Any, sel: Selection, strategy: str | None = None) -> Explanation:
    """The :class:`Explanation` of a call already detected and selected (``sel``), without running it: its
    strategies, the chosen one (``strategy`` when the caller chose it already), and the plan's steps (the
    plan is made and cached, not run). ``name`` is the operation as the user called it."""
    strategies = strategies_of(sel.executor, op, problem)
    if strategy is None:
        strategy = choose_strategy(sel.executor, op, problem)
    cached = plan_cache.contains(plan_key(sel.executor, op, problem, strategy))
    plan = get_plan(sel.executor, op, problem, strategy)
    return Explanation(
        name,
        sel.executor.name,
        strategy,
        tuple(plan.steps),
        tuple(sel.declined),
        strategies,
        cached,
        problem,
        getattr(problem, "precision_note", None),
    )


def coerce_operands(selection: Selection, operands: dict[str, Any], names) -> dict[str, Any]:
    if not selection.coerce:
        return operands
    conv: Callable = selection.executor.coerce_operand
    return {k: (conv(v) if k in names and v is not None else v) for k, v in operands.items()}


@dataclass(frozen=True, repr=False)
class Explanation:
    """What a call would do: the executor and strategy chosen, the plan's steps, and who declined.

    ``str()`` and ``repr()`` (what the REPL shows) are the same readable report; the fields hold the details.
    """

    operation: str
    executor: str
    strategy: str
    steps: tuple[str, ...]
    declined: tuple[tuple[str, str], ...]
    strategies: tuple[str, ...]
    cached: bool
    problem: Any = None
    #: the compute type and what chose it (the caller, a framework's precision convention, the dtype), for matmuls
    precision: str | None = None

    def __str__(self) -> str:
        lines = [f"{self.operation} on executor {self.executor!r}, strategy {self.strategy!r}"]
        if self.precision is not None:
            lines.append(f"  precision: {self.precision}")
        lines += [f"  step: {s}" for s in self.steps]
        if len(self.strategies) > 1:
            lines.append(f"  other strategies: {', '.join(s for s in self.strategies if s != self.strategy)}")
        for name, why in self.declined:
            lines.append(f"  declined by {name}: {why}")
        lines.append(f"  plan cached: {self.cached}")
        return "\n".join(lines)

    __repr__ = __str__
