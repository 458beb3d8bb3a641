"""The few device primitives the framework-free array passes are made of (:mod:`.raw_passes`): stream-ordered
allocation, ``cudaMemsetAsync``, ``cudaMemcpy2DAsync``/``cudaMemcpy3DAsync`` between device buffers (the CUDA
runtime, through cuda-bindings) and cuBLAS's ``cublasSscal``/``cublasDscal`` (libcublas through ctypes, from the
same ``nvidia-cublas`` wheel as cuBLASLt), each queued on a raw stream handle.

Everything here takes and returns plain ints (pointers, byte counts, handles) and follows the documented CUDA
semantics to the letter (pitches and widths in bytes, heights in rows, depths in slices; ``n``/``incx`` in
elements for cuBLAS): the CPU tests substitute host-memory implementations of exactly these functions and run
the passes on top of them.
"""

from __future__ import annotations

import ctypes
import functools
import threading

from ..errors import CublasLtError
from . import runtime
from .libs import library_unavailable, load_library

__all__ = ["unavailable", "alloc", "free", "memset_zero", "copy2d", "copy3d", "scal", "CublasError"]

#: cuBLAS's level-1 calls take ``int`` counts
INT_MAX = 2**31 - 1


class CublasError(CublasLtError):
    """A cuBLAS call failed (cuBLAS and cuBLASLt share the status codes)."""

    library = "cuBLAS"


def unavailable() -> str | None:
    """Why the raw passes cannot run here (no CUDA runtime/device, or libcublas not loadable), or None."""
    return runtime.unavailable() or library_unavailable("cublas")


def alloc(nbytes: int, stream: int) -> int:
    """``cudaMallocAsync`` of ``nbytes`` on ``stream``: the pointer."""
    return runtime.malloc_async(nbytes, stream)


def free(ptr: int, stream: int) -> None:
    """``cudaFreeAsync`` on ``stream``: reused only after the work queued before it."""
    runtime.free_async(ptr, stream)


def memset_zero(ptr: int, nbytes: int, stream: int) -> None:
    """``cudaMemsetAsync(ptr, 0, nbytes, stream)``."""
    runtime.check(runtime.cudart().cudaMemsetAsync(ptr, 0, nbytes, stream), "cudaMemsetAsync")


def copy2d(dst: int, dpitch: int, src: int, spitch: int, width: int, height: int, stream: int) -> None:
    """``cudaMemcpy2DAsync`` device to device: ``height`` rows of ``width`` bytes, row ``i`` from ``src + i*spitch``
    to ``dst + i*dpitch`` (both pitches at least ``width``)."""
    rt = runtime.cudart()
    kind = rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice
    runtime.check(rt.cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, stream), "cudaMemcpy2DAsync")


def copy3d(dst: int, dpitch: int, dheight: int, src: int, spitch: int, sheight: int, width: int, height: int,
           depth: int, stream: int) -> None:  # fmt: skip
    """``cudaMemcpy3DAsync`` between pitched device pointers: ``depth`` slices of ``height`` rows of ``width``
    bytes; row ``i`` of slice ``k`` from ``src + (k*sheight + i)*spitch`` to ``dst + (k*dheight + i)*dpitch``
    (``sheight``/``dheight``: the pitched pointers' ``ysize``, at least ``height``)."""
    rt = runtime.cudart()
    p = rt.cudaMemcpy3DParms()
    p.srcPtr = rt.make_cudaPitchedPtr(src, spitch, width, sheight)
    p.dstPtr = rt.make_cudaPitchedPtr(dst, dpitch, width, dheight)
    p.extent = rt.make_cudaExtent(width, height, depth)
    p.kind = rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice
    runtime.check(rt.cudaMemcpy3DAsync(p, stream), "cudaMemcpy3DAsync")


_vp, _i32 = ctypes.c_void_p, ctypes.c_int


@functools.lru_cache(maxsize=1)
def _lib():
    L = load_library("cublas")
    sig = {
        "cublasCreate_v2": [ctypes.POINTER(_vp)],
        "cublasSetStream_v2": [_vp, _vp],
        "cublasSscal_v2": [_vp, _i32, ctypes.POINTER(ctypes.c_float), _vp, _i32],
        "cublasDscal_v2": [_vp, _i32, ctypes.POINTER(ctypes.c_double), _vp, _i32],
    }
    for name, args in sig.items():
        fn = getattr(L, name)
        fn.argtypes, fn.restype = args, ctypes.c_int
    return L


def _check(status: int, what: str) -> None:
    if status != 0:
        raise CublasError(what, status)


_handles: dict[int, int] = {}
#: one handle per device, shared: its stream is set and the call queued under this lock (both only enqueue), so
#: threads never race on the stream, and no thread leaves a handle (and its workspace) behind
_lock = threading.Lock()


def _handle(device_index: int) -> int:
    """The process-wide cuBLAS handle of ``device_index`` (created once, kept for the process's life, as cuBLASLt's
    are; the default host pointer mode, so ``alpha`` is read from host memory when the call is made). Call with
    :data:`_lock` held."""
    h = _handles.get(device_index)
    if h is None:
        p = _vp()
        runtime.on_device(device_index, lambda: _check(_lib().cublasCreate_v2(ctypes.byref(p)), "cublasCreate"))
        h = _handles[device_index] = int(p.value)
    return h


def scal(real_dtype: str, n: int, alpha: float, ptr: int, incx: int, stream: int, device_index: int) -> None:
    """``x[i*incx] *= alpha`` for ``i < n``, ``x`` the ``real_dtype`` ("float32"/"float64") elements at ``ptr``:
    ``cublasSscal``/``cublasDscal`` on ``stream`` (``n`` at most :data:`INT_MAX`)."""
    lib = _lib()
    with _lock:
        h = _handle(device_index)
        _check(lib.cublasSetStream_v2(h, stream), "cublasSetStream")
        if real_dtype == "float32":
            _check(lib.cublasSscal_v2(h, n, ctypes.byref(ctypes.c_float(alpha)), ptr, incx), "cublasSscal")
        else:
            _check(lib.cublasDscal_v2(h, n, ctypes.byref(ctypes.c_double(alpha)), ptr, incx), "cublasDscal")
