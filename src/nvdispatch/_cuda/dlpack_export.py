"""DLPack export (legacy ``dltensor`` capsules, DLPack 0.x ABI) for memory nvdispatch owns, so any framework
can import a :class:`~nvdispatch._cuda.arrays.CudaArray` with its own ``from_dlpack`` (JAX, Torch, CuPy...).

:func:`capsule` wraps a pointer, shape, element strides and dtype in a ``DLManagedTensor`` whose deleter
drops the reference to the owning Python object; the capsule's destructor calls that deleter when no
consumer took the tensor. Pure ctypes: no compiler, no framework.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np

from ..errors import UnsupportedDtypeError
from .dlpack_abi import DLDataType, DLDevice, DLTensor

__all__ = ["capsule", "live_exports"]

#: NumPy kind -> DLDataTypeCode (kDLInt 0, kDLUInt 1, kDLFloat 2, kDLComplex 5, kDLBool 6)
_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}
_BFLOAT = 4  # kDLBfloat: bfloat16, a "V"-kind dtype in NumPy (ml_dtypes)


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]

_NAME = b"dltensor"
_lock = threading.Lock()
#: address of a live DLManagedTensor -> what it keeps alive (the struct, its shape/strides, the owner)
_alive: dict[int, tuple] = {}


@_DELETER
def _deleter(managed):
    with _lock:
        _alive.pop(ctypes.addressof(managed.contents), None)


# function objects of our own (pythonapi["..."] makes a new one; pythonapi.Name is shared by every user, who
# may set other argtypes on it)
_capsule_new = ctypes.pythonapi["PyCapsule_New"]
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
_capsule_valid = ctypes.pythonapi["PyCapsule_IsValid"]
_capsule_valid.restype = ctypes.c_int
_capsule_valid.argtypes = (ctypes.c_void_p, ctypes.c_char_p)
_capsule_pointer = ctypes.pythonapi["PyCapsule_GetPointer"]
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = (ctypes.c_void_p, ctypes.c_char_p)


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _capsule_destructor(cap):
    # a consumer renames the capsule to "used_dltensor" and owns the tensor; otherwise it is ours to delete
    if _capsule_valid(cap, _NAME):
        ptr = _capsule_pointer(cap, _NAME)
        managed = ctypes.cast(ptr, ctypes.POINTER(_DLManagedTensor))
        managed.contents.deleter(managed)


def capsule(ptr: int, shape, strides_elems, dtype, device_type: int, device_id: int, owner: Any):
    """A ``dltensor`` capsule over ``ptr`` (``shape``, ``strides_elems`` in elements, ``dtype``) on
    (``device_type``, ``device_id``), keeping ``owner`` alive until the consumer releases it."""
    dt = np.dtype(dtype)
    code = _BFLOAT if dt.name == "bfloat16" else _CODES.get(dt.kind)
    if code is None:
        raise UnsupportedDtypeError("array", "a numeric or boolean dtype DLPack can describe", str(dt))
    ndim = len(shape)
    shape_arr = (ctypes.c_int64 * max(ndim, 1))(*shape)
    strides_arr = (ctypes.c_int64 * max(ndim, 1))(*strides_elems)
    managed = _DLManagedTensor()
    t = managed.dl_tensor
    t.data = ptr or None
    t.device = DLDevice(device_type, device_id)
    t.ndim = ndim
    t.dtype = DLDataType(code, dt.itemsize * 8, 1)
    t.shape = ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64))
    t.byte_offset = 0
    managed.deleter = _deleter
    address = ctypes.addressof(managed)
    with _lock:
        _alive[address] = (managed, shape_arr, strides_arr, owner)
    return _capsule_new(address, _NAME, ctypes.cast(_capsule_destructor, ctypes.c_void_p))


def live_exports() -> int:
    """How many exported tensors are still held (by a consumer or an unconsumed capsule)."""
    return len(_alive)
