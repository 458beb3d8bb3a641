"""Which CPU engine (so strategy) runs a matmul by default: measured once per process and problem class, never assumed.

The fastest way to fuse an epilog on the CPU depends on the machine (the BLAS build and the core type it
picks, cache sizes, whether Torch is installed): on one machine the blocked in-place pass matches
``np.matmul``, on another Torch's ``_addmm_activation`` does and the blocked pass is slower
(``docs/notes/cpu-matmul.md``). So the first
call of a *problem class* times every candidate engine briefly on synthetic operands shaped like the call
(the call's own shape up to ``FULL_BUDGET_MACS``: only the real size shows what the
epilog's passes over a result that large cost; beyond it, rows capped so one run stays near ``BUDGET_MACS``,
but kept enough for the result to outgrow the cores' private caches, within ``CACHE_BUDGET_MACS``), interleaved
round by round (each candidate's fastest round counts: load on the machine only adds time), and orders the
engines fastest first; later calls of the class reuse the order. Where an engine runs its own threads (the
row panels), each candidate is timed in a block of its own after a short pause instead
(``blas_threads.let_workers_sleep``): interleaved, it would find the previous engine's BLAS threads still
spinning, which a loop of calls of one class never does. ``Matmul.autotune()`` refines a single problem on
its real operands (that choice, kept in the plan cache, wins over the class order).

A problem class: result dtype, epilog steps, operands' layout kinds, ``c``/bias placement, batching, and
the size bucket ``log2(m*n*k) // 3`` (calls within 8x of each other in work share a class).

The measured orders live in this module for the process (thread-safe); :func:`calibrations` shows them,
:func:`clear` forgets them (tests, or after changing thread counts).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable

import numpy as np

from .._matmul_problem import ArraySig, MatmulProblem
from . import blas_threads, cpu_caches
from .cpu_threads import CPUS

__all__ = [
    "ordered",
    "calibrations",
    "clear",
    "problem_class",
    "fastest_seconds",
    "seconds_per_call",
    "BUDGET_MACS",
    "CACHE_BUDGET_MACS",
    "FULL_BUDGET_MACS",
]

#: one calibration run does about this many multiply-adds (rows are capped to stay near it)
BUDGET_MACS = 1 << 26
#: ... or up to this many where more rows are needed for the result to outgrow the private caches
CACHE_BUDGET_MACS = 8 * BUDGET_MACS
#: a call up to this many multiply-adds is calibrated at its own size: a copy with fewer rows can rank Torch's
#: whole-result epilog first where, at full size, the row panels win (the copy's result stays in cache, the real
#: one does not; docs/notes/cpu-matmul.md)
FULL_BUDGET_MACS = 1 << 31
#: seconds of repeated calls per candidate per round, and rounds (interleaved, so load hits all alike; the
#: fastest round of each counts, since a busy machine only ever adds time)
_ROUND_SECONDS = 1.5e-3
_ROUNDS = 5
#: rounds per candidate when timed in blocks (no interleaving to even out load: more rounds instead), fewer
#: (at least _MIN_BLOCK_ROUNDS) where they would take more than _BLOCK_SECONDS
_BLOCK_ROUNDS = 9
_MIN_BLOCK_ROUNDS = 4
_BLOCK_SECONDS = 0.2
_CPUS = CPUS
_log = logging.getLogger("nvdispatch")
_lock = threading.Lock()
_orders: dict[tuple, dict] = {}


def problem_class(problem: MatmulProblem) -> tuple:
    p = problem
    macs = max(1, p.m * p.n * p.k * math.prod(p.batch_shape))
    layout = tuple(_layout(sig) for sig in (p.a, p.b))
    return (
        p.result_dtype,
        tuple(p.epilog.steps),
        layout,
        None if p.c is None else len(p.c.shape),
        p.bias_axis,
        bool(p.batch_shape) and math.prod(p.batch_shape) > 1,
        p.a_vector or p.b_vector,
        int(math.log2(macs)) // 3,
    )


def ordered(problem: MatmulProblem, candidates: tuple[str, ...], make_plan: Callable) -> tuple[str, ...]:
    """``candidates`` fastest first for ``problem``'s class (calibrating the class on its first call)."""
    if len(candidates) < 2:
        return candidates
    key = (problem_class(problem), candidates)
    got = _orders.get(key)
    if got is None:
        with _lock:
            got = _orders.get(key)
            if got is None:
                got = _calibrate(problem, candidates, make_plan)
                _orders[key] = got
    return got["order"]


def calibrations() -> dict[str, dict]:
    """Every class calibrated in this process: its timings (seconds per call) and the order chosen."""
    with _lock:
        return {repr(k[0]): dict(v) for k, v in _orders.items()}


def clear() -> None:
    """Forget every calibration (the next call of each class measures again)."""
    with _lock:
        _orders.clear()


# -- measuring -------------------------------------------------------------------------------------------------
def _layout(sig: ArraySig) -> str:
    if sig.strides is None or len(sig.shape) < 2:
        return "c"
    s = sig.strides
    if s[-1] == 1:
        return "c"
    if s[-2] == 1:
        return "f"
    return "strided"


def _representative(problem: MatmulProblem) -> MatmulProblem | None:
    """``problem`` itself when one run fits the budget, else the same call with fewer rows (2-D, bias along n
    or none, no c); None when it cannot be shrunk faithfully (then the class keeps the default order)."""
    p = problem
    macs = p.m * p.n * p.k * math.prod(p.batch_shape)
    if macs <= FULL_BUDGET_MACS:
        return p
    if p.c is not None or p.bias_axis == "m" or p.a_vector or p.b_vector:
        return None
    if any(name != "bias" for name, _ in p.inputs):
        return None
    per_row = max(1, p.n * p.k)
    rows = min(p.m, max(8, BUDGET_MACS // per_row, min(_rows_past_caches(p), CACHE_BUDGET_MACS // per_row)))
    a = ArraySig(p.a.dtype, (rows, p.k), (p.k, 1) if _layout(p.a) == "c" else (1, rows))
    b = ArraySig(p.b.dtype, p.b.shape[-2:], p.b.strides[-2:] if p.b.strides else None)
    return dataclasses.replace(p, a=a, b=b, batch_shape=(), m=rows, result_shape=(rows, p.n))


def _rows_past_caches(p: MatmulProblem) -> int:
    """Rows whose result outgrows twice the cores' private caches together, so that the shrunk copy still
    shows what the real call pays for passes over memory (an epilog after a whole-result GEMM) and what
    finishing in cache saves; 0 where the cache size is unknown."""
    cache = cpu_caches.private_cache_bytes()
    if not cache:
        return 0
    return 2 * cache * _CPUS // max(1, p.n * np.dtype(p.result_dtype).itemsize)


def _operands(p: MatmulProblem) -> dict:
    rng = np.random.default_rng(0)

    def make(sig: ArraySig):
        if sig.dtype == "bool":
            return rng.random(sig.shape) > 0.5
        x = rng.standard_normal(sig.shape).astype(sig.dtype)
        return np.asfortranarray(x) if _layout(sig) == "f" else x

    ops = {"a": make(p.a), "b": make(p.b), "alpha": 1, "beta": None}
    if p.c is not None:
        ops["c"], ops["beta"] = make(p.c), 1
    for name, sig in p.inputs:
        ops[name] = make(sig)
    return ops


def _hot_call(plan, ops: dict) -> Callable:
    """What a repeated call runs: the plan's direct call where the route would take it (alpha 1, no c)."""
    direct = getattr(plan, "direct", None)
    if direct is not None and ops.get("c") is None:
        args = [ops["a"], ops["b"], *(v for k, v in ops.items() if k not in ("a", "b", "alpha", "beta", "c"))]
        return lambda: direct(*args)
    return lambda: plan.execute(ops)


def fastest_seconds(fn: Callable, runs: int) -> float:
    """Seconds of the fastest of ``runs`` (at least one) timed calls of ``fn``: other load only ever adds time.
    What the CPU plans' autotunes rank their settings by."""
    best = math.inf
    for _ in range(max(1, runs)):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def seconds_per_call(fn: Callable, n: int) -> float:
    """Seconds per call of ``fn`` over ``n`` calls in a row (one sample of a round-by-round comparison)."""
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def _calibrate(problem: MatmulProblem, candidates: tuple[str, ...], make_plan: Callable) -> dict:
    rep = _representative(problem)
    if rep is None:
        _log.debug("numpy matmul calibration: %s cannot be shrunk; order %s", problem_class(problem), candidates)
        return {"order": candidates, "seconds": {}, "calibrated": False}
    ops = _operands(rep)
    calls, reps, runs, own_threads = {}, {}, {}, 1
    for name in candidates:
        plan = make_plan(rep, name)
        own_threads = max(own_threads, getattr(plan, "own_threads", 1))
        fn = _hot_call(plan, ops)
        t0 = time.perf_counter()
        fn()  # warm-up (and first-touch of the output pages)
        once = max(time.perf_counter() - t0, 1e-7)
        calls[name], reps[name] = fn, max(1, min(2000, int(_ROUND_SECONDS / once)))
        runs[name] = max(_MIN_BLOCK_ROUNDS, min(_BLOCK_ROUNDS, int(_BLOCK_SECONDS / (once * reps[name]))))
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    if own_threads > 1:
        # an engine running its own threads would share the cores with the BLAS workers the engine timed before
        # it left spinning: time each candidate in a block of its own, after they have gone to sleep
        for name in candidates:
            blas_threads.let_workers_sleep()
            calls[name]()
            for _ in range(runs[name]):
                samples[name].append(seconds_per_call(calls[name], reps[name]))
    else:
        for _ in range(_ROUNDS):
            for name in candidates:
                samples[name].append(seconds_per_call(calls[name], reps[name]))
    seconds = {name: min(v) for name, v in samples.items()}
    order = tuple(sorted(candidates, key=lambda s: (seconds[s], candidates.index(s))))
    _log.debug("numpy matmul calibration %s: %s -> %s", problem_class(problem), seconds, order[0])
    return {"order": order, "seconds": seconds, "calibrated": True}
