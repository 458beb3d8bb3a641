"""How many threads SciPy's pocketfft runs a CPU transform on: predicted from the transform's work by a threshold
calibrated once per machine (kept with the CPU calibration), never timed on a caller's call.

pocketfft splits a batched or n-D transform over ``workers`` threads. Threads pay off only once the work
outweighs waking and joining them, and where that happens depends on the machine. The model: a transform's
*work* (elements transformed x log2 of the transform's length; twice that in double precision, half for
real transforms) against this machine's threshold: at or above it, every core; below, one thread.

:func:`calibrate` finds the threshold: it times a ladder of transforms of growing work (batched 1-D and square
2-D, single precision) on one thread and on all cores, interleaved round by round (the fastest round of each
counts: load only ever adds time), and takes the smallest work from which all cores win on every rung above.
``python -m nvdispatch calibrate`` runs it and keeps the threshold with the CPU calibration
(``cpu_calibration_store``); until then :data:`DEFAULT_MIN_WORK` holds, which threads only transforms large
enough that waking threads is cheap next to them on any machine. Where all cores win on no rung (a busy
machine), the threshold is set just past the ladder's top, not to "never".

Two cases need no model: a single 1-D transform (pocketfft cannot split it) runs on one thread, and one
whose transformed axes alone hold more than :data:`MAX_ELEMENTS` elements on every core.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable

import numpy as np

from .._fft_problem import FFTProblem
from .cpu_calibration_store import store
from .cpu_threads import CPUS
from .numpy_matmul_calibration import seconds_per_call

__all__ = ["Model", "model", "workers_for", "work", "calibrate", "clear"]
__all__ += ["ALL_CORES", "DEFAULT_MIN_WORK", "MAX_ELEMENTS"]

#: SciPy's ``workers`` value for "every core this process may use"
ALL_CORES = -1
#: transforms whose transformed axes hold more elements than this run on every core, whatever the model says
MAX_ELEMENTS = 1 << 20
#: the threshold taken until this machine's is measured
DEFAULT_MIN_WORK = float(1 << 22)
#: the calibration's ladder: works from 2**10 to 2**24, two shapes of transform per rung
_LADDER = tuple(range(10, 25))
_ROUNDS, _ROUND_SECONDS = 7, 2e-3
#: all cores must beat one thread by this factor to count as a win (noise is not a win)
_MARGIN = 0.95
_SECTION, _ENTRY = "fft", "threads"
_log = logging.getLogger("nvdispatch")
_lock = threading.Lock()
_models: dict[str | None, Model] = {}


@dataclasses.dataclass(frozen=True)
class Model:
    """Threads for transforms of work at least ``min_work`` (``inf``: never); ``source`` as for the matmul
    rankings: ``"persisted"``, ``"fresh"`` or ``"default"``."""

    min_work: float
    source: str
    where: str | None = None

    def describe(self, workers: int) -> str:
        how = "on all cores" if workers != 1 else "on one thread"
        if self.source == "default":
            why = "by the default threshold (python -m nvdispatch calibrate measures this machine's own)"
        elif self.source == "fresh":
            why = "by the threshold this process measured"
        else:
            why = f"by this machine's calibrated threshold (kept in {self.where})"
        return f"pocketfft {how}: predicted faster for this transform's work {why}"


def model() -> Model:
    """The threshold in force: this process's measurement, else the store's, else the default."""
    kept = store()
    got = _models.get(kept.path)
    if got is not None:
        return got
    entry = kept.get(_SECTION, _ENTRY)
    min_work = entry.get("min_work") if isinstance(entry, dict) else None
    if isinstance(min_work, (int, float)) and not isinstance(min_work, bool) and min_work > 0:
        got = Model(float(min_work), "persisted", kept.path)
    else:
        got = Model(DEFAULT_MIN_WORK, "default", kept.path)
    with _lock:
        return _models.setdefault(kept.path, got)


def work(problem: FFTProblem) -> float:
    """The transform's work: elements transformed x log2(transform length), x2 in double precision, /2 real."""
    shape = tuple(problem.shape)
    axes = {a % len(shape) for a in problem.axes} if shape else set()
    batch = math.prod(shape[d] for d in range(len(shape)) if d not in axes)
    length = math.prod(problem.lengths)
    units = batch * length * math.log2(max(2, length))
    if np.dtype(problem.compute_dtype).itemsize > 8:  # complex128
        units *= 2
    return units / 2 if problem.kind != "c2c" else units


def workers_for(problem: FFTProblem) -> tuple[int, str]:
    """``(workers, why)`` for pocketfft on ``problem``: 1 or :data:`ALL_CORES`, and a line for ``explain()``."""
    shape = tuple(problem.shape)
    axes = {a % len(shape) for a in problem.axes} if shape else set()
    if CPUS == 1:
        return 1, "pocketfft on one thread: this process may use one core"
    if len(axes) == 1 and math.prod(shape[d] for d in range(len(shape)) if d not in axes) <= 1:
        return 1, "pocketfft on one thread: a single 1-D transform cannot be split"
    if math.prod(problem.lengths) > MAX_ELEMENTS:
        return ALL_CORES, "pocketfft on all cores: a transform this large gains on any machine"
    m = model()
    workers = ALL_CORES if work(problem) >= m.min_work else 1
    return workers, m.describe(workers)


def calibrate(progress: Callable[[Iterable], Iterable] = lambda it: it, persist: bool = True) -> Model:
    """Measure this machine's threshold now (see the module notes); remember it for this process and
    (``persist``) keep it in the store. ``progress`` wraps the ladder's iterable (a progress bar)."""
    kept = store()
    if CPUS == 1:
        got = Model(math.inf, "fresh", kept.path if persist else None)
    else:
        from scipy.fft import _pocketfft

        wins: list[tuple[float, bool]] = []
        for rung in progress(_LADDER):
            for x, fn in _rung(rung, _pocketfft):
                one, every = _time_both(fn, x)
                wins.append((_work_of(x, fn), every < _MARGIN * one))
        wins.sort()
        min_work = 2 * wins[-1][0]  # beyond the ladder, threads are taken to pay (waking them is cheap there)
        for i in range(len(wins) - 1, -1, -1):  # the smallest work from which every larger one wins
            if not wins[i][1]:
                break
            min_work = wins[i][0] if i == 0 else math.sqrt(wins[i][0] * wins[i - 1][0])
        got = Model(min_work, "fresh", kept.path if persist else None)
        _log.debug("numpy fft calibration: threads from work %.3g (%s)", min_work, wins)
    if persist:
        kept.update(_SECTION, {_ENTRY: {"min_work": got.min_work if math.isfinite(got.min_work) else 1e300}})
    with _lock:
        _models.clear()
        _models[kept.path] = got
    return got


def clear() -> None:
    """Forget this process's threshold (the next plan asks the store again)."""
    with _lock:
        _models.clear()
    store().forget()


def _rung(log2_work: int, pocketfft) -> list[tuple[np.ndarray, Callable]]:
    """Two transforms of work about 2**log2_work: a batch of 256-point 1-D ffts, and a square 2-D one."""
    rows = max(2, round(2.0**log2_work / (256 * 8)))
    side = 2
    while (side * side) * math.log2(side * side) < 2.0**log2_work:
        side *= 2
    batched = np.zeros((rows, 256), np.complex64)
    square = np.zeros((side, side), np.complex64)
    return [
        (batched, functools.partial(pocketfft.fft, axis=-1)),
        (square, functools.partial(pocketfft.fftn, axes=(-2, -1))),
    ]


def _work_of(x: np.ndarray, fn: functools.partial) -> float:
    axes = fn.keywords.get("axes", (fn.keywords.get("axis", -1),))
    length = math.prod(x.shape[a] for a in axes)
    return x.size * math.log2(max(2, length))


def _time_both(fn: Callable, x: np.ndarray) -> tuple[float, float]:
    one = functools.partial(fn, x, workers=1)
    every = functools.partial(fn, x, workers=ALL_CORES)
    one(), every()  # warm-up: pocketfft's own plan, the thread pool
    t0 = time.perf_counter()
    one()
    calls = max(1, int(_ROUND_SECONDS / max(time.perf_counter() - t0, 1e-7)))
    best = [math.inf, math.inf]
    for _ in range(_ROUNDS):
        best[0] = min(best[0], seconds_per_call(one, calls))
        best[1] = min(best[1], seconds_per_call(every, calls))
    return best[0], best[1]
