"""The CPU's per-core cache size, read from the operating system where it says (never assumed).

The row-panel engine (``numpy_matmul_panels``) sizes its panels from it: a panel of the result that fits a
core's private cache can get its epilog while still there. Where the system does not say, None, and the
engine falls back on a few fixed candidates that autotuning tries.
"""

from __future__ import annotations

import functools
import os

__all__ = ["private_cache_bytes"]

_SYSFS = "/sys/devices/system/cpu/cpu0/cache"


@functools.cache
def private_cache_bytes() -> int | None:
    """Bytes of the largest cache private to one core (L2 on most CPUs), or None when unknown."""
    return _from_sysfs() or _from_sysconf()


def _from_sysfs() -> int | None:
    try:
        entries = sorted(e for e in os.listdir(_SYSFS) if e.startswith("index"))
    except OSError:
        return None
    best = None
    for entry in entries:
        path = os.path.join(_SYSFS, entry)
        try:
            kind = _read(path, "type")
            level = int(_read(path, "level"))
            size = _size(_read(path, "size"))
            shared = _read(path, "shared_cpu_list")
        except (OSError, ValueError):
            continue
        if kind == "Instruction" or level < 2 or _cpus_in(shared) > 1:
            continue  # (an L3 shared by all cores is no place to keep a panel per core)
        if best is None or size > best:
            best = size
    return best


def _from_sysconf() -> int | None:
    try:
        size = os.sysconf("SC_LEVEL2_CACHE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return size if size > 0 else None


def _read(path: str, name: str) -> str:
    with open(os.path.join(path, name)) as fh:
        return fh.read().strip()


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def _cpus_in(cpu_list: str) -> int:
    """How many CPUs a sysfs list such as ``0-3,8`` names."""
    count = 0
    for part in cpu_list.split(","):
        lo, _, hi = part.partition("-")
        count += int(hi or lo) - int(lo) + 1
    return count
