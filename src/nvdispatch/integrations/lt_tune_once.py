"""Autotuning one cuBLASLt plan once per problem and machine, without the caller's operands: what an integration
that prepares its GEMMs itself (a matmul staged into ``jax.jit``, a fused MLP chain's GEMM sites) runs on a plan
before its first use. Framework-free.

:func:`tune_once` gives the plan, in this order, the choice recorded in this process for its problem
(``Matmul.autotune``, ``plan_cache.load``, an earlier :func:`tune_once`), the choice kept in the GPU's cuBLASLt
tunings file (:mod:`nvdispatch.executors.cuda_tuning_store`, checked by cuBLASLt), else times its candidates now
on scratch buffers of the problem's shapes on a private stream
(:func:`~nvdispatch._cuda.lt_scratch_autotune.autotune_on_scratch`: the first :data:`MAX_CANDIDATES` candidates
in :mod:`~nvdispatch._cuda.lt_autotune`'s order, screening for at most :data:`BUDGET_SECONDS`, :data:`ITERATIONS`
samples of each finalist, the winner's result checked against the heuristic's first answer's) and keeps the
winner in the plan, the plan cache's tunings and the file. One timing at a time in the process. It never raises
for the timing's sake: a failure is logged and the plan keeps its algorithm.

:func:`wants_timing` is the size rule of an ``"auto"`` mode: products of at least :data:`MIN_FLOP` floating-point
operations are worth timing; smaller ones run in a few microseconds, where what timing can win is within the
timing's own noise and the launch's host cost.
"""

from __future__ import annotations

import logging
import math
import threading

from .._plan_cache import plan_cache

__all__ = ["MIN_FLOP", "MAX_CANDIDATES", "BUDGET_SECONDS", "ITERATIONS", "flop", "wants_timing", "tune_once"]

log = logging.getLogger("nvdispatch")

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

#: one timing at a time in the process (timings side by side on one GPU would disturb each other)
_timing = threading.Lock()


def flop(problem) -> int:
    """Floating-point operations of a matmul problem: ``2 m n k`` per batch matrix."""
    return 2 * problem.m * problem.n * problem.k * math.prod(problem.batch_shape)


def wants_timing(problem, mode: str) -> bool:
    """Whether ``mode`` (``"always"``, ``"auto"`` or ``"off"``) has a plan of ``problem`` timed (where no choice
    is recorded for it yet): ``"auto"`` from :data:`MIN_FLOP` operations up."""
    return mode == "always" or (mode == "auto" and flop(problem) >= MIN_FLOP)


def tune_once(
    plan, alpha=1, beta=None, *, outcomes: dict | None = None, who: str = "nvdispatch",
    timed_as: str = "timed on the plan's first use", failed_as: str = "autotuning", budget: float | None = None,
) -> str:
    """Give cuBLASLt ``plan`` (launched with ``alpha``/``beta``) the choice for its problem (see the module notes);
    returns where its algorithm came from. ``outcomes``: the caller's record of those answers by tuning key (what
    a later call for the same problem reports); ``who`` names the caller in the DEBUG log, ``timed_as``/``failed_as``
    the timing in the answers; ``budget``: seconds of screening (default :data:`BUDGET_SECONDS`)."""
    from .._cuda import lt_autotune

    if getattr(plan, "tuning_kind", None) != lt_autotune.TUNING_KIND:
        return "the plan's own algorithm (not a cuBLASLt plan)"
    try:
        key = lt_autotune.tuning_key(plan)
    except Exception as exc:  # noqa: BLE001 - no GPU environment to key by: nothing to tune
        return f"the heuristic's first answer (not autotuned: {type(exc).__name__}: {exc})"
    outcomes = {} if outcomes is None else outcomes
    with _timing:
        recorded = plan_cache.tuning_for(key)
        if plan.tuned is not None or (recorded is not None and _take(plan, recorded, who)):
            return outcomes.get(key, "recorded earlier in this process (Matmul.autotune or plan_cache.load)")
        outcome = _from_file(plan, who) or _timed(plan, alpha, beta, who, (timed_as, failed_as),
                                                  BUDGET_SECONDS if budget is None else budget)  # fmt: skip
        outcomes[key] = outcome
        return outcome


def _take(plan, choice, who: str) -> bool:
    """Give ``plan`` the recorded ``choice`` where cuBLASLt accepts it for the plan's descriptors."""
    from .._cuda import lt_autotune

    try:
        checked = lt_autotune.saved_choice(plan, choice)
    except Exception as exc:  # noqa: BLE001 - a choice cuBLASLt cannot take is no choice
        log.debug("%s: a recorded cuBLASLt choice for %s cannot be taken (%s: %s)", who, plan.problem,
                  type(exc).__name__, exc)  # fmt: skip
        return False
    if checked is None:
        return False
    plan.algorithm = checked
    plan_cache.record_tuning(lt_autotune.tuning_key(plan), choice, lt_autotune.TUNING_KIND)
    return True


def _from_file(plan, who: str) -> str | None:
    """Where the kept choice came from, once ``plan`` has it; None where the file has none it can take."""
    from ..executors import cuda_tuning_store

    choice, where = cuda_tuning_store.lookup(plan)
    if choice is None:
        log.debug("%s: no kept cuBLASLt choice for %s (%s)", who, plan.problem, where)
        return None
    if not _take(plan, choice, who):
        log.debug("%s: the kept cuBLASLt choice in %s is not valid for %s now; timing again", who, where,
                  plan.problem)  # fmt: skip
        return None
    log.debug("%s: cuBLASLt choice %r for %s taken from %s", who, choice.get("label"), plan.problem, where)
    return f"autotuned in an earlier process, kept in {where} ({choice.get('label') or 'no label'})"


def _timed(plan, alpha, beta, who: str, names: tuple[str, str], budget: float) -> str:
    """Time ``plan``'s candidates now; where its algorithm came from."""
    from .._cuda.lt_scratch_autotune import autotune_on_scratch
    from ..executors import cuda_tuning_store

    try:
        timed = autotune_on_scratch(plan, alpha, beta, iterations=ITERATIONS, max_candidates=MAX_CANDIDATES,
                                    budget=budget)  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - the plan keeps the heuristic's answer
        log.debug("%s: autotuning %s failed (%s: %s)", who, plan.problem, type(exc).__name__, exc)
        return f"the heuristic's first answer ({names[1]} failed: {type(exc).__name__}: {exc})"
    choice = plan.tuned
    finite = [t for _, t in timed if math.isfinite(t)]
    if choice is None or not finite:
        return "the heuristic's first answer (no candidate could be timed)"
    where = cuda_tuning_store.keep(plan, choice)
    first = timed[0][1] if timed else math.inf
    log.debug("%s: %s autotuned (%s): %d candidates timed, kept %r (%.1f us; the heuristic's first %.1f us)%s",
              who, plan.problem, names[0], len(finite), choice["label"], choice["seconds"] * 1e6, first * 1e6,
              f"; kept in {where}" if where else "")  # fmt: skip
    return (f"{names[0]} ({len(finite)} candidates; kept {choice['label']}, {choice['seconds'] * 1e6:.1f} us; the "
            f"heuristic's first {first * 1e6:.1f} us)")
