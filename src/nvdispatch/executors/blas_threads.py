"""Holding NumPy's BLAS to one thread while nvdispatch runs several BLAS calls side by side.

The row-panel engine (``numpy_matmul_panels``) multiplies panels of rows on all cores at once, one thread
each; a BLAS that also spreads each call over every core would run cores x cores threads and lose. NumPy
offers no per-call thread count, so this module finds the OpenBLAS that NumPy loaded and sets its thread
count to 1 while at least one such run is under way, then back to what it was.

This is process state: a BLAS call made by another thread *during* such a run also runs on one thread
(correct, possibly slower), and a thread count set by someone else during a run is undone at its end.
Where no OpenBLAS is found (MKL, Accelerate, a platform without ``/proc``), :func:`controllable` is False and
the engine runs its panels one after another with the BLAS's own threads.

Interrupts: a run is held by a token only it references (weakly held here), so a run that an interrupt stops
before it could say it ended stops holding when its frame goes; the thread count it left at 1 is restored
when the next run ends. No lock is ever taken outside a ``with`` block of a C lock.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import time
import weakref

from . import numpy_blas

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
_holders: weakref.WeakSet = weakref.WeakSet()  # one token per run under way, alive while its run is
_saved: int | None = None  # the thread count nvdispatch replaced by 1, while it is replaced


class _Token:
    __slots__ = ("__weakref__",)


@functools.cache
def _numpy_openblas():
    """(set, get) of the OpenBLAS NumPy loaded (``numpy_blas.library``), or None."""
    lib = numpy_blas.library()
    if lib is None:
        return None
    for set_name, get_name in _SYMBOLS:
        setter, getter = getattr(lib, set_name, None), getattr(lib, get_name, None)
        if setter is not None and getter is not None:
            setter.argtypes, setter.restype, getter.restype = [ctypes.c_int], None, ctypes.c_int
            return setter, getter
    return None


def controllable() -> bool:
    """Whether NumPy's BLAS thread count can be held to one here."""
    return _numpy_openblas() is not None


class single_threaded:
    """``with single_threaded():`` NumPy's BLAS on one thread for the duration (nested and concurrent uses
    are fine)."""

    __slots__ = ("_token",)

    def __init__(self) -> None:
        self._token = None

    def __enter__(self) -> single_threaded:
        blas = _numpy_openblas()
        if blas is not None:
            token = self._token = _Token()
            # on one line: no line event (where a trace function may raise) between taking and leaving the lock
            with _lock: _hold(token, blas)  # noqa: E701 # fmt: skip
        return self

    def __exit__(self, *exc: object) -> None:
        token, self._token = self._token, None
        if token is not None:
            with _lock: _let_go(token)  # noqa: E701 # fmt: skip


def _hold(token: _Token, blas) -> None:
    global _saved
    setter, getter = blas
    if _saved is None:
        current = getter()
        if current != 1:
            _saved = current
            setter(1)
    _holders.add(token)


def _let_go(token: _Token) -> None:
    global _saved
    _holders.discard(token)
    if not _holders and _saved is not None:
        _numpy_openblas()[0](_saved)
        _saved = None


def let_workers_sleep() -> None:
    """Wait until the worker threads a threaded BLAS call left spinning have gone to sleep, so that what is
    timed next has the cores to itself (every CPU timing that follows other threaded work pauses here)."""
    time.sleep(SETTLE_SECONDS)
