"""cuBLASLt algorithm autotuning that persists.

``Matmul.autotune()`` on a cuBLASLt plan times, on the caller's operands and stream (CUDA events):

* the heuristic's top candidates (``limit``, default :data:`CANDIDATES`) at the plan's workspace limit,
* the heuristic's answers at smaller workspace limits (4 MiB, none) — other kernels, often other split-K
  choices,
* the heuristic's answers for related forms of the problem (``related()`` of the plan's descriptors: for FP8,
  the bias-only form with device scales that ``torch._scaled_mm`` hands cuBLASLt) that run this one too,
* split-K variants (2, 4, 8, 16 slices, reduced in the compute type) of the first few candidates,
* the *neighbourhood* of the first few distinct answers: each with one knob of its configuration changed
  (cluster shape, CTA swizzling, stages, custom option, tile) and with tile and cluster shape changed
  together, the tiles (stages) taken from the kernel's capabilities where it lists few, else from those the
  heuristic answered with. The heuristic ranks by a model: a neighbour it did not offer can be the faster
  kernel (``benchmarks/README.md`` has the measurements),

every candidate validated with ``cublasLtMatmulAlgoCheck`` (configurations a kernel cannot take are dropped
there). The first candidate is always the heuristic's first answer as the plan asked for it (the algorithm an
untuned plan runs: the baseline). Timing is three-staged: one short sample of every candidate (screening), then
``iterations`` samples of the fastest few and of the baseline, taken in turns, and the lowest median is the
challenger — so a candidate that was lucky once among hundreds is not chosen on that luck; then a confirmation
on fresh samples (:func:`keeps_challenger`): :data:`CONFIRM_ROUNDS` rounds of the challenger and the baseline in
turns (the order alternating), and the challenger is kept only where it was faster in at least
:data:`CONFIRM_WINS` rounds and its median ratio to the baseline is at most ``1 - MIN_GAIN``. The finalists'
medians choose among hundreds, so the winner's is biased low (the fastest of several noisy medians): without a
confirmation a candidate equal to the baseline replaced it on noise (the H100 kept ``heuristic #3`` of a 4096^3
TF32 product for 340.8 us against the baseline's 340.9), and a kernel change must pay for itself beyond the
noise between samples and processes (clocks, power). Otherwise the baseline is kept (and recorded).

Before the winner is kept, its result is compared with the heuristic's first answer's (the algorithm an
untuned plan runs) on a sample read back from the device (:mod:`nvdispatch._agreement`), when the caller
passes a ``check`` (:class:`ResultSample`): a kernel that disagrees beyond a GEMM rounding bound is rejected
with a WARNING (and listed under ``"rejected"`` in the record) and the next fastest finalist is checked in
its place. Only finalists are checked, and only until one agrees: a run and a small copy each. Where the
heuristic's first answer itself fails, nothing can be checked and the plan keeps the algorithm it had.

The choice is recorded in the plan cache under a key holding the GPU (name and compute
capability), the driver, the cuBLASLt version and the problem, so ``plan_cache.save()``/``load()`` carry it
to another process on an identical machine and nowhere else: cuBLASLt documents its algorithm structure as
serialisable for the same library version. Any later plan for the same problem — a stateless ``matmul``
call included — starts with the recorded algorithm after one ``cublasLtMatmulAlgoCheck``, and without timing.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import logging
import math
import statistics
import time
import types
from collections.abc import Callable

from .._agreement import Rejection, disagreement, position, warn
from .._plan_cache import plan_cache
from .._tunings import a_number, a_string, an_int, an_object, check_object, ints, require_valid, strings_by_name

__all__ = [
    "environment",
    "fingerprint",
    "tuning_key",
    "candidates",
    "configuration",
    "autotune",
    "keeps_challenger",
    "saved_choice",
    "record",
    "validate_choice",
    "CANDIDATES",
    "CONFIRM_ROUNDS",
    "CONFIRM_WINS",
    "MIN_GAIN",
    "TUNING_KIND",
    "ResultSample",
]

#: the kind of the tunings :func:`record` makes (see nvdispatch._tunings)
TUNING_KIND = "cublaslt-algo"

#: candidates the heuristic is asked for when autotuning
CANDIDATES = 8
_SPLITK = (2, 4, 8, 16)
_SPLITK_OF_FIRST = 3
_SMALLER_WORKSPACES = (4 << 20, 0)
#: distinct heuristic answers whose neighbourhood is searched
NEIGHBOURHOOD_SEEDS = 3
#: candidates kept for the second timing stage (besides the heuristic's first answer)
FINALISTS = 6
#: rounds of the confirmation: the challenger and the baseline timed in turns, on samples not used to choose it
CONFIRM_ROUNDS = 7
#: rounds of :data:`CONFIRM_ROUNDS` the challenger must be faster in (a sign test: two equal kernels pass with
#: probability 8/128)
CONFIRM_WINS = 6
#: the least gain a kept challenger shows: its median per-round ratio to the baseline at most ``1 - MIN_GAIN``
MIN_GAIN = 0.03
#: a capability list (tiles, stages) longer than this is not searched whole (Hopper kernels list 634 tiles)
_MAX_CAP_IDS = 32
#: cluster shapes tried (cublasLtClusterShape_t: auto and the shapes of up to 16 CTAs along one or two axes)
_CLUSTER_SHAPES = range(17)
_SWIZZLES = range(4)

# cublasLtMatmulAlgoConfigAttributes_t: (attribute, C type)
_CONFIG = {
    "id": (0, ctypes.c_int32),
    "tile": (1, ctypes.c_uint32),
    "splitk": (2, ctypes.c_uint32),
    "reduction": (3, ctypes.c_uint32),
    "swizzle": (4, ctypes.c_uint32),
    "custom": (5, ctypes.c_uint32),
    "stages": (6, ctypes.c_uint32),
    "cluster": (8, ctypes.c_uint16),
}
# cublasLtMatmulAlgoCapAttributes_t
_CAP_TILE_IDS = 6
_CAP_CUSTOM_OPTION_MAX = 7
_CAP_STAGES_IDS = 13
_REDUCTION_COMPUTE_TYPE = 2

_log = logging.getLogger("nvdispatch")


@functools.lru_cache(maxsize=16)
def environment(device_index: int) -> dict:
    """``{"gpu", "cc", "driver", "cublaslt"}`` of ``device_index`` (what a tuned algorithm depends on)."""
    from . import cublaslt, runtime

    rt = runtime.cudart()
    prop = runtime.check(rt.cudaGetDeviceProperties(device_index), "cudaGetDeviceProperties")
    name = prop.name
    name = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
    name = name.split("\x00", 1)[0].strip()
    driver = runtime.check(rt.cudaDriverGetVersion(), "cudaDriverGetVersion")
    return {
        "gpu": name,
        "cc": f"{prop.major}.{prop.minor}",
        "driver": int(driver),
        "cublaslt": int(cublaslt.version()),
    }


def compute_capability(device_index: int) -> tuple[int, int]:
    major, minor = environment(device_index)["cc"].split(".")
    return int(major), int(minor)


def fingerprint(device_index: int) -> str:
    env = environment(device_index)
    return f"{env['gpu']} (cc {env['cc']}), driver {env['driver']}, cuBLASLt {env['cublaslt']}"


def tuning_key(plan) -> tuple:
    """Where a plan's tuned algorithm is recorded: machine fingerprint + plan kind + problem."""
    return ("cublaslt-algo", fingerprint(plan.device_index), type(plan).__name__, plan.strategy, plan.problem)


# -- cuBLASLt entry points beyond the plan's ------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _fns():
    from . import cublaslt as lt

    L = lt.lib()
    vp = ctypes.c_void_p
    fns = types.SimpleNamespace(
        config_set=L.cublasLtMatmulAlgoConfigSetAttribute,
        config_get=L.cublasLtMatmulAlgoConfigGetAttribute,
        capability=L.cublasLtMatmulAlgoCapGetAttribute,
        check=L.cublasLtMatmulAlgoCheck,
    )
    fns.config_set.argtypes = [ctypes.POINTER(lt.Algo), ctypes.c_int, vp, ctypes.c_size_t]
    fns.check.argtypes = [vp, vp, vp, vp, vp, vp, ctypes.POINTER(lt.Algo), ctypes.POINTER(lt.HeuristicResult)]
    for getter in (fns.config_get, fns.capability):
        getter.argtypes = [ctypes.POINTER(lt.Algo), ctypes.c_int, vp, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]
    for fn in vars(fns).values():
        fn.restype = ctypes.c_int
    return fns


def _check(core, handle: int, algo) -> object | None:
    """``cublasLtMatmulAlgoCheck``: a HeuristicResult (workspace size filled in) or None when it does not fit."""
    from . import cublaslt as lt

    result = lt.HeuristicResult()
    status = _fns().check(
        handle, core.desc.ptr, core.a.ptr, core.b.ptr, core.c.ptr, core.d.ptr, ctypes.byref(algo), ctypes.byref(result)
    )
    if status != 0 or result.state != 0:
        return None
    result.algo = algo
    return result


def _key(result) -> tuple[int, ...]:
    return tuple(int(x) for x in result.algo.data)


def candidates(core, handle: int, limit: int = CANDIDATES) -> list[tuple[str, object]]:
    """``[(label, HeuristicResult)]``: heuristic answers at several workspace limits and for the related forms,
    split-K variants, then the neighbourhood (see the module docstring)."""
    from . import cublaslt as lt

    out: list[tuple[str, object]] = []
    seen: set[tuple[int, ...]] = set()

    def add(label, r):
        k = (_key(r), int(r.workspaceSize))
        if k not in seen:
            seen.add(k)
            out.append((label, r))

    for r in core.algorithms(handle, 256)[:1]:  # the plan's own answer (an untuned plan runs it): the baseline
        add("heuristic #0", r)
    for i, r in enumerate(core.algorithms(handle, 256, limit)):
        add(f"heuristic #{i}" if i else f"heuristic #0 of {limit}", r)
    for ws in _SMALLER_WORKSPACES:
        if ws >= core.max_workspace:
            continue
        pref = lt.Preference(ws, 256)
        for i, r in enumerate(lt.heuristic(handle, core.desc, core.a, core.b, core.c, core.d, pref, limit)):
            add(f"heuristic #{i} (workspace <= {ws >> 20} MiB)", r)
    heuristic = list(out)
    seeds = _seeds(heuristic, limit)
    for form, other in core.related():
        pref = lt.Preference(core.max_workspace, 256)
        answers = lt.heuristic(handle, other.desc, other.a, other.b, other.c, other.d, pref, limit)
        for i, r in enumerate(answers):
            checked = _check(core, handle, r.algo)
            if checked is not None and checked.workspaceSize <= core.max_workspace:
                label = f"heuristic #{i} of the {form}"
                add(label, checked)
                heuristic.append((label, checked))
                if i == 0 and _key(checked) not in {_key(seed) for _, seed in seeds}:  # its first: a seed too
                    seeds.append((label, checked))
    first = [r for _, r in out[:_SPLITK_OF_FIRST]]
    for i, r in enumerate(first):
        for slices in _SPLITK:
            algo = _variant(r.algo, splitk=slices, reduction=_REDUCTION_COMPUTE_TYPE)
            if algo is None:
                break  # the kernel takes no split-K
            checked = _check(core, handle, algo)
            if checked is not None and checked.workspaceSize <= core.max_workspace:
                add(f"heuristic #{i} split-K {slices}", checked)
    for label, algo in _neighbourhood(seeds, heuristic):
        checked = _check(core, handle, algo)
        if checked is not None and checked.workspaceSize <= core.max_workspace:
            add(label, checked)
    return out


def _variant(base, **knobs):
    """A copy of algorithm ``base`` with configuration ``knobs`` (names of :data:`_CONFIG`) set, or None when
    cuBLASLt refuses to set one. Whether the kernel can run it is :func:`_check`'s to say."""
    from . import cublaslt as lt

    config_set = _fns().config_set
    algo = lt.Algo()
    ctypes.memmove(ctypes.byref(algo), ctypes.byref(base), ctypes.sizeof(algo))
    for name, value in knobs.items():
        attr, ctype = _CONFIG[name]
        v = ctype(value)
        if config_set(ctypes.byref(algo), attr, ctypes.byref(v), ctypes.sizeof(v)) != 0:
            return None
    return algo


def _config(algo, name: str) -> int | None:
    """``algo``'s configuration knob ``name`` (of :data:`_CONFIG`), None where cuBLASLt does not tell."""
    attr, ctype = _CONFIG[name]
    v, written = ctype(0), ctypes.c_size_t(0)
    status = _fns().config_get(ctypes.byref(algo), attr, ctypes.byref(v), ctypes.sizeof(v), ctypes.byref(written))
    return v.value if status == 0 else None


def configuration(result) -> dict[str, int | None]:
    """The configuration of algorithm ``result`` (a ``HeuristicResult``): its algorithm id, tile, stages, split-K
    slices, reduction scheme, CTA swizzling, custom option and cluster shape (cuBLASLt's enum values), and the
    workspace it needs — what tells two kernels apart in a benchmark's record."""
    got: dict[str, int | None] = {name: _config(result.algo, name) for name in _CONFIG}
    got["workspace"] = int(result.workspaceSize)
    return got


def _capability_int(algo, attr: int) -> int:
    """An int32 capability of ``algo``'s kernel (0 where cuBLASLt does not tell)."""
    v, written = ctypes.c_int32(0), ctypes.c_size_t(0)
    status = _fns().capability(ctypes.byref(algo), attr, ctypes.byref(v), 4, ctypes.byref(written))
    return v.value if status == 0 else 0


def _capability_ids(algo, attr: int) -> list[int]:
    """A capability that is a list of uint32 ids (tiles, stages) of ``algo``'s kernel."""
    cap = _fns().capability
    written = ctypes.c_size_t(0)
    if cap(ctypes.byref(algo), attr, None, 0, ctypes.byref(written)) != 0 or written.value < 4:
        return []
    ids = (ctypes.c_uint32 * (written.value // 4))()
    if cap(ctypes.byref(algo), attr, ids, ctypes.sizeof(ids), ctypes.byref(written)) != 0:
        return []
    return list(ids)


def _is_neighbour(label: str) -> bool:
    return any(f" {name} " in label for name in ("cluster", "swizzle", "stages", "custom", "tile"))


def _seeds(answers, limit: int) -> list:
    """The first :data:`NEIGHBOURHOOD_SEEDS` distinct answers of ``answers`` (``[(label, HeuristicResult)]``)."""
    seen_ids: set[tuple[int, ...]] = set()
    seeds = []
    for label, r in answers:
        if _key(r) not in seen_ids and len(seeds) < min(NEIGHBOURHOOD_SEEDS, max(1, limit)):
            seen_ids.add(_key(r))
            seeds.append((label, r))
    return seeds


def _neighbourhood(seeds, answers):
    """``(label, algorithm)`` pairs near each of ``seeds`` (``[(label, HeuristicResult)]``): one configuration
    knob changed at a time, and tile with cluster shape; tiles and stages beyond a kernel's short capability lists
    are those of the heuristic's ``answers``. Unchecked: :func:`candidates` checks each."""
    answered = {  # the tiles and stages of the heuristic's own answers
        name: sorted({v for _, r in answers if (v := _config(r.algo, name)) is not None}) for name in ("tile", "stages")
    }
    for label, seed in seeds:
        algo = seed.algo
        tiles, stages = (_capability_ids(algo, cap) for cap in (_CAP_TILE_IDS, _CAP_STAGES_IDS))
        tiles = tiles if len(tiles) <= _MAX_CAP_IDS else answered["tile"]
        stages = stages if len(stages) <= _MAX_CAP_IDS else answered["stages"]
        custom_max = min(max(_capability_int(algo, _CAP_CUSTOM_OPTION_MAX), 0), 15)
        knobs = [("cluster", c) for c in _CLUSTER_SHAPES] + [("swizzle", w) for w in _SWIZZLES]
        knobs += [("stages", st) for st in stages]
        knobs += [("custom", c) for c in range(custom_max + 1)]
        knobs += [("tile", t) for t in tiles]
        for name, value in knobs:
            variant = _variant(algo, **{name: value})
            if variant is not None:
                yield f"{label} {name} {value}", variant
        for t in tiles:
            for c in _CLUSTER_SHAPES:
                variant = _variant(algo, tile=t, cluster=c)
                if variant is not None:
                    yield f"{label} tile {t} cluster {c}", variant


#: launches per timed sample, queued behind a GPU busy-wait so host overhead never shows in the GPU time
_BURST = 5
#: seconds of that busy-wait
_HOLD_SECONDS = 2e-3


def _busy_wait(stream: int, device_index: int, seconds: float) -> bool:
    """Hold ``stream`` busy on the GPU for about ``seconds`` (Torch's sleep kernel), so launches queued after
    it run back to back; False where Torch is not available (then samples include host gaps)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch
        except ImportError:
            return False
    dev = torch.device("cuda", device_index)
    with torch.cuda.stream(torch.cuda.ExternalStream(stream, device=dev)):
        torch.cuda._sleep(max(int(seconds * 2e9), 1))  # clock cycles at ~2 GHz (longer on slower clocks)
    return True


def _on_torch_current_stream(launch, stream: int, device_index: int, iterations: int, burst: int) -> float | None:
    """Median GPU seconds timed with Torch's own events and busy-wait on Torch's current stream (the common
    case of autotune), else None. The raw-handle form below can let the host's per-launch time show for short
    kernels (see ``benchmarks/README.md``); this form, the benchmarks' own, times them as they run."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    current = torch.cuda.current_stream(device_index)
    if int(current.cuda_stream) != int(stream):
        return None
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    with torch.cuda.device(device_index):
        for _ in range(max(1, iterations)):
            torch.cuda._sleep(int(_HOLD_SECONDS * 2e9))  # clock cycles at ~2 GHz
            start.record(current)
            for _ in range(burst):
                launch()
            stop.record(current)
            stop.synchronize()
            samples.append(start.elapsed_time(stop) * 1e-3 / burst)
    return float(statistics.median(samples))


def gpu_seconds(
    launch: Callable[[], None],
    stream: int,
    device_index: int,
    iterations: int = 3,
    burst: int = _BURST,
    busy_wait: bool = True,
) -> float:
    """Median GPU seconds of ``launch()`` (queuing work on ``stream``): CUDA events around bursts of ``burst``
    back-to-back launches queued behind a busy-wait (``busy_wait``: Torch's, imported where installed), so
    small kernels are not timed with the host's gaps."""
    from .runtime import EventTimer

    launch()  # warm-up (and workspace allocation)
    torch_timed = _on_torch_current_stream(launch, stream, device_index, iterations, burst)
    if torch_timed is not None:
        return torch_timed
    with EventTimer() as timer:
        samples = []
        for _ in range(max(1, iterations)):
            if busy_wait:
                _busy_wait(stream, device_index, _HOLD_SECONDS)
            timer.start(stream)
            for _ in range(burst):
                launch()
            samples.append(timer.stop(stream) / burst)
    return float(statistics.median(samples))


@dataclasses.dataclass(frozen=True)
class ResultSample:
    """How :func:`autotune` checks a candidate's result: ``read()`` returns the sample of the result of the
    latest launch (on the host, after the launch finished), ``tolerance(reference_sample)`` the largest
    difference rounding explains; ``shape`` is the result's (to name the element of a disagreement)."""

    read: Callable[[], object]
    tolerance: Callable[[object], float]
    shape: tuple[int, ...] = ()
    problem: str = ""


def _agreeing_best(cands, finalists, seconds, launch, check) -> tuple[int | None, dict[str, str]]:
    """The fastest finalist whose result agrees with the heuristic's first answer's (see the module docstring),
    None when none can be kept; ``{label: why}`` of those rejected on the way (their seconds set to inf)."""
    order = sorted((i for i in finalists if math.isfinite(seconds[i])), key=seconds.__getitem__)
    if not order or order[0] == 0 or check is None:
        return (order[0] if order else None), {}
    try:
        launch(cands[0][1])
        expected = check.read()
        tolerance = check.tolerance(expected)
    except Exception as exc:  # noqa: BLE001 - documented rule: unchecked, the plan keeps its algorithm
        _log.warning("cuBLASLt autotune for %s: the results could not be checked (the heuristic's first answer "
                     "failed: %s); the plan keeps its algorithm", check.problem, exc)
        return None, {}
    rejected: dict[str, str] = {}
    for i in order:
        if i == 0:
            return 0, rejected
        label = cands[i][0]
        try:
            launch(cands[i][1])
            got = check.read()
        except Exception as exc:  # noqa: BLE001 - an algorithm failing now is not kept
            rejected[label] = f"failed when checked: {type(exc).__name__}: {exc}"
            seconds[i] = math.inf
            continue
        bad = disagreement(expected, got, tolerance)
        if bad is None:
            return i, rejected
        where = position(check.shape, bad[1]) if check.shape else f"sample element {bad[1]}"
        rejection = Rejection(label, cands[0][0], bad[0], tolerance, where)
        warn("cuBLASLt autotune", check.problem, rejection)
        rejected[label] = rejection.reason()
        seconds[i] = math.inf
    return None, rejected


def autotune(
    plan,
    launch: Callable[[object], None],
    stream: int,
    iterations: int = 3,
    limit: int = CANDIDATES,
    *,
    max_candidates: int | None = None,
    budget: float | None = None,
    busy_wait: bool = True,
    check: ResultSample | None = None,
):
    """Time every candidate of ``plan`` (``launch(result)`` queues one matmul with it on ``stream``); set and
    record the fastest. Three stages: one short sample of each candidate, then ``iterations`` samples, in turns,
    of the :data:`FINALISTS` fastest and the heuristic's first answer (the baseline, candidate 0); the lowest
    median is the challenger, kept only where fresh samples confirm it beats the baseline (:func:`keeps_challenger`;
    else the baseline is kept). Returns ``[(label, seconds)]`` in candidate order: the baseline's and a
    confirmed challenger's median in the confirmation, another finalist's median, another candidate's one sample
    (inf for a candidate that failed or was not timed). Bounds: the first ``max_candidates`` candidates only, and no
    candidate screened once screening has taken ``budget`` seconds; ``busy_wait``: see :func:`gpu_seconds`;
    ``check``: the winner's result is checked against the heuristic's first answer's (module docstring)."""
    cands = candidates(plan.core, plan.handle, limit)
    found = len(cands)
    if max_candidates is not None:
        cands = cands[: max(1, max_candidates)]
    original = plan.algorithm
    dev = plan.device_index

    def timed(index: int, samples: int, burst: int = _BURST) -> float:
        result = cands[index][1]
        try:
            return gpu_seconds(lambda: launch(result), stream, dev, samples, burst, busy_wait)
        except Exception:  # noqa: BLE001 - an algorithm that fails on these operands is skipped
            return math.inf

    seconds = [math.inf] * len(cands)
    screened = len(cands)
    try:
        if len(cands) > FINALISTS + 1:
            started = time.perf_counter()
            seconds[0] = timed(0, 1)
            # long kernels need no burst to hide the host's launch gaps: screen them with fewer launches
            burst = 1 if seconds[0] > 1e-3 else 2 if seconds[0] > 2e-4 else _BURST
            for i in range(1, len(cands)):
                if budget is not None and time.perf_counter() - started > budget:
                    screened = i
                    break
                seconds[i] = timed(i, 1, burst)
            ranked = sorted((i for i in range(1, len(cands)) if math.isfinite(seconds[i])), key=seconds.__getitem__)
            finalists = [0, *ranked[:FINALISTS]]
        else:
            finalists = list(range(len(cands)))
        samples: dict[int, list[float]] = {i: [] for i in finalists}
        for _ in range(iterations):
            for i in finalists:
                samples[i].append(timed(i, 1))
        for i, got in samples.items():
            seconds[i] = statistics.median(got)
        best, rejected = _agreeing_best(cands, finalists, seconds, launch, check)
        confirmation = ""
        if best is not None and best != 0 and math.isfinite(seconds[best]) and math.isfinite(seconds[0]):
            challenger = cands[best][0]
            ratios, duel = _confirm(timed, best)
            if keeps_challenger(ratios):
                seconds[0], seconds[best] = duel
                confirmation = f"; confirmed over {len(ratios)} rounds, median ratio {statistics.median(ratios):.3f}"
            else:
                seconds[0] = duel[0]
                best = 0
                confirmation = (f"; {challenger} not confirmed (median ratio "
                                f"{statistics.median(ratios) if ratios else math.nan:.3f} over {len(ratios)} rounds, "
                                f"faster in {sum(r < 1 for r in ratios)}): the baseline kept")
    except BaseException:  # interrupted: the shared plan keeps the algorithm it had, not a trial one
        plan.algorithm = original
        raise
    if best is not None and math.isfinite(seconds[best]):
        label, r = cands[best]
        plan.algorithm = r
        record(plan, r, label, seconds[best], rejected)
    else:
        plan.algorithm = original
    _log.debug(
        "cuBLASLt autotune: %d of %d candidates screened (%d in the neighbourhood), %d finalists; kept %s (%.2f us; "
        "the heuristic's first answer %.2f us)%s",
        screened,
        found,
        sum(_is_neighbour(label) for label, _ in cands),
        len(finalists),
        cands[best][0] if best is not None and math.isfinite(seconds[best]) else "the plan's algorithm",
        seconds[best] * 1e6 if best is not None else math.inf,
        seconds[0] * 1e6 if cands else math.inf,
        confirmation,
    )
    return [(label, t) for (label, _), t in zip(cands, seconds)]


def _confirm(timed: Callable[[int, int], float], best: int) -> tuple[list[float], tuple[float, float]]:
    """:data:`CONFIRM_ROUNDS` fresh samples of candidate ``best`` and of the baseline (candidate 0) in turns, the
    order alternating (neither always follows the other): the per-round ratios ``best / baseline`` and the two
    medians. A round where either failed has no ratio."""
    ratios, samples = [], ([], [])
    for r in range(CONFIRM_ROUNDS):
        got = {i: timed(i, 1) for i in ((0, best) if r % 2 == 0 else (best, 0))}
        samples[0].append(got[0])
        samples[1].append(got[best])
        if math.isfinite(got[0]) and math.isfinite(got[best]) and got[0] > 0:
            ratios.append(got[best] / got[0])
    return ratios, (statistics.median(samples[0]), statistics.median(samples[1]))


def keeps_challenger(ratios: list[float], min_gain: float = MIN_GAIN, wins: int = CONFIRM_WINS) -> bool:
    """Whether a challenger whose confirmation rounds gave ``ratios`` (its seconds over the baseline's, one per
    round; a round where either failed has none, and counts as lost) replaces the baseline: faster in at least
    ``wins`` rounds and a median ratio at most ``1 - min_gain``.

    Examples
    --------
    >>> keeps_challenger([0.90, 0.91, 0.89, 0.90, 0.92, 0.90, 0.91])  # 10% faster every round
    True
    >>> keeps_challenger([0.999, 0.998, 1.001, 0.999, 0.997, 1.000, 0.999])  # equal within noise
    False
    >>> keeps_challenger([0.80, 1.30, 0.85, 1.25, 0.82, 1.20, 0.90])  # a low median, but it loses 3 rounds
    False
    """
    if not ratios:
        return False
    faster = sum(r < 1 for r in ratios)
    return faster >= wins and statistics.median(ratios) <= 1 - min_gain


_ENV = an_object(
    {"gpu": a_string(), "cc": a_string(), "driver": an_int(0), "cublaslt": an_int(0)},
    required=("gpu", "cc", "driver", "cublaslt"),
)
_CHOICE = {
    "env": _ENV,
    "data": ints(8, 0, (1 << 64) - 1),  # cublasLtMatmulAlgo_t: uint64_t data[8]
    "ws": an_int(0),
    "label": a_string(),
    "seconds": a_number(optional=True),
    "rejected": strings_by_name(),
}


def validate_choice(value) -> str | None:
    """Why ``value`` is no record of :func:`record` (``env``, ``data``, ``ws``; ``label``, ``seconds``), or None."""
    return check_object(value, _CHOICE, required=("env", "data", "ws"))


def record(plan, result, label: str = "", seconds: float | None = None, rejected: dict | None = None) -> dict:
    """Record ``result`` as ``plan``'s tuned algorithm (for later plans and ``plan_cache.save``); ``rejected``:
    the candidates whose results disagreed, and why."""
    choice = {
        "env": environment(plan.device_index),
        "data": list(_key(result)),
        "ws": int(result.workspaceSize),
        "label": label,
        "seconds": seconds,
    }
    if rejected:
        choice["rejected"] = dict(rejected)
    plan.tuned = choice
    plan_cache.record_tuning(tuning_key(plan), choice, TUNING_KIND)
    return choice


def saved_choice(plan, tuning=None):
    """The recorded algorithm for ``plan`` on this machine (validated by cuBLASLt), else None.

    ``tuning`` is what the plan cache handed the executor for the plan's key (a record of :func:`record`
    saved by an older layout); it is used only when made on this machine.
    """
    from . import cublaslt as lt

    if tuning is not None:
        require_valid(plan, tuning)
    env = environment(plan.device_index)
    choice = plan_cache.tuning_for(tuning_key(plan))
    if not _usable(choice, env) and _usable(tuning, env):
        choice = tuning
    if not _usable(choice, env):
        return None
    algo = lt.Algo()
    for i, x in enumerate(choice["data"][:8]):
        algo.data[i] = int(x)
    checked = _check(plan.core, plan.handle, algo)
    if checked is None or checked.workspaceSize > plan.core.max_workspace:
        return None
    plan.tuned = choice
    return checked


def _usable(choice, env) -> bool:
    return isinstance(choice, dict) and choice.get("env") == env and isinstance(choice.get("data"), list)
