"""Operand detection: which framework owns an array, on which device, with which dtype/shape/strides.

Framework checks go through array-api-compat, which looks classes up in ``sys.modules`` and so never
imports a framework just to ask. Objects that no framework claims are accepted through
``__cuda_array_interface__`` (GPU) or DLPack (CPU or GPU).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import array_api_compat as _compat
import numpy as np

from .errors import MixedOperandsError, UnsupportedOperandError, describe

__all__ = ["Device", "OperandInfo", "detect", "common_placement", "CPU"]

NUMPY, TORCH, CUPY, CAI, DLPACK = "numpy", "torch", "cupy", "cuda_array_interface", "dlpack"

# DLPack device-type codes (dlpack.h, DLDeviceType)
_DLPACK_CPU, _DLPACK_CUDA, _DLPACK_CUDA_HOST, _DLPACK_CUDA_MANAGED = 1, 2, 3, 13


@dataclass(frozen=True)
class Device:
    """Where an array lives: ``kind`` is ``"cpu"`` or ``"cuda"``; ``index`` is the CUDA ordinal."""

    kind: str
    index: int | None = None

    def __str__(self) -> str:
        return self.kind if self.index is None else f"{self.kind}:{self.index}"


CPU = Device("cpu")


@dataclass(frozen=True)
class OperandInfo:
    """What dispatch needs to know of one operand. ``strides`` are in elements (None where unknown)."""

    array: Any
    framework: str
    device: Device
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None
    #: whether autograd records operations on this operand now (a Torch tensor requiring grad, grad enabled)
    autograd: bool = False

    @property
    def ndim(self) -> int:
        return len(self.shape)


def _numpy_info(x: np.ndarray, framework: str = NUMPY) -> OperandInfo:
    itemsize = x.itemsize or 1
    return OperandInfo(x, framework, CPU, x.dtype.name, x.shape, tuple(s // itemsize for s in x.strides))


def _torch_info(x) -> OperandInfo:
    dev = x.device
    device = CPU if dev.type == "cpu" else Device(dev.type, dev.index if dev.index is not None else 0)
    dtype = str(x.dtype).removeprefix("torch.")
    autograd = bool(x.requires_grad) and sys.modules["torch"].is_grad_enabled()
    return OperandInfo(x, TORCH, device, dtype, tuple(x.shape), tuple(x.stride()), autograd)


def _cupy_info(x) -> OperandInfo:
    itemsize = x.itemsize or 1
    strides = tuple(s // itemsize for s in x.strides)
    return OperandInfo(x, CUPY, Device("cuda", int(x.device.id)), x.dtype.name, tuple(x.shape), strides)


def _cai_info(x) -> OperandInfo:
    cai = x.__cuda_array_interface__
    dtype = np.dtype(cai["typestr"])
    shape = tuple(cai["shape"])
    strides = cai.get("strides")
    if strides is None:  # C-contiguous
        strides, step = [], 1
        for extent in reversed(shape):
            strides.append(step)
            step *= max(extent, 1)
        strides = tuple(reversed(strides))
    else:
        strides = tuple(s // dtype.itemsize for s in strides)
    # The interface does not name the device; executors resolve it from the pointer when they need it.
    return OperandInfo(x, CAI, Device("cuda", None), dtype.name, shape, strides)


def _dlpack_info(name: str, x) -> OperandInfo:
    try:
        dev_type, dev_id = x.__dlpack_device__()
    except Exception as exc:  # noqa: BLE001 - any failure means we cannot use it
        raise UnsupportedOperandError(name, "an array", describe(x), f"__dlpack_device__ failed: {exc}") from exc
    if dev_type == _DLPACK_CPU:
        view = np.from_dlpack(x)  # zero-copy
        return _numpy_info(view, DLPACK)
    if dev_type in (_DLPACK_CUDA, _DLPACK_CUDA_MANAGED, _DLPACK_CUDA_HOST):
        shape = tuple(getattr(x, "shape", ()))
        dtype = getattr(x, "dtype", None)
        return OperandInfo(x, DLPACK, Device("cuda", int(dev_id)), str(dtype), shape, None)
    raise UnsupportedOperandError(name, "an array on the CPU or a CUDA device", f"DLPack device type {dev_type}")


def detect(name: str, x: Any) -> OperandInfo:
    """Describe operand ``x`` (called ``name`` in error messages).

    Raises
    ------
    UnsupportedOperandError
        When ``x`` is no array any framework or protocol recognises.
    """
    if type(x) is np.ndarray or _compat.is_numpy_array(x):
        return _numpy_info(x)
    if _compat.is_torch_array(x):
        return _torch_info(x)
    if _compat.is_cupy_array(x):
        return _cupy_info(x)
    if hasattr(x, "__cuda_array_interface__"):
        return _cai_info(x)
    if hasattr(x, "__dlpack_device__"):
        return _dlpack_info(name, x)
    hint = (
        "wrap it with numpy.asarray (or the array constructor of your framework)"
        if isinstance(x, (list, tuple, int, float, complex))
        else ""
    )
    raise UnsupportedOperandError(
        name, "an array (NumPy, CuPy, Torch, __cuda_array_interface__ or DLPack)", describe(x), hint
    )


def common_placement(infos: dict[str, OperandInfo]) -> tuple[str, Device]:
    """The one framework and device shared by all operands in ``infos``; a typed error naming both otherwise."""
    first_name, first = next(iter(infos.items()))
    for name, info in infos.items():
        if info.framework != first.framework:
            raise MixedOperandsError(
                name,
                f"an array of the same framework as {first_name} ({first.framework})",
                f"a {info.framework} array",
                "convert one of them, or use set_backend(..., coerce=True)",
            )
        if info.device != first.device and None not in (info.device.index, first.device.index):
            raise MixedOperandsError(
                name, f"an array on the same device as {first_name} ({first.device})", f"one on {info.device}"
            )
        if info.device.kind != first.device.kind:
            raise MixedOperandsError(
                name, f"an array on the same device as {first_name} ({first.device})", f"one on {info.device}"
            )
    return first.framework, first.device
