"""Objects that only speak DLPack (``__dlpack__`` / ``__dlpack_device__``): any producer no other adapter
claims. On the CPU they are handed to executors as their zero-copy NumPy view (host memory), on a GPU as
themselves (CUDA memory, read through DLPack)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._cuda.arrays import view
from .._memory import CUDA, HOST
from ..errors import UnsupportedDtypeError, UnsupportedOperandError, describe
from .base import CPU, Adapter, Device, OperandInfo

__all__ = ["DlpackAdapter", "host_view", "host_signature", "DLPACK_CPU"]

# DLPack device-type codes (dlpack.h, DLDeviceType)
DLPACK_CPU, _DLPACK_CUDA, _DLPACK_CUDA_HOST, _DLPACK_CUDA_MANAGED = 1, 2, 3, 13
_ON_CUDA = (_DLPACK_CUDA, _DLPACK_CUDA_MANAGED, _DLPACK_CUDA_HOST)
_HOST = frozenset({HOST})
_CUDA = frozenset({CUDA})


def host_view(name: str, x: Any, framework: str) -> np.ndarray:
    """The zero-copy NumPy view of host DLPack producer ``x``; a typed error naming ``name`` for a dtype NumPy
    cannot view (bfloat16, say)."""
    try:
        return np.from_dlpack(x)
    except (BufferError, RuntimeError, TypeError) as exc:
        dtype = str(getattr(x, "dtype", "unknown"))
        raise UnsupportedDtypeError(
            name,
            f"a dtype NumPy can view ({framework} arrays on the CPU run on NumPy's executor)",
            dtype,
            f"convert it first (DLPack said: {exc})",
        ) from exc


def host_signature(x: Any) -> tuple:
    """``(dtype, shape, strides)`` of host producer ``x``'s NumPy view; TypeError where NumPy cannot view it
    (the call then takes the full path, which reports it)."""
    try:
        v = np.from_dlpack(x)
    except (BufferError, RuntimeError) as exc:
        raise TypeError(str(exc)) from exc
    return (v.dtype, v.shape, v.strides)


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
        try:
            return x.__dlpack_device__()
        except Exception as exc:  # noqa: BLE001 - any failure means we cannot use it
            raise UnsupportedOperandError(name, "an array", describe(x), f"__dlpack_device__ failed: {exc}") from exc

    def info(self, name: str, x: Any) -> OperandInfo:
        dev_type, dev_id = self._device_of(name, x)
        if dev_type == DLPACK_CPU:
            host = host_view(name, x, self.name)
            itemsize = host.itemsize or 1
            strides = tuple(s // itemsize for s in host.strides)
            return OperandInfo(host, self.name, CPU, host.dtype.name, host.shape, strides, memory=_HOST)
        if dev_type in _ON_CUDA:  # dtype, shape and strides as the producer's capsule states them
            try:
                v = view(x, self.name)
            except Exception as exc:  # noqa: BLE001 - a producer whose export fails cannot be read at all
                raise UnsupportedOperandError(name, "an array", describe(x), f"__dlpack__ failed: {exc}") from exc
            device = Device("cuda", int(dev_id))
            return OperandInfo(x, self.name, device, v.dtype, v.shape, v.strides, memory=_CUDA)
        raise UnsupportedOperandError(
            name, "an array on the CPU or a CUDA device", f"DLPack device type {dev_type}"
        )

    def view(self, x: Any) -> Any:
        return np.from_dlpack(x) if x.__dlpack_device__()[0] == DLPACK_CPU else x

    def signature(self, x: Any):
        dev = x.__dlpack_device__()
        if dev[0] != DLPACK_CPU:  # device memory whose strides DLPack alone tells: every call takes the full path
            raise TypeError("no call key for a CUDA DLPack producer")
        return dev, host_signature(x)

    def device(self, x) -> Device:
        dev_type, dev_id = self._device_of("x", x)
        return CPU if dev_type == DLPACK_CPU else Device("cuda", int(dev_id))

    def data_ptr(self, x) -> int:
        return view(x, self.name).ptr

    def to_numpy(self, x):
        return np.from_dlpack(x)

    def wrap(self, result: Any, like: Any) -> Any:
        import array_api_compat

        try:
            xp = array_api_compat.array_namespace(like)
        except TypeError:  # no namespace known for the caller's type
            return result
        if isinstance(result, np.generic):
            result = np.asarray(result)
        if xp is array_api_compat.array_namespace(result):
            return result
        try:
            return xp.from_dlpack(result)
        except Exception:  # noqa: BLE001 - a namespace that cannot import it: the documented fallback type
            return result
