"""The one route every call takes: detect → key → select → plan (cached) → execute → wrap.

* **detect**: each operand's adapter (looked up once per class) describes it (:class:`OperandInfo`): the view of
  its memory executors receive, its memory kinds, framework, device, dtype, shape, strides;
* **key**: :mod:`nvdispatch._call_key` builds the call key, which the plan cache is asked first;
* **select**: the backend state (:mod:`nvdispatch._backends`, in its one order) names the executors to ask; the
  first that accepts the operands' memory kinds and does not decline the problem runs the call;
* **plan**: the executor's strategy is chosen once (the caller's preference, a loaded autotune choice, or the
  executor's best) and the plan made once per problem, strategy and executor, in the one shared plan cache,
  entered once per miss (the plan is kept under the call key in the same step);
* **execute** and **wrap**: :func:`nvdispatch._execute.run` runs the plan on the views and hands the result to
  the operand's adapter, which returns it as the caller's type on the caller's device.

Operation front-ends (``linalg``, ``fft``) validate their arguments into *problems* and call these steps; a
stateless call is its stateful object's path (``Matmul``, ``FFT``) with a cached plan. Nothing here knows what
a matmul or an FFT is, nor any framework.

DEBUG logging on ``logging.getLogger("nvdispatch")`` says which executor, strategy and plan (cache hit or miss)
each call took.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import _backends
from . import _executor_contract as _contract
from ._adapters import adapter_for, adapter_named, call_key_classes
from ._detect import Device, OperandInfo, common_placement, detect
from ._execute import raise_if_out_of_memory, run
from ._plan_cache import plan_cache
from ._traced import compiled_note
from .errors import InvalidArgumentError, MixedOperandsError, NoExecutorError, PlanStateError

__all__ = [
    "FrontParts",
    "Selection",
    "Explanation",
    "detect_all",
    "placement",
    "check_stream",
    "refuse_recorded_call",
    "select",
    "keep_or_select",
    "strategies_of",
    "choose_strategy",
    "choice_key",
    "plan_key",
    "acquire_plan",
    "keep_any_length",
    "get_plan",
    "coerce_operands",
    "run_uncached",
    "explain_selected",
    "debug_enabled",
    "log_hit",
    "log_levels",
    "log",
]

log = logging.getLogger("nvdispatch")

#: logging's per-level cache of ``log``: ``.get(DEBUG) is False`` says "not logging" without a method call
log_levels = getattr(log, "_cache", {})


def debug_enabled() -> bool:
    """Whether DEBUG records of ``log`` are emitted (cheap when they are not)."""
    return log_levels.get(logging.DEBUG) is not False and log.isEnabledFor(logging.DEBUG)


def log_hit(op: str, plan, key: str = "call key") -> None:
    """The DEBUG record of an ``op`` call served from the plan cache by its ``key`` (when DEBUG is on)."""
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s: plan cache hit (%s): plan %s, strategy %r", op, key, type(plan).__name__, plan.strategy)


# -- detect ------------------------------------------------------------------------------------------------------
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


def check_stream(stream: Any, x: Any) -> None:
    """A typed error naming ``stream`` unless it is a stream the framework of operand ``x`` runs on (its
    adapter's ``check_stream``); None always passes."""
    if stream is not None:
        ad = adapter_for(x)
        if ad is not None:
            ad.check_stream(stream, x)


def refuse_recorded_call(problem: Any, arrays) -> None:
    """For a stateful object's plan made for calls autograd does not record (``problem.autograd`` false): raise
    :class:`PlanStateError` when autograd records this call on ``arrays`` (an operand requires grad and grad
    mode is on, as its adapter's ``info`` says): the plan's executor may drop the graph (raw cuBLASLt/cuFFT), or
    its direct call have no derivative."""
    if problem.autograd:
        return
    for name, x in arrays.items():
        if x is not None and getattr(x, "requires_grad", False) is True and detect(name, x).autograd:
            raise PlanStateError(
                "execute",
                "grad mode as at plan(): the plan was made for calls autograd does not record",
                "a call autograd records (an operand requires grad and grad mode is on)",
                "call plan() again with grad mode on, or execute under torch.no_grad()",
            )


# -- select ------------------------------------------------------------------------------------------------------
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
                log.info(
                    "%s: backend %r was asked for but declined (%s); executor %r runs it instead",
                    op,
                    name,
                    why,
                    cand.executor.name,
                )
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


def keep_or_select(selection: Selection | None, op: str, problem: Any) -> Selection:
    """``selection``'s executor when it takes ``problem`` (a stateful object re-planning keeps the executor
    it was planned with, whatever backend state is active now), else a fresh :func:`select`."""
    if selection is not None:
        why = _contract.decline(selection.executor, op, problem, selection.coerce)
        if why is None:
            return selection
        log.debug("%s: executor %s declines the new operands (%s); selecting again", op, selection.executor.name, why)
    return select(op, problem)


# -- plan --------------------------------------------------------------------------------------------------------
def strategies_of(executor: Any, op: str, problem: Any) -> tuple[str, ...]:
    """The strategies ``executor`` can run ``problem`` with, best first (a user executor's answer checked)."""
    return _contract.strategies(executor, op, problem)


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


def acquire_plan(executor: Any, op: str, problem: Any, strategy: str, call_key: Hashable | None = None):
    """The cached plan for (problem, executor, strategy), planned on a miss, pinned for the caller until
    ``plan_cache.let_go(plan)`` (the run step does it). ``call_key``: keep the plan under that key too, in the
    same step (a call's key, when every call with it validates and selects the same way)."""
    key = plan_key(executor, op, problem, strategy)
    if not debug_enabled():
        return plan_cache.acquire_or_create(
            key, lambda tuning: _plan(executor, op, problem, strategy, tuning), alias=call_key
        )
    made = []

    def factory(tuning):
        made.append(True)
        return _plan(executor, op, problem, strategy, tuning)

    plan = plan_cache.acquire_or_create(key, factory, alias=call_key)
    log.debug(
        "%s: executor %r, strategy %r, plan %s (plan cache %s)",
        op,
        executor.name,
        strategy,
        type(plan).__name__,
        "miss: planned" if made else "hit",
    )
    return plan


def keep_any_length(plan: Any, sel: Selection, op: str, key: Hashable, lengths_given: bool) -> None:
    """Keep ``plan``'s any-length form under ``key`` (an any-length key, :func:`nvdispatch._call_key.any_length_key`)
    unless a plan is cached there: the plan its ``any_length(lengths_given)`` returns (the Plan protocol's, where a
    plan has it and gives one), which runs every operand extent the key covers, of the transform length the calls
    give (``lengths_given``) or of the operand's. Kept only where the executor was the first the backend state
    asks (it declined nothing before it: other extents select it again, as it takes every extent where it offers
    such a plan) and no tuned choice of ``op`` is known (per-problem choices must be read; a tuned choice of
    another operation, a GEMM's say, concerns none of the extents)."""
    if sel.declined or plan_cache.has_tunings(op) or plan_cache.contains(key):
        return
    make = getattr(plan, "any_length", None)
    general = make(lengths_given) if make is not None and _contract.trusted(sel.executor) else None
    if general is not None:
        plan_cache.put(key, general)
        log.debug("plan %s kept for every length (any-length key)", type(general).__name__)


def get_plan(executor: Any, op: str, problem: Any, strategy: str):
    """The cached plan for (problem, executor, strategy), planned on a miss, not held: one over the cache's
    bounds is released already (to read a plan's state, hold it: :func:`acquire_plan` ... ``let_go``)."""
    plan = acquire_plan(executor, op, problem, strategy)
    plan_cache.let_go(plan)
    return plan


def _plan(executor: Any, op: str, problem: Any, strategy: str, tuning: Any):
    try:
        return _contract.plan(executor, op, problem, strategy, tuning)
    except Exception as exc:
        raise_if_out_of_memory(exc)
        raise


def coerce_operands(selection: Selection, operands: dict[str, Any], names) -> dict[str, Any]:
    """Under a coercing backend, ``operands`` named in ``names`` converted by the executor; else as they are."""
    if not selection.coerce:
        return operands
    conv: Callable = selection.executor.coerce_operand
    return {k: (conv(v) if k in names and v is not None else v) for k, v in operands.items()}


#: (op, problem, backend state) -> (selection, strategy) of the operations without a call key: a repeated
#: problem skips asking every executor and strategy again (bounded: cleared when full)
_SELECTED: dict[Hashable, tuple[Selection, str]] = {}
_SELECTED_MAX = 512


def run_uncached(op: str, problem: Any, operands: dict[str, Any], stream: Any, coerce: Callable, like: Any) -> Any:
    """select → plan (cached by problem) → ``coerce(selection, operands)`` → execute → wrap (for the caller whose
    operand is ``like``): the route of an operation whose calls have no call key (``fft_convolve``). The
    selection and strategy of a problem are kept per backend state (:data:`_SELECTED`)."""
    reg = _backends.registry
    memo_key = (op, problem, reg.current_state().key, reg.global_key)
    chosen = _SELECTED.get(memo_key)
    if chosen is None:
        sel = select(op, problem)
        chosen = (sel, choose_strategy(sel.executor, op, problem))
        if len(_SELECTED) >= _SELECTED_MAX:
            _SELECTED.clear()
        _SELECTED[memo_key] = chosen
    else:
        log.debug("%s: executor %r, strategy %r kept for this problem", op, chosen[0].executor.name, chosen[1])
    sel, strategy = chosen
    plan = acquire_plan(sel.executor, op, problem, strategy)  # pinned until run() returns
    try:
        operands = coerce(sel, operands)
        ad = adapter_for(like)
        wrap = (ad, like) if ad is not None and ad.wraps and not sel.coerce else None
    except BaseException:
        plan_cache.let_go(plan)
        raise
    return run(plan, operands, stream, None, wrap)


# -- explain -----------------------------------------------------------------------------------------------------
def explain_selected(name: str, op: str, problem: Any, sel: Selection, strategy: str | None = None) -> Explanation:
    """The :class:`Explanation` of a call already detected and selected (``sel``), without running it: its
    strategies, the chosen one (``strategy`` when the caller chose it already), and the plan's steps (the
    plan is made and cached, not run). ``name`` is the operation as the user called it."""
    strategies = strategies_of(sel.executor, op, problem)
    if strategy is None:
        strategy = choose_strategy(sel.executor, op, problem)
    cached = plan_cache.contains(plan_key(sel.executor, op, problem, strategy))
    plan = acquire_plan(sel.executor, op, problem, strategy)
    try:  # held while read: a plan over the cache's byte bound is released when its last user lets go
        steps = tuple(plan.steps)
    finally:
        plan_cache.let_go(plan)
    tuned = plan_cache.tuning_for(choice_key(sel.executor, op, problem)) if plan_cache.has_tunings() else None
    if isinstance(tuned, dict) and isinstance(tuned.get("rejected"), dict):
        steps += tuple(f"rejected {s} when autotuned: {why}" for s, why in tuned["rejected"].items())
    return Explanation(
        name,
        sel.executor.name,
        strategy,
        steps,
        tuple(sel.declined),
        strategies,
        cached,
        problem,
        getattr(problem, "precision_note", None),
        compiled_note(getattr(problem, "framework", ""), op, problem),
    )


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
    #: the compute type and what chose it (the caller, a framework's precision convention, the dtype), where the
    #: problem says (a matmul's ``precision_note``)
    precision: str | None = None
    #: how such a call runs inside its framework's compiled programs, where the integration says (a JAX matmul's
    #: GPU route inside ``jax.jit``)
    compiled: str | None = None

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
        if self.compiled is not None:
            lines.append(f"  compiled: {self.compiled}")
        return "\n".join(lines)

    __repr__ = __str__


class FrontParts:
    """What a compiled front (``_hotpath.c``'s matmul front, ``_hotpath_fft.c``'s transforms' front) reads: these
    attributes, once, when it is made. Every call the front does not serve goes to ``route``.

    ``route``
        the operation's Python route, which takes the front's arguments;
    ``classes``
        class -> :class:`~nvdispatch._call_key.ClassKeys`: the call-key module's table, filled by the route;
    ``backends``, ``current_state``
        the backend registry (its ``global_key``) and its ``current_state`` (bound once, as the call keys bind it):
        the backend part of a form;
    ``acquire``, ``acquire_handle``, ``let_go``
        the plan cache's lookups and release;
    ``log_levels``, ``log_hit``
        the nvdispatch logger's level cache (a dict) and the hit's DEBUG record;
    ``raise_if_out_of_memory``
        the run step's error mapping.
    """

    def __init__(self, route: Callable) -> None:
        self.route = route
        self.classes = call_key_classes
        self.backends = _backends.registry
        self.acquire = plan_cache.acquire
        self.acquire_handle = plan_cache.acquire_handle
        self.let_go = plan_cache.let_go
        self.log_levels = log_levels
        self.log_hit = log_hit
        self.raise_if_out_of_memory = raise_if_out_of_memory
        self.current_state = _backends.registry.current_state
