"""Device views of operands, and results created as the caller's type.

A :class:`DeviceView` is what a library call needs of an operand: pointer, dtype, shape and strides (in
elements). :func:`view` makes one from a Torch tensor, a CuPy array, any ``__cuda_array_interface__``
object (Numba device arrays included) or a CUDA DLPack object.

:func:`empty` allocates a result of the caller's kind on the caller's stream:

============================  ============================================================================
caller's operands             result
============================  ============================================================================
Torch tensors                 ``torch.Tensor`` from the caching allocator (on the stream's pool)
CuPy arrays                   ``cupy.ndarray`` from CuPy's memory pool
Numba device arrays           a Numba ``DeviceNDArray`` (Numba's allocator)
other CAI / DLPack objects    :class:`CudaArray`: memory from ``cudaMallocAsync`` on the stream, freed with
                              ``cudaFreeAsync`` on that stream when the object is collected; it exposes
                              ``__cuda_array_interface__`` (v3) and can be viewed by any framework
============================  ============================================================================
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._adapter_registry import adapter_for_result_kind, adapter_named
from .._strides import c_strides
from ..errors import UnsupportedOperandError, describe
from . import runtime
from .cuda_array_namespace import CudaArrayNamespace, namespace
from .dlpack_abi import KDL_CUDA, DLTensor
from .dlpack_export import capsule

__all__ = [
    "DeviceView",
    "CudaArray",
    "view",
    "interface_dtype",
    "pointer_getter",
    "empty",
    "result_kind",
    "result_from_operand",
    "result_maker",
    "storage_shape",
    "as_kind",
    "make_view",
    "same_stream",
]


@dataclass
class DeviceView:
    ptr: int
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # elements
    owner: Any = None


def view(x: Any, framework: str) -> DeviceView:
    """Pointer, dtype, shape and strides of device array ``x`` owned by ``framework``, readable by any launch that
    follows: the framework's adapter's view (which waits where the framework computes on streams of its own, as
    JAX does); else ``__cuda_array_interface__``, the producer's stream (v3's ``"stream"``) synchronised first
    where it names one; else DLPack (``__dlpack__()``: the producer makes the data ready for the legacy default
    stream, which orders before every later launch)."""
    ad = adapter_named(framework)
    v = None if ad is None else ad.device_view(x)  # a framework's own arrays (Torch, CuPy)
    if v is not None:
        return v
    try:
        cai = x.__cuda_array_interface__
    except Exception:  # noqa: BLE001 - absent, or refused for this dtype (jaxlib's bfloat16 buffers): try DLPack
        cai = None
    if cai is not None:
        producer = cai.get("stream")
        if producer is not None:  # CAI v3: the producer's stream, to be synchronised on before the data is read
            runtime.synchronize(int(producer))
        dtype, itemsize = interface_dtype(cai["typestr"])
        shape = tuple(cai["shape"])
        st = cai.get("strides")
        strides = c_strides(shape) if st is None else tuple(s // itemsize for s in st)
        return DeviceView(int(cai["data"][0] or 0), dtype, shape, strides, x)
    if hasattr(x, "__dlpack__"):
        return _dlpack_view(x)
    raise UnsupportedOperandError("operand", "a device array (CUDA array interface or DLPack)", describe(x))


def interface_dtype(typestr: str) -> tuple[str, int]:
    """The dtype name and item size a ``__cuda_array_interface__`` typestr stands for. A 2-byte void (``"<V2"``)
    is bfloat16: NumPy has no bfloat16 of its own, so Torch describes its bfloat16 tensors so, as ml_dtypes'
    ``bfloat16.str`` (and nvdispatch's :class:`CudaArray`) do; NumPy would name it ``void16``, which no reader
    of the view (the autotune's result check) takes for bfloat16.

    Examples
    --------
    >>> interface_dtype("<V2"), interface_dtype("<f2"), interface_dtype("|u1")
    (('bfloat16', 2), ('float16', 2), ('uint8', 1))
    """
    dt = np.dtype(typestr)
    if dt.kind == "V" and dt.itemsize == 2 and dt.names is None:
        return "bfloat16", 2
    return dt.name, dt.itemsize


# -- DLPack (read-only import: pointer, shape, strides) ----------------------------------------------------------
_DL_CODES = {(0, 8): "int8", (0, 16): "int16", (0, 32): "int32", (0, 64): "int64"}
_DL_CODES.update({(1, 8): "uint8", (1, 16): "uint16", (1, 32): "uint32", (1, 64): "uint64"})
_DL_CODES.update({(2, 16): "float16", (2, 32): "float32", (2, 64): "float64", (4, 16): "bfloat16"})
_DL_CODES.update({(5, 64): "complex64", (5, 128): "complex128", (6, 8): "bool"})


# a function object of our own: ctypes.pythonapi.PyCapsule_GetPointer is shared, and the DLPack exporter gives it
# other argument types
_capsule_pointer = ctypes.pythonapi["PyCapsule_GetPointer"]
_capsule_pointer.restype, _capsule_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]


def _dlpack_view(x) -> DeviceView:
    capsule = x.__dlpack__()
    addr = _capsule_pointer(capsule, b"dltensor")  # DLManagedTensor starts with its DLTensor
    t = DLTensor.from_address(addr)
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = c_strides(shape) if not t.strides else tuple(t.strides[i] for i in range(t.ndim))
    dtype = _DL_CODES.get((t.dtype.code, t.dtype.bits), f"dlpack{t.dtype.code}:{t.dtype.bits}")
    # the capsule keeps the producer's memory alive as long as the view lives
    return DeviceView(int(t.data or 0) + int(t.byte_offset), dtype, shape, strides, (x, capsule))


# -- results as the caller's type --------------------------------------------------------------------------
class CudaArray:
    """``nvdispatch.CudaArray``: the result type of calls whose operands nvdispatch knows only by
    ``__cuda_array_interface__`` or DLPack (no framework to create results with). Device memory that any
    framework can take without a copy: ``__cuda_array_interface__`` (v3), ``__dlpack__``/``__dlpack_device__``,
    and ``__array_namespace__()`` — the array API of CuPy (else Torch) working on it in place, whose
    functions return that framework's arrays. ``shape``, ``dtype``, ``ndim``, ``size``; ``copy_to_host()``.

    The memory is released with ``cudaFreeAsync`` on the stream it was allocated on, once the object is
    collected: work queued on that stream before the release still sees valid memory. Work on *other*
    streams must be ordered by the caller (as for any framework's stream-ordered allocator).

    Examples
    --------
    On a GPU (``raw`` an object with only ``__cuda_array_interface__``)::

        r = nvdispatch.matmul(raw_a, raw_b)        # a CudaArray
        xp = r.__array_namespace__()               # CuPy's array API (or Torch's)
        total = xp.sum(r)                          # a cupy.ndarray
        t = torch.from_dlpack(r)                   # zero-copy into any DLPack consumer

    >>> import nvdispatch
    >>> hasattr(nvdispatch.CudaArray, "__array_namespace__")
    True
    """

    def __init__(
        self,
        shape: tuple[int, ...],
        dtype: str,
        strides: tuple[int, ...] | None = None,
        *,
        stream: int = 0,
        base: Any = None,
        ptr: int = 0,
    ) -> None:
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.strides_elems = tuple(strides) if strides is not None else c_strides(self.shape)
        self._stream = stream
        self._base = base
        if base is None and ptr == 0:
            span = _span(self.shape, self.strides_elems) * self.dtype.itemsize
            self._owned = runtime.malloc_async(span, stream) if span else 0
            self.ptr = self._owned
        else:
            self._owned = 0
            self.ptr = ptr

    @property
    def __cuda_array_interface__(self) -> dict:
        isz = self.dtype.itemsize
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.ptr, False),
            "strides": tuple(s * isz for s in self.strides_elems),
            "version": 3,
            "stream": None,
        }

    def __dlpack_device__(self) -> tuple[int, int]:
        return (KDL_CUDA, runtime.pointer_device(self.ptr) if self.ptr else runtime.current_device())

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule of this memory (keeps it alive), so any framework's ``from_dlpack`` imports it.

        The work queued on the stream the memory was written on is finished first (the host waits for it) unless
        the consumer reads on that same stream or asks for no synchronisation (``stream=-1``): for any other stream
        it names, and for ``stream=None`` (DLPack's "the legacy default stream", also what JAX passes where its
        client cannot name its own, which it then reads on unordered). The host waits rather than ordering the
        consumer's stream after an event: the call that wrote this memory may have read operands that their
        framework frees and reuses as soon as the call returns (a JAX cast made for the call, XLA's allocator
        ordered on XLA's streams only), so the work must be over when the result is handed back."""
        if copy:
            raise BufferError("CudaArray exports its memory without copying (copy=True is not supported)")
        if self.ptr and not same_stream(stream, self._stream):
            runtime.synchronize(self._stream)
        kind, index = self.__dlpack_device__()
        return capsule(self.ptr, self.shape, self.strides_elems, self.dtype, kind, index, self)

    def __array_namespace__(self, *, api_version: str | None = None) -> CudaArrayNamespace:
        """The array API namespace working on this memory (see :mod:`nvdispatch._cuda.cuda_array_namespace`)."""
        return namespace(CudaArray, api_version)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def view_as(self, shape: tuple[int, ...], strides: tuple[int, ...], offset_elems: int = 0) -> CudaArray:
        """A view of this memory (keeps it alive)."""
        ptr = self.ptr + offset_elems * self.dtype.itemsize
        return CudaArray(shape, self.dtype.name, strides, stream=self._stream, base=self, ptr=ptr)

    def copy_to_host(self) -> np.ndarray:
        """Synchronous copy to a NumPy array (for tests and debugging)."""
        rt = runtime.cudart()
        span = _span(self.shape, self.strides_elems)
        host = np.empty(max(span, 1), self.dtype)
        if span:
            runtime.check(rt.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")
            runtime.check(
                rt.cudaMemcpy(
                    host.ctypes.data, self.ptr, span * self.dtype.itemsize, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
                ),
                "cudaMemcpy",
            )
        return np.lib.stride_tricks.as_strided(
            host, self.shape, tuple(s * self.dtype.itemsize for s in self.strides_elems)
        ).copy()

    def __del__(self):
        if getattr(self, "_owned", 0):
            try:
                runtime.free_async(self._owned, self._stream)
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass
            self._owned = 0

    def __repr__(self) -> str:
        return f"<nvdispatch CudaArray shape={self.shape} dtype={self.dtype.name} ptr={self.ptr:#x}>"


#: DLPack's and the CUDA array interface's names of the legacy default stream (0 is CUDA's own handle of it)
_LEGACY = (0, 1)


def same_stream(consumer: Any, producer: int) -> bool:
    """Whether a consumer reading on ``consumer`` (a DLPack ``stream=`` value: a handle, 1 or 2 for the legacy or
    per-thread default stream, -1 for "no synchronisation", None for DLPack's default) needs no wait for work
    queued on ``producer`` (a raw handle, 0 the legacy default stream): it asked for none, or reads on that stream.

    >>> same_stream(1, 0), same_stream(-1, 7), same_stream(7, 7), same_stream(None, 0), same_stream(2, 0)
    (True, True, True, False, False)
    """
    if consumer is None:
        return False
    if consumer == -1 or consumer == producer:
        return True
    return consumer in _LEGACY and producer in _LEGACY


def _span(shape, strides) -> int:
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((n - 1) * abs(st) for n, st in zip(shape, strides))


def pointer_getter(framework: str):
    """A function giving the device pointer of ``framework``'s arrays (read once per plan, called per call)."""
    ad = adapter_named(framework)
    if ad is not None:
        return ad.data_ptr
    return lambda x: view(x, framework).ptr


def result_kind(x: Any, framework: str) -> str:
    """How to create results for a caller whose operand is ``x``: "torch", "cupy", "numba" or "cai" (the
    result kinds adapters declare, see :func:`nvdispatch._adapter_registry.adapter_for_result_kind`)."""
    ad = adapter_named(framework)
    return "cai" if ad is None else ad.result_kind(x)


def storage_shape(shape: tuple, order: str) -> tuple:
    """The C-ordered shape of the storage of an ``order`` array of ``shape`` (``"F"``: the last two axes
    swapped, the array being its transposed view); ``shape`` itself when nothing is swapped."""
    if order == "F" and len(shape) >= 2:
        return (*shape[:-2], shape[-1], shape[-2])
    return shape


def result_from_operand(framework: str, shape, dtype: str, order: str = "C"):
    """How ``framework``'s operands make a result like themselves: ``(kind, args, kwargs, transposed)`` for
    ``operand.new_empty(*args, **kwargs)`` (see ``Adapter.result_from_operand``), or None: use :func:`empty`."""
    ad = adapter_named(framework)
    return None if ad is None else ad.result_from_operand(shape, dtype, order)


def result_maker(framework: str, shape, dtype: str):
    """How ``framework``'s operands make a C-ordered result per call: ``(maker, args, kwargs)`` (see
    ``Adapter.result_maker``), or None: use :func:`empty`."""
    ad = adapter_named(framework)
    return None if ad is None else ad.result_maker(shape, dtype)


def empty(kind: str, shape, dtype: str, device_index: int, stream: int, order: str = "C"):
    """A new uninitialised array of the caller's ``kind`` (see :func:`result_kind`) and its pointer.

    ``order="F"`` makes the last two axes column-major (each matrix of a batch stored by columns).
    Returns ``(array, ptr)``; the memory belongs to ``stream``'s pool where the framework has one.
    """
    return adapter_for_result_kind(kind).empty_result(kind, shape, dtype, device_index, stream, order)


def as_kind(kind: str, arr: Any, framework_of_arr: str):
    """Present ``arr`` (a Torch tensor or CuPy array made by a helper) as the caller's ``kind``, zero-copy."""
    if kind == framework_of_arr:
        return arr
    return adapter_for_result_kind(kind).as_result(kind, arr, framework_of_arr)


def make_view(kind: str, base: Any, shape, strides_elems, offset_elems: int = 0):
    """A view of ``base`` (an array of ``kind``) with the given shape and element strides."""
    shape, strides_elems = tuple(shape), tuple(strides_elems)
    return adapter_for_result_kind(kind).result_view(kind, base, shape, strides_elems, offset_elems)
