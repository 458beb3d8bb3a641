"""Holding NumPy's BLAS to one thread while nvdispatch runs several BLAS calls side by side.

The row-panel engine (``numpy_matmul_panels``) multiplies panels of rows on all cores at once, one thread
each; a BLAS that also spreads each call over every core would run cores x cores threads and lose. NumPy
offers no per-call thread count, so this module finds the OpenBLAS that NumPy loaded and sets its thread
count to 1 while at least one such run is under way, then back to what it was (a count of users, under a
lock, so overlapping runs from several threads restore it once, at the end).

This is process state: a BLAS call made by another thread *during* such a run also runs on one thread
(correct, possibly slower), and a thread count set by someone else during a run is undone at its end.
Where no OpenBLAS is found (MKL, Accelerate, a platform without ``/proc``), :func:`controllable` is False and
the engine runs its panels one after another with the BLAS's own threads.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import threading
import time

__all__ = ["controllable", "single_threaded", "let_workers_sleep", "SETTLE_SECONDS"]

#: OpenBLAS's worker threads busy-wait (yielding) for its THREAD_TIMEOUT, about 0.1 s, after each threaded call
#: before they sleep, taking CPU from the call that follows (docs/notes/cpu-matmul.md)
SETTLE_SECONDS = 0.15

#: (setter, getter) symbol pairs of OpenBLAS builds: the scipy-openblas wheels NumPy ships (64-bit and 32-bit
#: integer interfaces), then a plain OpenBLAS
_SYMBOLS = (
    ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
    ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
    ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
    ("openblas_set_num_threads", "openblas_get_num_threads"),
)
_lock = threading.Lock()
_users = 0
_saved: int | None = None


@functools.cache
def _numpy_openblas():
    """(set, get) of the OpenBLAS NumPy loaded, or None."""
    import numpy as np

    here = os.path.dirname(os.path.dirname(os.path.abspath(np.__file__)))
    candidates = []
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                path = line.split()[-1]
                name = os.path.basename(path).lower()
                if "openblas" in name and path.startswith("/") and path not in candidates:
                    candidates.append(path)
    except OSError:
        return None
    # NumPy's own copy first (wheels bundle it beside the package); another OpenBLAS (SciPy's) is not the one
    candidates.sort(key=lambda path: not path.startswith(os.path.join(here, "numpy")))
    for path in candidates:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for set_name, get_name in _SYMBOLS:
            setter, getter = getattr(lib, set_name, None), getattr(lib, get_name, None)
            if setter is not None and getter is not None:
                setter.argtypes, setter.restype, getter.restype = [ctypes.c_int], None, ctypes.c_int
                return setter, getter
    return None


def controllable() -> bool:
    """Whether NumPy's BLAS thread count can be held to one here."""
    return _numpy_openblas() is not None


@contextlib.contextmanager
def single_threaded():
    """NumPy's BLAS on one thread for the duration (nested and concurrent uses are fine)."""
    global _users, _saved
    blas = _numpy_openblas()
    if blas is None:
        yield
        return
    setter, getter = blas
    with _lock:
        if _users == 0:
            _saved = getter()
            if _saved != 1:
                setter(1)
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0 and _saved != 1:
                setter(_saved)


def let_workers_sleep() -> None:
    """Wait until the worker threads a threaded BLAS call left spinning have gone to sleep, so that what is
    timed next has the cores to itself (every CPU timing that follows other threaded work pauses here)."""
    time.sleep(SETTLE_SECONDS)
