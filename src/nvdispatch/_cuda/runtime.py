"""cuda-bindings runtime helpers: availability, error checks, stream-ordered memory, small device-to-host
copies, event timing.

All functions import ``cuda.bindings`` on first use; :func:`unavailable` says, without raising, why they
cannot work here.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import CudaRuntimeError, ExecutorUnavailableError

T = TypeVar("T")

__all__ = [
    "on_device",
    "unavailable",
    "cudart",
    "check",
    "device_count",
    "current_device",
    "malloc_async",
    "free_async",
    "pointer_device",
    "synchronize",
    "bind_context",
    "copy_to_host",
    "EventTimer",
]


@functools.lru_cache(maxsize=1)
def _probe() -> tuple[Any, str | None]:
    try:
        from cuda.bindings import runtime as rt
    except ImportError:
        return None, "cuda-bindings is not installed (pip install 'nvdispatch[cuda]')"
    try:
        err, count = rt.cudaGetDeviceCount()
    except Exception as exc:  # noqa: BLE001 - a broken driver install
        return None, f"the CUDA runtime failed to start ({exc})"
    if err != rt.cudaError_t.cudaSuccess or count == 0:
        return None, "no CUDA device"
    return rt, None


def unavailable() -> str | None:
    """``None`` when cuda-bindings is importable and a CUDA device is visible, else the reason."""
    return _probe()[1]


def cudart():
    """The ``cuda.bindings.runtime`` module (raises :class:`ExecutorUnavailableError` when unusable)."""
    rt, why = _probe()
    if rt is None:
        raise ExecutorUnavailableError("device", "a CUDA device with cuda-bindings installed", why)
    return rt


def check(result, what: str):
    """Unpack a cuda-bindings ``(err, *values)`` tuple; raise :class:`~nvdispatch.errors.CudaRuntimeError`
    naming ``what`` on failure."""
    rt = cudart()
    if isinstance(result, tuple):
        err, values = result[0], result[1:]
    else:
        err, values = result, ()
    if err != rt.cudaError_t.cudaSuccess:
        _, name = rt.cudaGetErrorName(err)
        name = name.decode() if isinstance(name, bytes) else str(name)
        raise CudaRuntimeError(what, int(getattr(err, "value", err)), name)
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def device_count() -> int:
    rt, why = _probe()
    return 0 if rt is None else check(rt.cudaGetDeviceCount(), "cudaGetDeviceCount")


def current_device() -> int:
    return check(cudart().cudaGetDevice(), "cudaGetDevice")


def malloc_async(nbytes: int, stream: int) -> int:
    """``cudaMallocAsync`` on ``stream`` (a raw handle); returns the pointer."""
    return int(check(cudart().cudaMallocAsync(max(int(nbytes), 1), stream), "cudaMallocAsync"))


def free_async(ptr: int, stream: int) -> None:
    """``cudaFreeAsync``: the memory is released once the work queued on ``stream`` before it is done."""
    check(cudart().cudaFreeAsync(ptr, stream), "cudaFreeAsync")


def synchronize(stream: int) -> None:
    """Wait on the host for the work queued on raw ``stream`` (0, and CUDA's 1: the legacy default stream; 2:
    the per-thread one)."""
    check(cudart().cudaStreamSynchronize(stream), "cudaStreamSynchronize")


_bound = threading.local()


def on_device(device_index: int, make: Callable[[], T]) -> T:
    """``make()`` run with ``device_index`` the current device (a library handle created for that device), the
    caller's current device restored afterwards."""
    rt = cudart()
    prev = check(rt.cudaGetDevice(), "cudaGetDevice")
    if prev != device_index:
        check(rt.cudaSetDevice(device_index), "cudaSetDevice")
    try:
        return make()
    finally:
        if prev != device_index:
            rt.cudaSetDevice(prev)


def bind_context(device_index: int) -> None:
    """Make sure this thread has a CUDA context current before a library that launches through the driver API
    (cuFFT) runs. The runtime binds device ``device_index``'s primary context lazily, on a thread's first
    runtime call; a fresh worker thread whose arrays came from a framework's cached allocator may have made
    none, and cuFFT then fails with ``CUFFT_EXEC_FAILED``. Checked once per thread and device (later calls read
    a thread-local)."""
    if getattr(_bound, "device", None) == device_index:
        return
    from cuda.bindings import driver

    err, ctx = driver.cuCtxGetCurrent()
    if err == driver.CUresult.CUDA_SUCCESS and not int(ctx):
        check(cudart().cudaSetDevice(device_index), "cudaSetDevice")  # binds that device's primary context
    _bound.device = device_index


def pointer_device(ptr: int) -> int:
    """The device ordinal owning device pointer ``ptr``."""
    attrs = check(cudart().cudaPointerGetAttributes(ptr), "cudaPointerGetAttributes")
    return int(attrs.device)


def copy_to_host(dst: Any, src: int, stream: int, pitch: int | None = None) -> Any:
    """Copy ``len(dst)`` elements from device address ``src`` into ``dst`` (a contiguous 1-D NumPy array), the
    source's elements ``pitch`` bytes apart (default: adjacent), queued on ``stream`` (a raw handle) after the
    work before it, and wait for the copy. Returns ``dst``."""
    rt = cudart()
    itemsize, count = dst.itemsize, len(dst)
    if count == 0:
        return dst
    kind = rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
    if pitch is None or pitch == itemsize or count == 1:
        check(rt.cudaMemcpyAsync(dst.ctypes.data, src, itemsize * count, kind, stream), "cudaMemcpyAsync")
    else:  # one element per "row" of a 2-D copy: a strided gather in one call
        check(rt.cudaMemcpy2DAsync(dst.ctypes.data, itemsize, src, pitch, itemsize, count, kind, stream),
              "cudaMemcpy2DAsync")
    check(rt.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
    return dst


class EventTimer:
    """Time work queued on a stream with a pair of CUDA events: :meth:`start`, queue the work, :meth:`stop`."""

    def __init__(self):
        rt = cudart()
        self._start = check(rt.cudaEventCreate(), "cudaEventCreate")
        self._stop = check(rt.cudaEventCreate(), "cudaEventCreate")

    def start(self, stream: int) -> None:
        """Record the start event on ``stream``."""
        check(cudart().cudaEventRecord(self._start, stream), "cudaEventRecord")

    def stop(self, stream: int) -> float:
        """Record the stop event on ``stream``, wait for it and return the seconds since :meth:`start`."""
        rt = cudart()
        check(rt.cudaEventRecord(self._stop, stream), "cudaEventRecord")
        check(rt.cudaEventSynchronize(self._stop), "cudaEventSynchronize")
        return check(rt.cudaEventElapsedTime(self._start, self._stop), "cudaEventElapsedTime") * 1e-3

    def close(self) -> None:
        rt = cudart()
        for ev in (self._start, self._stop):
            rt.cudaEventDestroy(ev)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
