"""``array_api_strict`` arrays: the array API standard's reference namespace (a NumPy array in strict clothes).

Its arrays live in host memory whatever their (simulated) device: executors receive their zero-copy NumPy view
and the result comes back as a strict array on the operand's device. This file and its registration in
``nvdispatch._adapters`` are all nvdispatch knows of the framework (CONTRIBUTING.md, "Adding a framework").
"""

from __future__ import annotations

import sys
from typing import Any

from .._memory import HOST
from ..errors import UnsupportedDtypeError
from .base import CPU, Adapter, OperandInfo
from .dlpack import host_signature, host_view

__all__ = ["ArrayApiStrictAdapter"]

_NAME = "array_api_strict"
_HOST = frozenset({HOST})


def _namespace():
    return sys.modules[_NAME]


class ArrayApiStrictAdapter(Adapter):
    name = _NAME
    default_executors = {"cpu": ("numpy",)}
    wraps = True

    def claims(self, cls: type) -> bool:
        module = sys.modules.get(f"{_NAME}._array_object")  # loaded with the namespace
        array = getattr(module, "Array", None)
        return array is not None and issubclass(cls, array)

    def info(self, name: str, x: Any) -> OperandInfo:
        v = host_view(name, x, self.name)
        strides = tuple(s // (v.itemsize or 1) for s in v.strides)
        return OperandInfo(v, self.name, CPU, v.dtype.name, v.shape, strides, memory=_HOST)

    def view(self, x: Any) -> Any:
        import numpy as np

        return np.from_dlpack(x)

    signature = staticmethod(host_signature)

    def device(self, x: Any):
        return CPU

    def wrap(self, result: Any, like: Any) -> Any:
        return _namespace().asarray(result, device=like.device)  # (no copy of an array)

    def to_numpy(self, x: Any):
        import numpy as np

        return np.asarray(np.from_dlpack(x))

    # -- what fftshift, out= and fftfreq(device=) need -----------------------------------------------------------
    can_roll = can_copy_into = True

    def roll(self, x: Any, shifts, axes) -> Any:
        xp = _namespace()
        return xp.roll(x, shift=tuple(shifts), axis=tuple(axes)) if axes else xp.asarray(x, copy=True)

    def native_device(self, device: Any) -> Any | None:
        xp = sys.modules.get(_NAME)
        return device if xp is not None and isinstance(device, xp.Device) else None

    def from_host_values(self, values, dtype: Any, device: Any) -> Any:
        xp = _namespace()
        dt = xp.float64 if dtype is None else dtype
        if not xp.isdtype(dt, "real floating"):
            raise UnsupportedDtypeError("dtype", "a real floating array_api_strict dtype", str(dtype))
        return xp.astype(xp.asarray(values, device=device), dt)
