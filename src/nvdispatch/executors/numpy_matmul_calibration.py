"""Which CPU engine (so strategy) runs a matmul by default: the engines ranked per problem class, as measured on
this machine by an explicit calibration step, kept on disk; a safe default order until the class is measured.

The fastest way to fuse an epilog on the CPU depends on the machine (the BLAS build and the core type it
picks, cache sizes, whether Torch is installed), so it is measured, never assumed. Measuring a class times
every candidate engine briefly on synthetic operands shaped like the call (the call's own shape up to
``FULL_BUDGET_MACS``: only the real size shows what the epilog's passes over a result that large cost; beyond
it, rows capped so one run stays near ``BUDGET_MACS``, but kept enough for the result to outgrow the cores'
private caches, within ``CACHE_BUDGET_MACS``), interleaved round by round (each candidate's fastest round
counts: load on the machine only adds time). Where an engine runs its own threads (the row panels), each
candidate is timed in two settings instead, and counts by the slower of the two: in a block of its own after
a short pause (``blas_threads.let_workers_sleep``: a loop of calls of one class, no other engine's BLAS
threads still spinning), and each call right after a bare product on the BLAS's own threads (a program that
mixes the call with other BLAS work: the BLAS's workers still spin for a while after each call, and an
engine running threads of its own shares the cores with them; the median such call counts, as the spinning
hits every one alike). The engine ranked first is the one never far from the best in either. Where the first in each
setting differ, the one first when settled runs threads of its own (and a BLAS-threaded one is first right after a
product; an engine on the BLAS's own threads meets its spinning workers as the BLAS does, so another first there is
the timings' noise), and a call is long enough that looking costs nothing to speak of (``PROBE_SHARE`` looks,
``cpu_contention.probe_seconds``), the ranking keeps both orders too: the plan then asks, per call, whether another
thread of the process is running (``numpy_matmul_contended``). Before any timing, each engine's result on those
operands is compared with the :data:`REFERENCE` engine's (NumPy's matmul, then ufuncs;
:mod:`nvdispatch._matmul_agreement`): an engine that disagrees beyond rounding is not timed and ranks last, with a
WARNING.

**When.** :func:`ranking` is a query: it never measures. It answers from this process's rankings, else from
the store (``cpu_calibration_store``: a ranking measured before on this machine, with this software), else
with :func:`default_order` and notes the class as *pending*: ``python -m nvdispatch calibrate`` (or
:func:`nvdispatch.calibration.calibrate`) measures the pending classes of earlier processes along with a standard set,
and keeps the results. :func:`calibrate` measures one class, now. ``Matmul.autotune()`` refines a single
problem on its real operands (that choice, kept in the plan cache, wins over the class ranking).

A problem class: result dtype, epilog steps, operands' layout kinds, ``c``/bias placement, batching, and the
size bucket ``log2(m*n*k) // 3`` (calls within 8x of each other in work share a class). A ranking covers every
engine installed when it was measured; a process offering fewer (Torch's engine is a candidate only once the
process imported Torch) takes the ranking's order of those it has.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import math
import statistics
import threading
import time
from collections.abc import Callable

import numpy as np

from .._matmul_agreement import agreeing, result_sampler
from .._matmul_problem import ArraySig, MatmulProblem
from . import blas_threads, cpu_caches, cpu_contention
from .cpu_calibration_store import store
from .cpu_threads import CPUS

__all__ = [
    "Ranking",
    "ranking",
    "generation",
    "calibrate",
    "default_order",
    "pending",
    "calibrations",
    "clear",
    "problem_class",
    "representative",
    "fastest_seconds",
    "seconds_per_call",
    "BUDGET_MACS",
    "CACHE_BUDGET_MACS",
    "FULL_BUDGET_MACS",
    "REFERENCE",
    "PROBE_SHARE",
]

#: one calibration run does about this many multiply-adds (rows are capped to stay near it)
BUDGET_MACS = 1 << 26
#: ... or up to this many where more rows are needed for the result to outgrow the private caches
CACHE_BUDGET_MACS = 8 * BUDGET_MACS
#: a call up to this many multiply-adds is calibrated at its own size (a copy with fewer rows can keep its
#: result in cache where the real one cannot, and rank a whole-result epilog first wrongly)
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
#: ... split into this many blocks per candidate, the candidates' blocks in turns
_BLOCK_PASSES = 3
#: the engines in the order taken where a class is not measured: the whole-result product (the BLAS's own
#: threading) and one pass over the result first, never far from a bare product (``gemm`` first: the same as
#: ``sweep`` for the BLAS, less its pass clearing the result); the compiled engines ahead of the ufuncs only where
#: the result outgrows a core's private cache (or SWEEP_FIRST_BYTES where its size is unknown): there the pass is
#: a trip through memory, which one sweep makes once, while in cache the ufuncs' smaller cost per call wins
DEFAULT_PREFERENCE = ("gemm", "sweep", "ufunc", "blas", "panels", "tiled", "torch")
SWEEP_FIRST_BYTES = 1 << 20
_SECTION, _PENDING = "matmul", "matmul_pending"
#: both orders (cores free, another thread busy) are kept only for a class whose call takes at least this many
#: looks at the threads' states (``cpu_contention.probe_seconds``): smaller calls keep one answer and never look
PROBE_SHARE = 200
#: the engine every other's result is checked against when calibrating (NumPy's matmul, then ufuncs)
REFERENCE = "ufunc"
_CPUS = CPUS
_log = logging.getLogger("nvdispatch")
_lock = threading.Lock()
_rankings: dict[tuple, Ranking] = {}  # (store path, class, candidates) -> ranking, this process
_pending: dict[str, dict] = {}  # class name -> recipe, noted by this process and not yet written
_flush_registered = False
_generation = 0  # changes whenever a ranking may have changed (calibrate, clear)


@dataclasses.dataclass(frozen=True)
class Ranking:
    """Engines fastest first for a problem class, and where that order came from: ``"persisted"`` (measured
    before, kept in the store), ``"fresh"`` (measured by this process), ``"default"`` (not measured yet, or
    cannot be: see ``why``), ``"only"`` (one candidate: nothing to rank)."""

    order: tuple[str, ...]
    source: str
    where: str | None = None  # the store's file
    seconds: dict | None = None
    why: str = ""
    rejected: tuple[str, ...] = ()  # engines whose results disagreed with the reference's (ranked last)
    #: where the first engine differs with the cores free (timed settled) and with another thread of the process
    #: busy (timed right after a bare product): both orders, which the plan picks between per call; else None
    free: tuple[str, ...] | None = None
    busy: tuple[str, ...] | None = None

    def describe(self) -> str:
        """One line for ``explain()``: the order and its origin."""
        order = " > ".join(self.order)
        kept = f" (kept in {self.where})" if self.where else " (not kept: NVDISPATCH_CACHE_DIR is empty)"
        both = ""
        if self.free and self.busy:
            both = (f"; with the cores free {' > '.join(self.free)}, with another thread of the process running "
                    f"{' > '.join(self.busy)}")  # fmt: skip
        if self.source == "persisted":
            return f"engine order {order}: calibrated on this machine{kept}{both}"
        if self.source == "fresh":
            wrong = f"; {', '.join(self.rejected)} last: results disagreed with {REFERENCE}'s" if self.rejected else ""
            return f"engine order {order}: calibrated by this process{kept}{wrong}{both}"
        why = self.why or "this problem class is not calibrated on this machine yet: python -m nvdispatch calibrate"
        return f"engine order {order}: the default order ({why})"


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


def default_order(candidates: tuple[str, ...], problem: MatmulProblem | None = None) -> tuple[str, ...]:
    """``candidates`` in the order :data:`DEFAULT_PREFERENCE` gives them (others last, as they came), with
    ``gemm`` and ``sweep`` after ``ufunc`` for a ``problem`` whose result fits a core's private cache."""
    preference = DEFAULT_PREFERENCE
    if problem is not None and _result_bytes(problem) < (cpu_caches.private_cache_bytes() or SWEEP_FIRST_BYTES):
        preference = ("ufunc", *(e for e in DEFAULT_PREFERENCE if e != "ufunc"))
    rank = {e: i for i, e in enumerate(preference)}
    return tuple(sorted(candidates, key=lambda e: (rank.get(e, len(rank)), candidates.index(e))))


def _result_bytes(problem: MatmulProblem) -> int:
    return math.prod(problem.promoted_shape) * np.dtype(problem.result_dtype).itemsize


def ranking(problem: MatmulProblem, candidates: tuple[str, ...]) -> Ranking:
    """``candidates`` fastest first for ``problem``'s class, and where the order came from. Never measures:
    an unmeasured class gets :func:`default_order` (and is noted for the next ``calibrate``)."""
    if len(candidates) < 2:
        return Ranking(tuple(candidates), "only")
    kept = store()
    cls = problem_class(problem)
    memo = (kept.path, cls, candidates)
    got = _rankings.get(memo)
    if got is not None:
        return got
    name = repr(cls)
    entry = kept.get(_SECTION, name)
    order = _order_of(entry, candidates)
    if order is not None:
        free, busy = (_order_of(entry.get(side), candidates) for side in ("free", "busy"))
        both = {"free": free, "busy": busy} if free and busy and free[0] != busy[0] else {}
        got = Ranking(order, "persisted", kept.path, entry.get("seconds"), **both)
    else:
        why = ""
        if representative(problem) is None:
            why = "this problem class cannot be calibrated on a smaller copy"
        else:
            _note_pending(name, problem)
        got = Ranking(default_order(candidates, problem), "default", kept.path, why=why)
    with _lock:
        return _rankings.setdefault(memo, got)


def generation() -> int:
    """A number that changes whenever a ranking this process answered may have changed (memos of rankings
    compare it)."""
    return _generation


def calibrate(
    problem: MatmulProblem, candidates: tuple[str, ...], make_plan: Callable, persist: bool = True
) -> Ranking:
    """Measure ``candidates`` for ``problem``'s class now (``make_plan(problem, engine)`` makes each engine's
    plan), remember the ranking for this process and (``persist``) keep it in the store."""
    kept = store()
    cls = problem_class(problem)
    rep = representative(problem)
    if len(candidates) < 2 or rep is None:
        return ranking(problem, candidates)
    seconds, settled, mixed = _measure(rep, candidates, make_plan)
    rejected = tuple(e for e in candidates if e not in seconds)  # (their results disagreed: last, whatever fast)

    def ranked(timed: dict[str, float]) -> tuple[str, ...]:
        return (*sorted(timed, key=lambda s: (timed[s], candidates.index(s))), *rejected)

    order = ranked(seconds)
    record = {"order": list(order), "seconds": seconds}
    both = {}
    if settled is not None and mixed is not None:
        free, busy = ranked(settled), ranked(mixed)
        # (two answers only where they differ and the call dwarfs a look at the threads: small calls never look)
        call_seconds = settled[free[0]] * _rep_scale(problem, rep)
        own = getattr(make_plan(rep, free[0]), "own_threads", 1) > 1 if free[0] != busy[0] else False
        if own and call_seconds >= PROBE_SHARE * cpu_contention.probe_seconds():
            both = {"free": free, "busy": busy}
            record["free"] = {"order": list(free), "seconds": settled}
            record["busy"] = {"order": list(busy), "seconds": mixed}
    two = f" ({both['free'][0]} with the cores free, {both['busy'][0]} with another thread busy)" if both else ""
    _log.debug("numpy matmul calibration %s: %s -> %s%s", cls, seconds, order[0], two)
    name = repr(cls)
    if persist:
        kept.update(_SECTION, {name: record}, drop={_PENDING: [name]})
    global _generation
    with _lock:
        _generation += 1
        _pending.pop(name, None)
        for memo in [m for m in _rankings if m[1] == cls]:
            del _rankings[memo]
        where = kept.path if persist else None
        got = _rankings[(kept.path, cls, candidates)] = Ranking(
            order, "fresh", where, seconds, rejected=rejected, **both
        )
    return got


def pending() -> dict[str, dict]:
    """The classes that ran on the default order, in this process or (as kept in the store) in earlier ones:
    class name -> recipe (see :func:`recipe`)."""
    got = store().section(_PENDING)
    with _lock:
        got.update(_pending)
    return got


def calibrations() -> dict[str, dict]:
    """Every class ranked in this process: its order, where it came from, (measured ones) the seconds per call
    of each engine and, where they differ, the orders with the cores free and with another thread busy."""
    with _lock:
        return {
            repr(memo[1]): {"order": r.order, "source": r.source, "seconds": r.seconds, "free": r.free, "busy": r.busy}
            for memo, r in _rankings.items()
        }


def clear() -> None:
    """Forget this process's rankings (the next plan of each class asks the store again)."""
    global _generation
    with _lock:
        _generation += 1
        _rankings.clear()
        _pending.clear()
    store().forget()


def _order_of(entry, candidates: tuple[str, ...]) -> tuple[str, ...] | None:
    """The stored ranking's order of ``candidates`` (those it did not measure last), None when it measured
    none of them or is not a ranking."""
    if not isinstance(entry, dict) or not isinstance(entry.get("order"), list):
        return None
    measured = [e for e in entry["order"] if e in candidates]
    if not measured:
        return None
    return (*dict.fromkeys(measured), *(e for e in candidates if e not in measured))


# -- pending classes -----------------------------------------------------------------------------------------
def recipe(problem: MatmulProblem) -> dict:
    """What rebuilding ``problem``'s representative takes (operands' dtypes, shapes and layouts, the epilog),
    and its class name: JSON-able."""
    rep = representative(problem) or problem

    def sig(s: ArraySig | None):
        return None if s is None else [s.dtype, list(s.shape), _layout(s)]

    return {
        "class": repr(problem_class(problem)),
        "a": sig(rep.a),
        "b": sig(rep.b),
        "c": sig(rep.c),
        "epilog": problem.epilog.epilog.name,
        "inputs": {name: sig(s) for name, s in rep.inputs},
    }


def _note_pending(name: str, problem: MatmulProblem) -> None:
    global _flush_registered
    try:
        got = recipe(problem)
    except (AttributeError, TypeError, ValueError):  # (a problem this module cannot describe: nothing noted)
        return
    with _lock:
        _pending[name] = got
        if not _flush_registered:
            _flush_registered = True
            atexit.register(_flush_pending)


def _flush_pending() -> None:
    """Write the classes this process noted as pending (at exit: one write per process)."""
    with _lock:
        noted = dict(_pending)
        _pending.clear()
    if noted:
        kept = store()
        on_disk = kept.section(_SECTION)
        kept.update(_PENDING, {k: v for k, v in noted.items() if k not in on_disk})


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


def representative(problem: MatmulProblem) -> MatmulProblem | None:
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


class _Runner:
    """A hot call as a plan :func:`~nvdispatch._matmul_agreement.agreeing` can run."""

    def __init__(self, fn: Callable):
        self.fn = fn

    def execute(self, operands, stream=None):
        return self.fn()


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


def _rep_scale(problem: MatmulProblem, rep: MatmulProblem) -> float:
    """How many times the work of ``rep`` (a calibration's smaller copy) ``problem``'s call does."""
    return max(1.0, (problem.m * math.prod(problem.batch_shape)) / max(1, rep.m * math.prod(rep.batch_shape)))


def _measure(
    rep: MatmulProblem, candidates: tuple[str, ...], make_plan: Callable
) -> tuple[dict[str, float], dict[str, float] | None, dict[str, float] | None]:
    """Seconds per call of each candidate engine on ``rep``-shaped synthetic operands (see the module notes), and
    where engines running their own threads were timed in both settings, each setting's seconds (settled, right
    after a bare product); else None for those."""
    ops = _operands(rep)
    calls, reps, runs, threaded = {}, {}, {}, set()
    plans = {name: make_plan(rep, name) for name in candidates}
    sample = result_sampler(rep, None)
    samples = {}
    for name in candidates:
        if getattr(plans[name], "own_threads", 1) > 1:
            threaded.add(name)
        fn = _hot_call(plans[name], ops)
        t0 = time.perf_counter()
        got = fn()  # warm-up (and first-touch of the output pages)
        once = max(time.perf_counter() - t0, 1e-7)
        if (kept := sample(got)) is not None:  # what is timed is what is checked
            samples[name] = kept
        calls[name], reps[name] = fn, max(1, min(2000, int(_ROUND_SECONDS / once)))
        runs[name] = max(_MIN_BLOCK_ROUNDS, min(_BLOCK_ROUNDS, int(_BLOCK_SECONDS / (once * reps[name]))))
    runners = {name: _Runner(calls[name]) for name in candidates}
    kept_plans, _ = agreeing(runners, rep, ops, None, REFERENCE, "CPU engine calibration", samples)
    candidates = tuple(kept_plans)
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    if threaded:
        # an engine running its own threads would share the cores with the BLAS workers the engine timed before
        # it left spinning: time each candidate in blocks of its own, those engines after the workers have gone
        # to sleep (a block per candidate in each of a few passes, in turns: a burst of other load spoils one
        # block, not a ranking) ...
        for turn in range(_BLOCK_PASSES):
            for name in candidates if turn % 2 == 0 else reversed(candidates):
                if name in threaded:
                    blas_threads.let_workers_sleep()
                calls[name]()
                for _ in range(-(-runs[name] // _BLOCK_PASSES)):
                    samples[name].append(seconds_per_call(calls[name], reps[name]))
        # ... and each call right after a bare product, as in a program mixing them; the slower setting counts
        a, b = ops["a"], ops["b"]
        after: dict[str, list[float]] = {name: [] for name in candidates}
        for _ in range(min(runs.values())):
            for name in candidates:
                np.matmul(a, b)
                after[name].append(seconds_per_call(calls[name], 1))
        # (settled: the fastest block, load only adding time; right after a product: the median call, since the
        # BLAS workers' spinning hits every such call alike, and one that happened to find them asleep, or the
        # other load away, says nothing of the others)
        settled = {name: min(samples[name]) for name in candidates}
        mixed = {name: statistics.median(after[name]) for name in candidates}
        _log.debug("numpy matmul calibration, settled %s, right after a product %s", settled, mixed)
        return {name: max(settled[name], mixed[name]) for name in candidates}, settled, mixed
    for _ in range(_ROUNDS):
        for name in candidates:
            samples[name].append(seconds_per_call(calls[name], reps[name]))
    return {name: min(v) for name, v in samples.items()}, None, None
