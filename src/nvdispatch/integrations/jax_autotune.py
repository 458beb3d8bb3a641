"""Autotuning the cuBLASLt plans of matmuls staged into JAX programs, when the program is traced.

XLA times the candidates of its own GEMMs when it compiles a program; a matmul nvdispatch stages into
``jax.jit`` does the same with its plan: when the plan is made for the staged call (the XLA FFI route plans
while tracing; the callback route's plan is made then too, for the run to find), its cuBLASLt candidates are
timed on scratch buffers of the problem's shapes on a private stream
(:func:`~nvdispatch._cuda.lt_scratch_autotune.autotune_on_scratch`) and the plan keeps the fastest. A choice
is made once per problem and machine:

* in the process, the plan cache records it (``plan_cache.tunings()``): every later plan of the problem — a
  re-trace, another program, an eager call — starts with it, and nothing is timed again;
* between processes, it is kept in the cuBLASLt tunings file of the GPU (:mod:`nvdispatch.executors.cuda_tuning_store`,
  in ``NVDISPATCH_CACHE_DIR``): a fresh process takes it from there after cuBLASLt checks it.

``NVDISPATCH_JAX_AUTOTUNE`` (or :func:`jax_autotune` around the tracing; the block's mode is part of JAX's trace
cache key, so a function traced with autotuning off is traced again, and tuned, where it is called with it on)
decides, per traced call:

``"auto"`` (the default)
    products of at least :data:`MIN_FLOP` floating-point operations (``2 m n k`` per batch matrix) are tuned;
    smaller ones keep the heuristic's first answer: they run in a few microseconds, where what timing can win
    is within the timing's own noise and the launch's host cost, and the timing (a few milliseconds per
    candidate) would cost more than a long run of calls could win back.
``"always"``
    every staged product is tuned.
``"off"``
    nothing is timed or read from the file: plans start with the heuristic's answer (or a choice recorded in
    this process by ``Matmul.autotune``/``plan_cache.load``, as every plan does).

The timing is bounded: the first :data:`MAX_CANDIDATES` candidates in :mod:`~nvdispatch._cuda.lt_autotune`'s
order (the heuristic's, smaller workspaces, split-K, then the neighbourhood), screening stops after
:data:`BUDGET_SECONDS`, :data:`ITERATIONS` samples of each finalist. The candidates run as the handler launches
the plan (its descriptors, epilogue and bias, the algorithm's own workspace size, 256-byte aligned buffers as
XLA's are). The heuristic's first answer (what an untuned program runs) is kept unless the fastest finalist
beats it on fresh samples, in most rounds and by at least ``lt_autotune.MIN_GAIN``
(:func:`~nvdispatch._cuda.lt_autotune.keeps_challenger`): a kernel equal within the timing's noise no longer
replaces it. What was timed and the winner are logged at DEBUG; ``explain()`` says where a problem's choice came
from (:func:`explain_line`).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import threading
from collections.abc import Iterator

from .._plan_cache import plan_cache
from .._route import log
from ..errors import InvalidArgumentError
from ._settings import block_or_env, setting_block, trace_key

__all__ = [
    "MODES",
    "MIN_FLOP",
    "MAX_CANDIDATES",
    "BUDGET_SECONDS",
    "ITERATIONS",
    "autotune_mode",
    "jax_autotune",
    "tune_staged",
    "wants_timing",
    "explain_line",
]

MODES = ("auto", "always", "off")
#: the smallest product (floating-point operations, all batch matrices) ``"auto"`` tunes: 2**30, a 1024 x 1024 x 512
#: product
MIN_FLOP = 1 << 30
#: candidates timed at most per problem: enough for the whole neighbourhood of the heuristic's first answers, where
#: the winners often are (tile and cluster shape changed together come last)
MAX_CANDIDATES = 512
#: seconds of screening at most per problem (the finalists' samples come after: a few per finalist)
BUDGET_SECONDS = 3.0
#: samples of each finalist
ITERATIONS = 3

_asked: contextvars.ContextVar[str | None] = contextvars.ContextVar("nvdispatch_jax_autotune", default=None)
#: the block's mode in JAX's trace cache key: a function jitted earlier is traced again under another mode
_trace_key = trace_key()
#: one timing at a time in the process (timings side by side on one GPU would disturb each other)
_timing = threading.Lock()
#: tuning key -> where its choice came from (this process's trace-time outcomes)
_outcomes: dict = {}
#: (m, n, k, batch, dtype, epilog) -> the latest outcome for such a product (what explain() reports)
_by_product: dict = {}


def autotune_mode() -> str:
    """The mode asked for: :func:`jax_autotune`'s inside its block, else ``NVDISPATCH_JAX_AUTOTUNE`` (``"auto"``)."""
    return block_or_env(_asked, "NVDISPATCH_JAX_AUTOTUNE", "auto", MODES)


@contextlib.contextmanager
def jax_autotune(mode: str) -> Iterator[None]:
    """Within the block, matmuls staged into JAX programs traced there are autotuned as ``mode`` says
    (``"auto"``, ``"always"`` or ``"off"``; see the module docstring). The mode is part of JAX's trace cache key:
    a function jitted earlier and called in the block is traced again under it; a compiled program
    (``jax.jit(f).lower(...).compile()``) keeps what its trace chose.

    Examples
    --------
    >>> from nvdispatch.integrations.jax_autotune import autotune_mode, jax_autotune
    >>> with jax_autotune("off"):
    ...     autotune_mode()
    'off'
    """
    with setting_block(_asked, "mode", mode, MODES, _trace_key):
        yield


def wants_timing(problem, mode: str) -> bool:
    """Whether ``mode`` has a plan of ``problem`` timed (where no choice is recorded for it yet)."""
    return mode == "always" or (mode == "auto" and _flop(problem) >= MIN_FLOP)


def _flop(problem) -> int:
    return 2 * problem.m * problem.n * problem.k * math.prod(problem.batch_shape)


def _product(problem) -> tuple:
    return (problem.m, problem.n, problem.k, math.prod(problem.batch_shape), problem.result_dtype,
            problem.epilog.epilog.name)


def _note(problem, outcome: str) -> str:
    _by_product[_product(problem)] = outcome
    return outcome


def tune_staged(plan, mode: str, alpha=1, beta=None) -> str:
    """Autotune ``plan`` (a cuBLASLt plan made for a staged call, launched with ``alpha``/``beta``) as ``mode``
    says, once per problem (see the module docstring); returns where its algorithm came from. Never raises for
    the timing's sake: a failure is logged and the plan keeps its algorithm."""
    from .._cuda import lt_autotune

    problem = plan.problem
    if getattr(plan, "tuning_kind", None) != lt_autotune.TUNING_KIND:
        return _note(problem, "the plan's own algorithm (not a cuBLASLt plan)")
    if mode == "off":
        return _note(problem, "the heuristic's first answer (trace-time autotuning off: NVDISPATCH_JAX_AUTOTUNE)")
    if not wants_timing(problem, mode):
        return _note(problem, f"the heuristic's first answer ({_flop(problem):.3g} flop, below the {MIN_FLOP:.3g} "
                              "that trace-time autotuning starts at)")
    try:
        key = lt_autotune.tuning_key(plan)
    except Exception as exc:  # noqa: BLE001 - no GPU environment to key by: nothing to tune
        return _note(problem, f"the heuristic's first answer (not autotuned: {type(exc).__name__}: {exc})")
    with _timing:
        recorded = plan_cache.tuning_for(key)
        if plan.tuned is not None or (recorded is not None and _take(plan, recorded)):
            known = _outcomes.get(key, "recorded earlier in this process (Matmul.autotune or plan_cache.load)")
            return _note(problem, known)
        outcome = _from_file(plan) or _timed(plan, alpha, beta)
        _outcomes[key] = outcome
        return _note(problem, outcome)


def _take(plan, choice) -> bool:
    """Give ``plan`` the recorded ``choice`` where cuBLASLt accepts it for the plan's descriptors."""
    from .._cuda import lt_autotune

    try:
        checked = lt_autotune.saved_choice(plan, choice)
    except Exception as exc:  # noqa: BLE001 - a choice cuBLASLt cannot take is no choice
        log.debug("jax: a recorded cuBLASLt choice for %s cannot be taken (%s: %s)", plan.problem,
                  type(exc).__name__, exc)
        return False
    if checked is None:
        return False
    plan.algorithm = checked
    plan_cache.record_tuning(lt_autotune.tuning_key(plan), choice, lt_autotune.TUNING_KIND)
    return True


def _from_file(plan) -> str | None:
    """Where the kept choice came from, once ``plan`` has it; None where the file has none it can take."""
    from ..executors import cuda_tuning_store

    choice, where = cuda_tuning_store.lookup(plan)
    if choice is None:
        log.debug("jax: no kept cuBLASLt choice for %s (%s)", plan.problem, where)
        return None
    if not _take(plan, choice):
        log.debug("jax: the kept cuBLASLt choice in %s is not valid for %s now; timing again", where, plan.problem)
        return None
    log.debug("jax: cuBLASLt choice %r for %s taken from %s", choice.get("label"), plan.problem, where)
    return f"autotuned in an earlier process, kept in {where} ({choice.get('label') or 'no label'})"


def _timed(plan, alpha, beta) -> str:
    """Time ``plan``'s candidates now; where its algorithm came from."""
    from .._cuda.lt_scratch_autotune import autotune_on_scratch
    from ..executors import cuda_tuning_store

    try:
        timed = autotune_on_scratch(plan, alpha, beta, iterations=ITERATIONS, max_candidates=MAX_CANDIDATES,
                                    budget=BUDGET_SECONDS)
    except Exception as exc:  # noqa: BLE001 - the plan keeps the heuristic's answer
        log.debug("jax: autotuning %s at trace time failed (%s: %s)", plan.problem, type(exc).__name__, exc)
        return f"the heuristic's first answer (trace-time autotuning failed: {type(exc).__name__}: {exc})"
    choice = plan.tuned
    finite = [t for _, t in timed if math.isfinite(t)]
    if choice is None or not finite:
        return "the heuristic's first answer (no candidate could be timed)"
    where = cuda_tuning_store.keep(plan, choice)
    first = timed[0][1] if timed else math.inf
    log.debug("jax: %s autotuned at trace time: %d candidates timed, kept %r (%.1f us; the heuristic's first "
              "%.1f us)%s", plan.problem, len(finite), choice["label"], choice["seconds"] * 1e6, first * 1e6,
              f"; kept in {where}" if where else "")
    return (f"timed when the program was traced ({len(finite)} candidates; kept {choice['label']}, "
            f"{choice['seconds'] * 1e6:.1f} us; the heuristic's first {first * 1e6:.1f} us)")


def explain_line(problem) -> str:
    """What ``explain()`` says of the cuBLASLt algorithm of ``problem`` staged into a JAX program on the GPU."""
    try:
        mode = autotune_mode()
    except InvalidArgumentError as exc:
        return f"trace-time autotuning: {exc}"
    seen = _by_product.get(_product(problem)) if problem is not None and hasattr(problem, "epilog") else None
    if seen is not None:
        return f"its cuBLASLt algorithm when last traced: {seen}"
    if mode == "off":
        return "its cuBLASLt algorithm: the heuristic's first answer (trace-time autotuning off)"
    if mode == "auto" and problem is not None and hasattr(problem, "m") and _flop(problem) < MIN_FLOP:
        return (f"its cuBLASLt algorithm: the heuristic's first answer ({_flop(problem):.3g} flop, below the "
                f"{MIN_FLOP:.3g} that trace-time autotuning starts at)")
    return ("its cuBLASLt algorithm is autotuned when a program staging it is traced (kept for the process and in "
            "the cuBLASLt tunings file)")
