"""Torch's autocast regions, as nvdispatch follows them: which region is active, and the casts it asks for.

A region (``torch.autocast(device_type, dtype)``) makes Torch's matmuls compute and return ``dtype``; nvdispatch's
matmul follows it by one rule (:func:`nvdispatch._precision.autocast_targets`): eagerly in the route (the Torch
adapter's :meth:`~nvdispatch._adapters.torch.TorchAdapter.precision_convention` reports the region), and in Torch
programs through the ``nvdispatch::matmul`` operator's autocast kernel
(:mod:`nvdispatch.integrations.torch_autocast`), which casts by :func:`cast_for_region`.
"""

from __future__ import annotations

import sys
from typing import Any

from .._precision import autocast_targets

__all__ = ["autocast_dtype", "cast_for_region"]


def autocast_dtype(device_type: str) -> str | None:
    """The dtype (name) of the ``torch.autocast`` region active on ``device_type`` (``"cuda"``, ``"cpu"``) in this
    thread, or None outside one."""
    torch = sys.modules["torch"]
    if not torch.is_autocast_enabled(device_type):
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
