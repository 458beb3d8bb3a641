"""Torch's autocast regions, as nvdispatch follows them: which region is active, and the autocast kernel of the
Torch operators that wrap nvdispatch calls.

A region (``torch.autocast(device_type, dtype)``) makes Torch's matmuls compute and return ``dtype``; nvdispatch's
matmul follows it by one rule (:func:`nvdispatch._precision.autocast_targets`): eagerly in the route (the Torch
adapter's :meth:`~nvdispatch._adapters.torch.TorchAdapter.precision_convention` reports the region), and inside
Torch programs through :func:`register_autocast`, the ``AutocastCPU``/``AutocastCUDA`` kernel of an operator:
it casts the operator's tensors by that rule and runs the operator with autocast off, so its fake (meta) kernel
and its real one both see the cast tensors, and the real one's nvdispatch call no longer sees a region.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from .._precision import autocast_targets

__all__ = ["autocast_dtype", "cast_for_region", "register_autocast"]

#: the device types whose autocast regions nvdispatch follows
DEVICE_TYPES = ("cpu", "cuda")


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


def _cast_arguments(args: tuple, names: Sequence[str | None], device_type: str) -> tuple:
    """``args`` with the tensors :func:`cast_for_region` casts cast (``names`` naming the leading positions, None
    for arguments the rule never casts)."""
    named = {name: x for name, x in zip(names, args) if name is not None}
    cast = cast_for_region(named, device_type)
    if cast is named:
        return args
    return tuple(cast[name] if name is not None else x for name, x in zip((*names, *(None,) * len(args)), args))


def register_autocast(lib: Any, op: Any, names: Sequence[str | None]) -> None:
    """Register ``op``'s autocast kernels on ``lib`` (a ``torch.library.Library`` of its namespace) for the CPU and
    CUDA: in a region, ``op``'s tensor arguments named in ``names`` (one entry per leading positional argument:
    ``"a"``, ``"b"``, ``"c"``, ``"bias"``, ``"relu_aux"``, ``"gelu_aux"``, or None) are cast by nvdispatch's
    autocast rule to the region's dtype, whichever it is, then ``op`` runs with autocast off. Unlike
    ``torch.library.register_autocast`` (one fixed dtype, every floating tensor) this follows the region's dtype and
    leaves alone what the rule leaves (float64 products, FP8 scales, masks).

    Examples
    --------
    >>> import torch
    >>> from nvdispatch._adapters.torch_autocast import register_autocast
    >>> lib = torch.library.Library("nvdispatch_doc", "DEF")
    >>> _ = lib.define("mm(Tensor a, Tensor b) -> Tensor")
    >>> lib.impl("mm", lambda a, b: a @ b, "CompositeExplicitAutograd")
    >>> register_autocast(lib, torch.ops.nvdispatch_doc.mm.default, ("a", "b"))
    >>> with torch.autocast("cpu", dtype=torch.bfloat16):
    ...     torch.ops.nvdispatch_doc.mm(torch.ones(2, 3), torch.ones(3, 2)).dtype
    torch.bfloat16
    """
    torch = sys.modules["torch"]
    names = tuple(names)
    name = op._schema.name.split("::", 1)[1]
    for device_type in DEVICE_TYPES:
        key = getattr(torch._C.DispatchKey, "Autocast" + torch._C._dispatch_key_for_device(device_type))
        excluded = torch._C.DispatchKeySet(key)

        def autocast_impl(*args, _device_type=device_type, _excluded=excluded):
            args = _cast_arguments(args, names, _device_type)
            with torch._C._ExcludeDispatchKeyGuard(_excluded):
                return op(*args)

        # the Python dispatcher's kernel (what Torch's tracers run) and the C++ dispatcher's
        op.py_kernels.pop(key, None)
        op.py_impl(key)(autocast_impl)
        lib.impl(name, lambda _keyset, *args, _impl=autocast_impl: _impl(*args), key.name, with_keyset=True)
