"""The CPU executor's threads: how many cores this process may use, and the worker pool its plans share.

A call that spreads its work over the cores runs one share itself and hands the others to the pool's
workers. The pool is built so that an interrupt (``KeyboardInterrupt``, or any exception a signal handler or
trace function raises in the calling thread) can never leave it unusable: its workers are started once, take
work from a ``queue.SimpleQueue`` and answer on another, and the calling thread takes no lock of its own on
the way (``SimpleQueue.put`` is reentrant, ``get`` interruptible). An interrupted caller stops waiting; the
shares it handed out still run to the end (into memory only that call saw) and the workers go on serving
later calls. ``concurrent.futures`` pools do not promise that: an interrupt inside their submission lock
leaves it held, and every later submission waits forever.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

try:  # the C queue itself: ``queue`` would import heapq and its Queue class along
    from _queue import SimpleQueue
except ImportError:  # pragma: no cover - another Python
    from queue import SimpleQueue

__all__ = ["CPUS", "WorkerPool", "pool"]

#: cores this process may run on (its affinity where the OS tells it)
CPUS = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


class WorkerPool:
    """``workers`` daemon threads running the shares that :meth:`run` hands them."""

    def __init__(self, workers: int, name: str = "nvdispatch-cpu"):
        self.workers = max(0, int(workers))
        self.pid = os.getpid()
        self._tasks: SimpleQueue = SimpleQueue()
        for i in range(self.workers):
            threading.Thread(target=_serve, args=(self._tasks,), name=f"{name}-{i}", daemon=True).start()

    def run(self, fn: Callable[[Any], Any], shares: Sequence[Any]) -> list[Any]:
        """``[fn(share) for share in shares]``, the first share on the calling thread, the others on the
        workers at the same time. An exception of any share is raised once all have ended (the first one's)."""
        if not shares:
            return []
        answers: SimpleQueue = SimpleQueue()
        handed = shares[1:] if self.workers else ()
        for i, share in enumerate(handed, 1):
            self._tasks.put((fn, share, i, answers))
        results: list[Any] = [None] * len(shares)
        failure: BaseException | None = None
        try:
            results[0] = fn(shares[0])
            for i in range(len(handed) + 1, len(shares)):  # (a pool without workers: the caller does all)
                results[i] = fn(shares[i])
        except Exception as exc:  # the others' shares still read the caller's arrays: wait for them first
            failure = exc
        for _ in handed:
            i, ok, value = answers.get()
            if ok:
                results[i] = value
            elif failure is None:
                failure = value
        if failure is not None:
            raise failure
        return results


def _serve(tasks: SimpleQueue) -> None:
    while True:
        fn, share, index, answers = tasks.get()
        try:
            answers.put((index, True, fn(share)))
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller, who raises it
            answers.put((index, False, exc))
        del fn, share, answers  # hold no reference to a finished call's arrays while waiting


_POOLS: dict[str, WorkerPool] = {}
_LOCK = threading.Lock()


def pool(purpose: str, workers: int) -> WorkerPool:
    """The shared pool for ``purpose`` (its threads are named after it), made with ``workers`` threads on
    first use (in a forked child: made again, the parent's threads do not exist there)."""
    p = _POOLS.get(purpose)
    if p is None or p.pid != os.getpid():
        # on one line: no line event (where a trace function may raise) between taking and leaving the lock
        with _LOCK: p = _made(purpose, workers)  # noqa: E701 # fmt: skip
    return p


def _made(purpose: str, workers: int) -> WorkerPool:
    p = _POOLS.get(purpose)
    if p is None or p.pid != os.getpid():
        p = _POOLS[purpose] = WorkerPool(workers, f"nvdispatch-{purpose}")
    return p
