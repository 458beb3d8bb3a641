"""Objects exposing ``__cuda_array_interface__`` (Numba device arrays, nvdispatch's ``CudaArray``, ...).

The interface does not name the device, so the device ordinal comes from the data pointer through the
CUDA runtime (:func:`pointer_device`); results are created as :class:`nvdispatch._cuda.arrays.CudaArray`
(memory from ``cudaMallocAsync`` on the caller's stream), or as Numba device arrays for Numba callers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._adapter_registry import adapter_for, adapter_named
from .._cuda import runtime
from .._cuda.arrays import CudaArray, interface_dtype, storage_shape, view
from .._memory import CUDA
from .._strides import c_strides
from .base import Adapter, Device, OperandInfo

__all__ = ["CaiAdapter", "pointer_device"]

_MEMORY = frozenset({CUDA})


def pointer_device(ptr: int) -> int | None:
    """The CUDA ordinal owning device pointer ``ptr`` (the current device for a null pointer); None when
    no CUDA runtime is usable here."""
    if runtime.unavailable():
        return None
    if ptr:
        try:
            dev = runtime.pointer_device(ptr)
        except RuntimeError:  # not memory the runtime knows: the current device, as before
            dev = -1
        if dev >= 0:
            return dev
    return runtime.current_device()


class CaiAdapter(Adapter):
    name = "cuda_array_interface"
    default_executors = {"cuda": ("cuda",)}

    def claims(self, cls: type) -> bool:
        return hasattr(cls, "__cuda_array_interface__")

    def claims_instance(self, x: Any) -> bool:
        return hasattr(x, "__cuda_array_interface__")

    def info(self, name: str, x: Any) -> OperandInfo:
        cai = x.__cuda_array_interface__
        dtype, itemsize = interface_dtype(cai["typestr"])  # "<V2": bfloat16, as Torch and ml_dtypes describe it
        shape = tuple(cai["shape"])
        strides = cai.get("strides")
        strides = c_strides(shape) if strides is None else tuple(s // itemsize for s in strides)
        device = Device("cuda", pointer_device(int(cai["data"][0] or 0)))
        return OperandInfo(x, self.name, device, dtype, shape, strides, memory=_MEMORY)

    def unwritable(self, x) -> str:
        read_only = x.__cuda_array_interface__.get("data", (0, False))[1]
        return "a read-only __cuda_array_interface__ array" if read_only else ""

    def signature(self, x):
        cai = x.__cuda_array_interface__
        return (cai["typestr"], tuple(cai["shape"]), cai.get("strides"), pointer_device(int(cai["data"][0] or 0)))

    def device(self, x) -> Device:
        return Device("cuda", pointer_device(int(x.__cuda_array_interface__["data"][0] or 0)))

    def data_ptr(self, x) -> int:
        return int(x.__cuda_array_interface__["data"][0] or 0)

    def empty(self, shape, dtype: str, device_index: int, stream: int, order: str = "C"):
        shape = tuple(int(s) for s in shape)
        tshape = storage_shape(shape, order)
        st = c_strides(tshape)
        if tshape is not shape:
            st = (*st[:-2], st[-1], st[-2])
        arr = CudaArray(shape, dtype, st, stream=stream)
        return arr, arr.ptr

    # -- results: Numba device arrays for Numba callers, CudaArray otherwise -----------------------------
    result_kinds = ("numba", "cai")

    def result_kind(self, x) -> str:
        return "numba" if type(x).__module__.startswith("numba") else "cai"

    def empty_result(self, kind, shape, dtype, device_index, stream, order="C"):
        if kind != "numba":
            return self.empty(shape, dtype, device_index, stream, order)
        from numba import cuda

        shape = tuple(int(s) for s in shape)
        tshape = storage_shape(shape, order)
        arr = cuda.device_array(tshape, dtype=np.dtype(dtype))
        ptr = int(arr.device_ctypes_pointer.value or 0)
        if tshape is not shape:
            st = c_strides(tshape)
            arr = self.result_view("numba", arr, shape, (*st[:-2], st[-1], st[-2]))
        return arr, ptr

    def as_result(self, kind, arr, framework_of_arr):
        if kind == "numba":
            from numba import cuda

            return cuda.as_cuda_array(arr)

        v = view(arr, framework_of_arr)
        # written by the helper's operations on its current stream: a DLPack consumer reading on another waits for it
        helper = adapter_named(framework_of_arr)
        stream = 0 if helper is None else helper.current_stream(helper.device(arr).index)
        return CudaArray(v.shape, v.dtype, v.strides, stream=stream, ptr=v.ptr, base=arr)

    def result_view(self, kind, base, shape, strides_elems, offset_elems=0):
        if kind == "numba":
            from numba.cuda.cudadrv.devicearray import DeviceNDArray

            isz = base.dtype.itemsize
            data = base.gpu_data.view(offset_elems * isz) if offset_elems else base.gpu_data
            return DeviceNDArray(shape, tuple(s * isz for s in strides_elems), base.dtype, gpu_data=data)
        return base.view_as(shape, strides_elems, offset_elems)

    def coerce(self, x):
        """Device arrays pass through; host arrays are copied to the current device as a ``CudaArray``."""
        if hasattr(x, "__cuda_array_interface__"):
            return x

        ad = adapter_for(x)
        host = np.ascontiguousarray(ad.to_numpy(x) if ad is not None else np.asarray(x))
        out = CudaArray(host.shape, host.dtype.name)
        if host.nbytes:
            rt = runtime.cudart()
            runtime.check(rt.cudaStreamSynchronize(0), "cudaStreamSynchronize")
            runtime.check(
                rt.cudaMemcpy(out.ptr, host.ctypes.data, host.nbytes, rt.cudaMemcpyKind.cudaMemcpyHostToDevice),
                "cudaMemcpy",
            )
        return out

    def to_numpy(self, x):
        if isinstance(x, CudaArray):
            return x.copy_to_host()
        copy = getattr(x, "copy_to_host", None)  # Numba device arrays
        if callable(copy):
            return copy()
        return super().to_numpy(x)
