"""Scratch device memory (library workspaces, temporaries) through the caller's allocator.

:func:`scratch` returns a :class:`Scratch` whose memory comes from

* the Torch caching allocator when the caller's framework is Torch (a ``uint8`` tensor; the allocator
  reuses a block only in its stream's order),
* CuPy's memory pool when it is CuPy (same stream-ordered reuse),
* ``cudaMallocAsync`` on the stream otherwise, released with ``cudaFreeAsync`` on that same stream.

So dropping a :class:`Scratch` (or calling :meth:`Scratch.release`) right after queueing work that uses it
is safe: the memory is recycled only after the work queued before the release on that stream.
"""

from __future__ import annotations

from typing import Any

from .._adapter_registry import adapter_named
from . import runtime

__all__ = ["Scratch", "scratch"]


class Scratch:
    """A device buffer of ``nbytes`` bytes at ``ptr``, tied to ``stream``."""

    __slots__ = ("ptr", "nbytes", "stream", "_owner", "_raw")

    def __init__(self, ptr: int, nbytes: int, stream: int, owner: Any = None, raw: bool = False):
        self.ptr, self.nbytes, self.stream, self._owner, self._raw = ptr, nbytes, stream, owner, raw

    def release(self) -> None:
        """Give the memory back in stream order (idempotent)."""
        if self._raw and self.ptr:
            try:
                runtime.free_async(self.ptr, self.stream)
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass
        self.ptr, self._owner, self._raw = 0, None, False

    def __del__(self):
        self.release()


def scratch(nbytes: int, framework: str, device_index: int, stream: int) -> Scratch:
    """``nbytes`` of device memory for work queued on ``stream`` (see the module docstring)."""
    nbytes = int(nbytes)
    if nbytes <= 0:
        return Scratch(0, 0, stream)

    ad = adapter_named(framework)
    got = None if ad is None else ad.scratch(nbytes, device_index, stream)
    if got is not None:  # the framework's stream-ordered allocator
        ptr, owner = got
        return Scratch(ptr, nbytes, stream, owner)
    return Scratch(runtime.malloc_async(nbytes, stream), nbytes, stream, raw=True)
