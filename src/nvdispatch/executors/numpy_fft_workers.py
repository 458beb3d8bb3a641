"""How many threads SciPy's pocketfft runs a CPU transform on: measured once per process and shape, never assumed.

pocketfft splits a batched or n-D transform over ``workers`` threads. Threads pay off only once the work outweighs
waking and joining them, and where the crossover lies depends on the machine and its load (``docs/notes/fft.md`` has one
machine's figures). So the first plan of a transform shape times it both ways on a zero array of that shape, interleaved
round by round (the fastest round of each counts: load only ever adds time), and keeps the faster; later plans of the
shape reuse the answer.

A shape with more than :data:`MAX_ELEMENTS` elements is timed on a copy with fewer batch rows (the dimensions not
transformed), which keeps every transformed length; where the transformed axes alone hold more than that, the transform
runs on every core untimed: waking the threads is then a small part of a run. A single 1-D transform, which pocketfft
cannot split, runs on one thread.

:func:`measurements` shows the timings, :func:`clear` forgets them (tests, or after changing thread counts).
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .._fft_problem import FFTProblem
from .numpy_matmul_calibration import fastest_seconds, seconds_per_call

__all__ = ["workers_for", "measurements", "clear", "MAX_ELEMENTS", "ALL_CORES"]

#: shapes up to this many elements are timed as they are; larger ones with fewer batch rows
MAX_ELEMENTS = 1 << 20
#: SciPy's ``workers`` value for "every core this process may use"
ALL_CORES = -1
#: seconds of repeated calls per setting per round; rounds at least and at most, and the time they may take
_ROUND_SECONDS = 2e-3
_MIN_ROUNDS, _MAX_ROUNDS = 3, 7
_BUDGET_SECONDS = 0.25

_lock = threading.Lock()
_measured: dict[tuple, dict[str, Any]] = {}


def workers_for(problem: FFTProblem, fn: Callable, kwargs: dict[str, Any]) -> int:
    """``workers`` for ``fn(x, **kwargs, workers=...)`` on ``problem``'s input: 1 or :data:`ALL_CORES`."""
    shape = tuple(problem.shape)
    axes = tuple(a % len(shape) for a in problem.axes) if shape else ()
    batch = [d for d in range(len(shape)) if d not in axes]
    transformed = math.prod(shape[a] for a in axes)
    if len(axes) == 1 and math.prod(shape[d] for d in batch) <= 1:
        return 1  # one 1-D transform: nothing to split
    if transformed > MAX_ELEMENTS:
        return ALL_CORES
    shape = _fewer_batch_rows(shape, batch)
    key = (problem.func, problem.dtype, shape, axes, tuple(sorted(kwargs.items())))
    with _lock:
        known = _measured.get(key)
    if known is None:
        known = _measure(fn, np.zeros(shape, dtype=problem.dtype), kwargs)
        with _lock:
            known = _measured.setdefault(key, known)
    return known["workers"]


def measurements() -> dict[str, dict[str, Any]]:
    """The timings taken so far: ``"func dtype shape axes"`` -> seconds per call on one thread and on all cores,
    and the choice."""
    with _lock:
        return {f"{k[0]} {k[1]} {k[2]} axes={k[3]}": dict(v) for k, v in _measured.items()}


def clear() -> None:
    """Forget every timing (plans made from now on measure again)."""
    with _lock:
        _measured.clear()


def _fewer_batch_rows(shape: tuple[int, ...], batch: list[int]) -> tuple[int, ...]:
    """``shape`` with its batch dimensions cut (largest first) until it holds at most :data:`MAX_ELEMENTS`."""
    shape = list(shape)
    for d in sorted(batch, key=lambda d: -shape[d]):
        total = math.prod(shape)
        if total <= MAX_ELEMENTS:
            break
        shape[d] = max(1, shape[d] * MAX_ELEMENTS // total)
    return tuple(shape)


def _measure(fn: Callable, x: np.ndarray, kwargs: dict[str, Any]) -> dict[str, Any]:
    runs = {
        "one_thread": functools.partial(fn, x, **kwargs, workers=1),
        "all_cores": functools.partial(fn, x, **kwargs, workers=ALL_CORES),
    }
    for run in runs.values():  # warm-up: pocketfft's own plan, the thread pool
        run()
    calls = max(1, int(_ROUND_SECONDS / max(fastest_seconds(runs["one_thread"], 1), 1e-7)))
    best = dict.fromkeys(runs, math.inf)
    start = time.perf_counter()
    for rounds in range(1, _MAX_ROUNDS + 1):
        for name, run in runs.items():
            best[name] = min(best[name], seconds_per_call(run, calls))
        if rounds >= _MIN_ROUNDS and time.perf_counter() - start > _BUDGET_SECONDS:
            break
    choice = 1 if best["one_thread"] <= best["all_cores"] else ALL_CORES
    return {"one_thread_s": best["one_thread"], "all_cores_s": best["all_cores"], "workers": choice}
