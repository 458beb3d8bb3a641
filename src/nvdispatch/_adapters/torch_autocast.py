"""Torch's autocast regions, as nvdispatch follows them: which region is active, and the casts it asks for.

A region (``torch.autocast(device_type, dtype)``) makes Torch's matmuls compute and return ``dtype``; nvdispatch's
matmul follows it by one rule (:func:`nvdispatch._precision.autocast_targets`): eagerly in the route (the Torch
adapter's :meth:`~nvdispatch._adapters.torch.TorchAdapter.precision_convention` reports the region), and in Torch
programs through the ``nvdispatch::matmul`` operator's autocast kernel
(:mod:`nvdispatch.integrations.torch_autocast`), which casts by :func:`cast_for_region`.

Torch's FFTs follow a region on some device types only: its CPU autocast lists every ``torch.fft`` transform under
its float32 policy (float16/bfloat16 input computed in float32), its CUDA autocast lists none (Torch 2.13; its
``AT_FORALL_FP32`` list has no ``fft_*`` op), so a CUDA region leaves them as they are. :func:`ffts_follow_region`
asks Torch's dispatcher which (whether its transforms have an autocast kernel there), so nvdispatch's transforms
follow whatever list the Torch at hand has; :func:`fft_cast_for_region` casts by the FFT rule
(:func:`nvdispatch._precision.fft_autocast_target`) where they do.
"""

from __future__ import annotations

import sys
from typing import Any

from .._precision import FFT_AUTOCAST, FILTER_AUTOCAST, PrecisionConvention, autocast_targets, fft_autocast_target

__all__ = ["autocast_dtype", "cast_for_region", "ffts_follow_region", "fft_cast_for_region"]

#: the ``torch.fft`` operators whose autocast kernels make Torch's FFTs follow a region (those nvdispatch has)
_TORCH_FFT_OPS = tuple(
    f"aten::fft_{f}"
    for f in ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft", "fftn", "ifftn", "rfftn", "irfftn", "fft2", "ifft2",
              "rfft2", "irfft2")
)  # fmt: skip
_follow: dict[str, bool] = {}


def autocast_dtype(device_type: str) -> str | None:
    """The dtype (name) of the ``torch.autocast`` region active on ``device_type`` (``"cuda"``, ``"cpu"``) in this
    thread, or None outside one (and on device types autocast does not know, such as ``"meta"``)."""
    torch = sys.modules["torch"]
    try:
        if not torch.is_autocast_enabled(device_type):
            return None
    except RuntimeError:  # "unknown device type for autocast"
        return None
    return str(torch.get_autocast_dtype(device_type)).removeprefix("torch.")


def cast_for_region(tensors: dict[str, Any], device_type: str) -> dict[str, Any]:
    """``tensors`` (a matmul's, by operand name: ``"a"``, ``"b"``, ``"c"``, ``"bias"``, ``"relu_aux"``,
    ``"gelu_aux"``; None values allowed) with those the region active on ``device_type`` casts cast, by
    nvdispatch's rule (autograd records the casts, as Torch's own autocast's); as they are outside a region.

    Examples
    --------
    >>> import torch
    >>> from nvdispatch._adapters.torch_autocast import cast_for_region
    >>> with torch.autocast("cpu", dtype=torch.bfloat16):
    ...     cast = cast_for_region({"a": torch.ones(2, 3), "b": torch.ones(3, 2), "c": None}, "cpu")
    >>> cast["a"].dtype, cast["c"]
    (torch.bfloat16, None)
    """
    torch = sys.modules["torch"]
    dtype = autocast_dtype(device_type)
    if dtype is None:
        return tensors
    dtypes = {
        name: str(x.dtype).removeprefix("torch.")
        for name, x in tensors.items()
        if isinstance(x, torch.Tensor) and x.device.type == device_type
    }
    targets = autocast_targets(dtype, dtypes)
    if not targets:
        return tensors
    to = getattr(torch, dtype)
    return {name: (x.to(to) if name in targets else x) for name, x in tensors.items()}


def ffts_follow_region(device_type: str) -> bool:
    """Whether Torch's own FFTs follow an autocast region on ``device_type``: whether its dispatcher has an autocast
    kernel there for every ``torch.fft`` transform nvdispatch has (read once per device type). Where Torch cannot be
    asked (a private API gone), the CPU's list as Torch 2.13 has it: the CPU yes, other devices no."""
    known = _follow.get(device_type)
    if known is None:
        C = sys.modules["torch"]._C
        try:
            key = "Autocast" + C._dispatch_key_for_device(device_type)
            known = all(C._dispatch_has_kernel_for_dispatch_key(op, key) for op in _TORCH_FFT_OPS)
        except (AttributeError, RuntimeError, TypeError, ValueError):
            known = device_type == "cpu"
        _follow[device_type] = known
    return known


def fft_cast_for_region(tensors: dict[str, Any], device_type: str) -> dict[str, Any]:
    """``tensors`` (a transform's operand ``"x"``, and ``fft.convolve``'s filter ``"h"``; None values allowed) cast
    as the region active on ``device_type`` casts them where Torch's FFTs follow it there (float16/bfloat16 to
    float32; a complex32 filter to complex64); as they are elsewhere (autograd records the casts). ``tensors``
    itself where nothing is cast.

    Examples
    --------
    >>> import torch
    >>> from nvdispatch._adapters.torch_autocast import fft_cast_for_region
    >>> with torch.autocast("cpu", dtype=torch.bfloat16):
    ...     cast = fft_cast_for_region({"x": torch.ones(8, dtype=torch.float16)}, "cpu")
    >>> cast["x"].dtype
    torch.float32
    """
    region = autocast_dtype(device_type)
    if region is None or not ffts_follow_region(device_type):
        return tensors
    torch = sys.modules["torch"]
    convention = PrecisionConvention(autocast=region, fft_autocast=True)
    out = tensors
    for name, x in tensors.items():
        if isinstance(x, torch.Tensor) and x.device.type == device_type:
            dtype = str(x.dtype).removeprefix("torch.")
            target = fft_autocast_target(convention, dtype, FILTER_AUTOCAST if name == "h" else FFT_AUTOCAST)
            if target is not None:
                out = {**out, name: x.to(getattr(torch, target))}
    return out
