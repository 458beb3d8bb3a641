"""What the ``"cuda"`` executor's Numba-kernel plans share: whether Numba's CUDA target is usable, zero-copy
Numba views of operands and scratch memory, Numba streams for raw handles, and the device to launch on."""

from __future__ import annotations

import contextlib
import math

import numpy as np

from .._strides import c_strides

__all__ = ["numba_reason", "c_contiguous", "numba_view", "raw_view", "NumbaStreams", "on_device"]


def numba_reason() -> str | None:
    """Why Numba kernels cannot run here (numba-cuda missing, or its simulator active), or None."""
    try:
        import numba.cuda  # noqa: F401
    except ImportError:
        return "numba-cuda is not installed (pip install 'nvdispatch[numba]')"
    from ..device.simulator_compat import simulator_active

    if simulator_active():
        return "Numba's CUDA simulator is active"
    return None


def c_contiguous(p) -> bool:
    """Whether FFT problem ``p``'s operand is C-contiguous."""
    return p.strides is None or tuple(p.strides) == c_strides(p.shape) or math.prod(p.shape) <= 1


def _from_interface(shape, strides, dtype, ptr: int, owner):
    from numba import cuda

    dt = np.dtype(dtype)
    desc = {"shape": tuple(shape), "strides": strides, "typestr": dt.str, "data": (ptr, False), "version": 3}
    return cuda.from_cuda_array_interface(desc, owner=owner, sync=False)


def numba_view(a, framework: str, shape=None):
    """A Numba device array over ``a`` (no copy, no stream synchronisation); ``shape`` reshapes a
    C-contiguous array."""
    from .._cuda import arrays

    v = arrays.view(a, framework)
    dt = np.dtype(v.dtype)
    if shape is None:
        return _from_interface(v.shape, tuple(s * dt.itemsize for s in v.strides), dt, v.ptr, a)
    return _from_interface(shape, None, dt, v.ptr, a)


def raw_view(ptr: int, shape, dtype, owner=None, strides=None):
    """A Numba device array of ``shape`` and ``dtype`` at device address ``ptr``, C-contiguous or of ``strides``
    in bytes (``owner`` keeps the memory alive while the view is)."""
    return _from_interface(shape, None if strides is None else tuple(strides), dtype, ptr, owner)


class NumbaStreams:
    """Numba stream objects for raw ``cudaStream_t`` handles (made once per handle)."""

    def __init__(self):
        self._streams: dict[int, object] = {}

    def __call__(self, ptr: int):
        s = self._streams.get(ptr)
        if s is None:
            from numba import cuda

            s = cuda.external_stream(ptr) if ptr else cuda.default_stream()
            self._streams[ptr] = s
        return s


def on_device(index: int, several: bool):
    """A context making GPU ``index`` Numba's current device where the machine has several (a null context
    otherwise: Numba launches on its current device)."""
    if not several:
        return contextlib.nullcontext()
    from numba import cuda

    return cuda.gpus[index]
