"""CuPy arrays on CUDA devices (CuPy's current stream and memory pool)."""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from .base import Adapter, Device, OperandInfo

__all__ = ["CupyAdapter"]


class CupyAdapter(Adapter):
    name = "cupy"
    default_executors = {"cuda": ("cuda", "cupy")}

    def claims(self, cls: type) -> bool:
        cupy = sys.modules.get("cupy")
        return cupy is not None and issubclass(cls, cupy.ndarray)

    def info(self, name: str, x: Any) -> OperandInfo:
        itemsize = x.itemsize or 1
        strides = tuple(s // itemsize for s in x.strides)
        return OperandInfo(x, self.name, Device("cuda", int(x.device.id)), x.dtype.name, tuple(x.shape), strides)

    @staticmethod
    def signature(x):
        return (x.dtype, x.shape, x.strides, x.device.id)

    def device(self, x) -> Device:
        return Device("cuda", int(x.device.id))

    def data_ptr(self, x) -> int:
        return x.data.ptr

    # -- streams -----------------------------------------------------------------------------------------
    def current_stream(self, device_index: int | None) -> int:
        import cupy

        return int(cupy.cuda.get_current_stream().ptr)

    def current_stream_getter(self, device_index: int):
        return lambda: self.current_stream(device_index)

    def stream_context(self, stream: int, device_index: int | None):
        import cupy

        if stream == self.current_stream(device_index):
            return contextlib.nullcontext()
        return cupy.cuda.ExternalStream(stream)

    def native_stream_context(self, stream: Any, device_index: int | None):
        if stream is None:
            return contextlib.nullcontext()
        import cupy

        if isinstance(stream, cupy.cuda.Stream):
            return stream
        from .._cuda.streams import stream_pointer

        return cupy.cuda.ExternalStream(stream_pointer(stream, "cupy"))

    # -- memory ------------------------------------------------------------------------------------------
    def empty(self, shape, dtype: str, device_index: int, stream: int, order: str = "C"):
        import cupy

        from .._cuda.arrays import storage_shape

        shape = tuple(int(s) for s in shape)
        tshape = storage_shape(shape, order)
        arr = cupy.empty(tshape, dtype=dtype)
        if tshape is not shape:
            arr = cupy.swapaxes(arr, -1, -2)
        return arr, arr.data.ptr

    # -- conversion --------------------------------------------------------------------------------------
    def coerce(self, x):
        import cupy

        if isinstance(x, cupy.ndarray):
            return x
        if hasattr(x, "__cuda_array_interface__"):
            return cupy.asarray(x)
        from . import adapter_for

        ad = adapter_for(x)
        if ad is None:
            return cupy.asarray(x)
        if ad.device(x).kind == "cuda":  # zero-copy through DLPack
            return cupy.from_dlpack(ad.export(x))
        return cupy.asarray(ad.to_numpy(x))

    def to_numpy(self, x):
        return x.get()
