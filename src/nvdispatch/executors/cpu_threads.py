"""The CPU executor's threads: how many cores this process may use, and its worker pools (one per purpose,
made on first use and shared by every call)."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

__all__ = ["CPUS", "pool"]

#: cores this process may run on (its affinity where the OS tells it)
CPUS = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
_POOLS: dict[str, ThreadPoolExecutor] = {}
_LOCK = threading.Lock()


def pool(purpose: str, workers: int) -> ThreadPoolExecutor:
    """The shared pool for ``purpose`` (its threads are named after it), made with ``workers`` threads."""
    p = _POOLS.get(purpose)
    if p is None:
        with _LOCK:
            p = _POOLS.get(purpose)
            if p is None:
                p = _POOLS[purpose] = ThreadPoolExecutor(max(1, workers), thread_name_prefix=f"nvdispatch-{purpose}")
    return p
