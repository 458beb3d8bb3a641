"""The parameters of a Numba CUDA kernel as ``cuLaunchKernel`` takes them: one value per kernel parameter, each
in its own 8-byte slot (``kernelParams[i]`` points at slot ``i``), with its size in bytes.

Numba's ABI (numba-cuda's ``_Kernel._prepare_args``) flattens every argument into kernel parameters:

* an array of ``ndim`` dimensions: ``meminfo`` (0), ``parent`` (0), ``nitems``, ``itemsize``, the data pointer,
  then ``shape[0..ndim)`` and ``strides[0..ndim)`` in bytes: ``5 + 2 * ndim`` parameters of 8 bytes;
* an integer of its width, ``float32`` in 4 bytes, ``float64`` in 8;
* a complex number as two parameters, its real and imaginary parts in its real precision.

Nothing here touches a GPU: the packing is a pure function of shapes, strides, item sizes, pointers and scalar
values; :data:`SLOT` bytes a parameter, little-endian.

Examples
--------
>>> ps = array_parameters(0x1000, (2, 3), (24, 8), 8)
>>> len(ps), ps[4], DATA_POINTER
(9, ('q', 4096), 4)
>>> packed = pack([*ps, *scalar_parameters("float32", 0.5)])
>>> packed.sizes[-1], len(packed.values)
(4, 80)
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["SLOT", "DATA_POINTER", "Parameter", "PackedParameters", "array_parameters", "scalar_parameters", "pack"]

#: bytes a parameter takes in the packed values (the widest scalar parameter)
SLOT = 8
#: the position of an array's data pointer among its parameters
DATA_POINTER = 4

#: ``(struct format, value)`` of one kernel parameter
Parameter = tuple[str, "int | float"]

_SCALAR_FORMATS = {
    "int8": "b", "int16": "h", "int32": "i", "int64": "q",
    "uint8": "B", "uint16": "H", "uint32": "I", "uint64": "Q",
    "float32": "f", "float64": "d",
}  # fmt: skip
_COMPLEX_PARTS = {"complex64": "f", "complex128": "d"}


@dataclass(frozen=True)
class PackedParameters:
    """``values``: :data:`SLOT` bytes per parameter (a value in the first ``size`` bytes of its slot, the rest
    zero); ``sizes``: each parameter's size in bytes."""

    values: bytes
    sizes: tuple[int, ...]

    @property
    def count(self) -> int:
        return len(self.sizes)


def array_parameters(ptr: int, shape: Sequence[int], strides: Sequence[int], itemsize: int) -> list[Parameter]:
    """The parameters of an array argument: data pointer ``ptr``, ``shape``, ``strides`` in bytes."""
    if len(shape) != len(strides):
        raise ValueError(f"array_parameters: {len(shape)} extents but {len(strides)} strides")
    head = [0, 0, math.prod(shape), itemsize, ptr]  # meminfo, parent, nitems, itemsize, data
    return [("q", int(v)) for v in (*head, *shape, *strides)]


def scalar_parameters(dtype: str, value) -> list[Parameter]:
    """The parameters of a scalar argument of NumPy type name ``dtype`` (one; two for a complex number)."""
    if dtype in _COMPLEX_PARTS:
        part = _COMPLEX_PARTS[dtype]
        return [(part, float(complex(value).real)), (part, float(complex(value).imag))]
    fmt = _SCALAR_FORMATS.get(dtype)
    if fmt is None:
        raise TypeError(f"scalar_parameters: no kernel parameter for a {dtype} scalar")
    return [(fmt, float(value) if fmt in "fd" else int(value))]


def pack(parameters: Sequence[Parameter]) -> PackedParameters:
    """The values and sizes of ``parameters``, one :data:`SLOT` each."""
    values = bytearray(SLOT * len(parameters))
    sizes = []
    for i, (fmt, value) in enumerate(parameters):
        struct.pack_into("<" + fmt, values, SLOT * i, value)
        sizes.append(struct.calcsize("<" + fmt))
    return PackedParameters(bytes(values), tuple(sizes))
