"""Whether another thread of this process is running right now: what decides, per call, between an engine that
starts threads of its own and one that runs on the BLAS's threads (``numpy_matmul_contended``).

An engine that spreads a call over threads it starts (the tiled GEMM) is the fastest where the cores are free,
and loses a core where another thread of the process is busy: a BLAS's worker still spinning after its last
threaded call (OpenBLAS's spin for ~0.1 s, ``blas_threads.SETTLE_SECONDS``), a user's thread in compiled code.
The BLAS-based engine loses much less to its own spinning worker. So the calibration keeps both answers where
they differ, and the call asks :func:`running_threads` (``_hotpath.running_threads``: the threads in state R in
``/proc/self/task/*/stat``, the caller left out) which one applies. Where the OS does not say (no ``/proc``, or
the extension is not built) the answer is None: the cores are taken as free.

A thread of pure Python code that is back waiting for the GIL the caller holds reads as sleeping (it runs once
the call lets the GIL go): it is seen only until then (before most calls of a long engine, which it runs beside).
"""

from __future__ import annotations

import functools
import time

from .._compiled import hotpath

__all__ = ["running_threads", "probe", "probe_seconds"]


def probe():
    """The compiled look (``_hotpath.running_threads``: ``() -> int | None``), or None where the extension is not
    built (then nothing is looked at: every call takes the cores as free)."""
    return getattr(hotpath(), "running_threads", None)


def running_threads() -> int | None:
    """How many threads of this process other than the caller are running or waiting for a CPU now; None where
    the OS does not say.

    >>> n = running_threads()
    >>> n is None or n >= 0
    True
    """
    look = probe()
    return None if look is None else look()


@functools.cache
def probe_seconds() -> float:
    """Seconds one look takes here (the fastest of a few; 0.0 where there is nothing to look at): the
    calibration keeps two answers only for calls that take many times longer."""
    look = probe()
    if look is None:
        return 0.0
    best = float("inf")
    for _ in range(20):
        t0 = time.perf_counter()
        look()
        best = min(best, time.perf_counter() - t0)
    return best
