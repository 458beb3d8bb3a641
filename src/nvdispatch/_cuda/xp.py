"""Elementwise and copy helpers over Torch or CuPy, for what a library call cannot do by itself
(layout copies, casts, relu bit-mask packing, fallback epilogs).

Raw ``__cuda_array_interface__``/DLPack operands are viewed zero-copy as CuPy arrays (or Torch tensors)
when one of those is installed; :func:`namespace_for` says which one (None: neither is available, so
only the cases a library handles directly can run).
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

from .._adapter_registry import adapter_named, adapters
from .arrays import CudaArray

__all__ = ["namespace_for", "as_xp", "Xp"]


def _has(mod: str) -> bool:
    try:
        return importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        return False


@functools.cache
def namespace_for(framework: str) -> str | None:
    """Which helper namespace can work on ``framework``'s device arrays: "torch", "cupy" or None (the
    framework's own when its adapter has device helpers, else the first installed one whose helpers work on
    other owners' CUDA arrays: a CPU-only Torch does not)."""
    own = adapter_named(framework)
    if own is not None and own.device_ops_available():
        return framework
    for ad in adapters():
        if _has(ad.name) and ad.device_ops_for_foreign_arrays():
            return ad.name
    return None


def as_xp(x: Any, framework: str, xp: str):
    """A zero-copy Torch tensor / CuPy array (helper namespace ``xp``) viewing device array ``x`` (owned by
    ``framework``): ``x`` itself where it is one already."""
    if framework == xp and not isinstance(x, CudaArray):
        return x
    return adapter_named(xp).view_device_array(x)


def Xp(name: str):  # noqa: N802 - the name callers construct helpers with
    """The few array operations the GPU plans need, on ``name``'s ("torch"/"cupy") device arrays: the
    framework adapter's device helpers (``astype``, ``contiguous``, ``copy_into``, ``conj``, ``conj_``, ``swap_last``,
    ``empty``/``zeros``/``full``, ``synchronize``, ``data_ptr``, ``pack_mask``/``unpack_mask`` for cuBLASLt's
    RELU bit masks, ``epilog_ops``)."""
    return adapter_named(name).device_ops()
