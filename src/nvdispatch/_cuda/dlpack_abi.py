"""The DLPack 0.x ABI (legacy ``dltensor`` capsules): the structs and device codes, shared by the import side
(:func:`nvdispatch._cuda.arrays.view` reads a producer's tensor) and the export side
(:mod:`nvdispatch._cuda.dlpack_export` builds capsules of memory nvdispatch owns)."""

from __future__ import annotations

import ctypes

__all__ = ["DLDevice", "DLDataType", "DLTensor", "KDL_CPU", "KDL_CUDA"]

#: DLDeviceType codes
KDL_CPU, KDL_CUDA = 1, 2


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]
