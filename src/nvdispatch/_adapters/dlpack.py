"""Objects that only speak DLPack (``__dlpack__`` / ``__dlpack_device__``): JAX arrays, and any producer
no other adapter claims. CPU ones run through their zero-copy NumPy view."""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import Adapter, Device, OperandInfo

__all__ = ["DlpackAdapter"]

# DLPack device-type codes (dlpack.h, DLDeviceType)
_DLPACK_CPU, _DLPACK_CUDA, _DLPACK_CUDA_HOST, _DLPACK_CUDA_MANAGED = 1, 2, 3, 13


class DlpackAdapter(Adapter):
    """Results come back in the caller's framework: its array-API namespace's ``from_dlpack`` (found by
    array-api-compat) imports the executor's result; where no namespace is known the result is returned as
    is: a NumPy array on the CPU, a :class:`~nvdispatch._cuda.arrays.CudaArray` on a GPU (which exports
    ``__dlpack__`` and ``__cuda_array_interface__``, so any framework imports it zero-copy)."""

    name = "dlpack"
    default_executors = {"cpu": ("numpy",), "cuda": ("cuda",)}
    wraps = True

    def claims(self, cls: type) -> bool:
        return hasattr(cls, "__dlpack_device__")

    def claims_instance(self, x: Any) -> bool:
        return hasattr(x, "__dlpack_device__")

    def _device_of(self, name: str, x) -> tuple[int, int]:
        from ..errors import UnsupportedOperandError, describe

        try:
            return x.__dlpack_device__()
        except Exception as exc:  # noqa: BLE001 - any failure means we cannot use it
            raise UnsupportedOperandError(name, "an array", describe(x), f"__dlpack_device__ failed: {exc}") from exc

    def info(self, name: str, x: Any) -> OperandInfo:
        from ..errors import UnsupportedOperandError

        dev_type, dev_id = self._device_of(name, x)
        if dev_type == _DLPACK_CPU:
            view = np.from_dlpack(x)  # zero-copy
            itemsize = view.itemsize or 1
            strides = tuple(s // itemsize for s in view.strides)
            return OperandInfo(view, self.name, Device("cpu"), view.dtype.name, view.shape, strides)
        if dev_type in (_DLPACK_CUDA, _DLPACK_CUDA_MANAGED, _DLPACK_CUDA_HOST):
            shape = tuple(getattr(x, "shape", ()))
            dtype = getattr(x, "dtype", None)
            return OperandInfo(x, self.name, Device("cuda", int(dev_id)), str(dtype), shape, None)
        raise UnsupportedOperandError(
            name, "an array on the CPU or a CUDA device", f"DLPack device type {dev_type}"
        )

    def device(self, x) -> Device:
        dev_type, dev_id = self._device_of("x", x)
        return Device("cpu") if dev_type == _DLPACK_CPU else Device("cuda", int(dev_id))

    def data_ptr(self, x) -> int:
        from .._cuda.arrays import view

        return view(x, self.name).ptr

    def to_numpy(self, x):
        return np.from_dlpack(x)

    def unwrap(self, x: Any) -> Any:
        return self.info("x", x).array

    def wrap(self, result: Any, like: Any) -> Any:
        import array_api_compat

        try:
            xp = array_api_compat.array_namespace(like)
        except TypeError:  # no namespace known for the caller's type
            return result
        if xp is array_api_compat.array_namespace(result):
            return result
        try:
            return xp.from_dlpack(result)
        except Exception:  # noqa: BLE001 - a namespace that cannot import it: the documented fallback type
            return result
