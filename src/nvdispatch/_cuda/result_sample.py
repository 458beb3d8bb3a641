"""Reading the sample :mod:`nvdispatch._agreement` compares of a device array: each run of the sample is one
small device-to-host copy (:func:`~.runtime.copy_to_host`), so only the sample crosses to the host."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .._agreement import Run, gather
from . import runtime

__all__ = ["device_reader", "sample_device"]


def device_reader(ptr: int, dtype: str, strides: tuple[int, ...], stream: int) -> Callable[[Run], np.ndarray]:
    """``read`` for :func:`~nvdispatch._agreement.gather` over device memory at ``ptr`` (``strides`` in
    elements), copying on ``stream`` (a raw handle). bfloat16 comes back as float32."""
    bf16 = dtype == "bfloat16"
    host_dtype = np.dtype(np.uint16) if bf16 else np.dtype(dtype)
    itemsize = host_dtype.itemsize
    strides = tuple(int(s) for s in strides) or (1,)
    lead, last = strides[:-1], strides[-1]

    def read(r: Run) -> np.ndarray:
        offset = sum(i * s for i, s in zip(r.first, lead)) + r.start * last
        step = r.step * last
        dst = np.empty(r.count, host_dtype)
        if step < 0:  # read from the lowest address up, then turn round
            offset += step * (r.count - 1)
            runtime.copy_to_host(dst, ptr + offset * itemsize, stream, -step * itemsize)
            dst = dst[::-1].copy()
        else:
            runtime.copy_to_host(dst, ptr + offset * itemsize, stream, max(step, 1) * itemsize)
        if bf16:
            return (dst.astype(np.uint32) << 16).view(np.float32)
        return dst

    return read


def sample_device(view: Any, stream: int) -> np.ndarray:
    """The sample of a device array given as a view (``ptr``, ``dtype``, ``shape``, ``strides`` in elements:
    :class:`~.arrays.DeviceView`), read on ``stream``."""
    return gather(view.shape, device_reader(view.ptr, view.dtype, view.strides, stream))
