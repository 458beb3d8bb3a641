"""NumPy arrays (and NumPy scalars): host memory, no streams."""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from .._adapter_registry import adapter_for
from .._memory import HOST
from ..errors import UnsupportedDtypeError
from .base import CPU, Adapter, OperandInfo

__all__ = ["NumpyAdapter"]

_HOST = frozenset({HOST})
#: dtype -> its name (``dtype.name`` is computed in Python on every read), for the dtypes met so far (bounded)
_DTYPE_NAMES: dict[np.dtype, str] = {}
_DTYPE_NAMES_MAX = 64


class NumpyAdapter(Adapter):
    name = "numpy"
    default_executors = {"cpu": ("numpy",)}

    def claims(self, cls: type) -> bool:
        return issubclass(cls, (np.ndarray, np.generic))

    def info(self, name: str, x: Any) -> OperandInfo:
        if isinstance(x, np.generic):  # a NumPy scalar: executors take its 0-d array
            x = np.asarray(x)
        itemsize = x.itemsize or 1
        strides = tuple(s // itemsize for s in x.strides)
        dtype = x.dtype
        name = _DTYPE_NAMES.get(dtype)
        if name is None:
            name = dtype.name
            if len(_DTYPE_NAMES) < _DTYPE_NAMES_MAX:
                _DTYPE_NAMES[dtype] = name
        return OperandInfo(x, self.name, CPU, name, x.shape, strides, memory=_HOST)

    #: (dtype, shape, strides), read in C: no Python frame on the per-call path
    signature = operator.attrgetter("dtype", "shape", "strides")

    def signature_for(self, cls: type):
        # ndarray subclasses (matrix, memmap...) take the full route: plans' direct calls return ndarrays
        return self.signature if cls is np.ndarray else None

    #: (dtype, ndim): an ndarray's detection reads nothing else but its shape and strides
    _rank_signature = operator.attrgetter("dtype", "ndim")

    def rank_signature_for(self, cls: type):
        return self._rank_signature if cls is np.ndarray else None

    def device(self, x):
        return CPU

    def data_ptr(self, x) -> int:
        return int(x.ctypes.data)

    def empty(self, shape, dtype: str, device_index=None, stream=0, order: str = "C"):
        arr = np.empty(tuple(shape), dtype=dtype, order="C")
        if order == "F" and arr.ndim >= 2:
            arr = np.swapaxes(np.empty((*arr.shape[:-2], arr.shape[-1], arr.shape[-2]), dtype=dtype), -1, -2)
        return arr, int(arr.ctypes.data)

    can_roll = can_copy_into = True

    def roll(self, x, shifts, axes):
        return np.roll(x, shifts, axes) if axes else x.copy()

    def unwritable(self, x) -> str:
        return "" if x.flags.writeable else "a read-only NumPy array"

    device_string_rank = 0

    def native_device(self, device):
        return "cpu" if isinstance(device, str) and device == "cpu" else None

    def from_host_values(self, values, dtype, device):
        dt = np.dtype("float64" if dtype is None else dtype)
        if dt.kind != "f":
            raise UnsupportedDtypeError("dtype", "a real floating dtype", str(dtype))
        return values.astype(dt)

    def coerce(self, x):
        """Any operand as a NumPy array (device memory is copied to the host)."""
        if isinstance(x, np.ndarray):
            return x

        ad = adapter_for(x)
        return ad.to_numpy(x) if ad is not None else np.asarray(x)

    def to_numpy(self, x):
        return x if isinstance(x, np.ndarray) else np.asarray(x)
