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

__all__ = ["namespace_for", "as_xp", "Xp", "round_up"]


def round_up(x: int, base: int) -> int:
    return -(-x // base) * base


def _has(mod: str) -> bool:
    try:
        return importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        return False


@functools.cache
def namespace_for(framework: str) -> str | None:
    """Which helper namespace can work on ``framework``'s device arrays: "torch", "cupy" or None."""
    if framework in ("torch", "cupy"):
        return framework
    if _has("cupy"):
        return "cupy"
    if _has("torch"):
        return "torch"
    return None


def as_xp(x: Any, framework: str, xp: str):
    """A zero-copy Torch tensor / CuPy array viewing device array ``x`` (owned by ``framework``)."""
    if framework == xp:
        return x
    if xp == "torch":
        import torch

        if hasattr(x, "__cuda_array_interface__"):
            return torch.as_tensor(x, device="cuda")
        return torch.from_dlpack(x)
    import cupy

    if hasattr(x, "__cuda_array_interface__"):
        return cupy.asarray(x)
    return cupy.from_dlpack(x)


class Xp:
    """The few array operations the GPU plans need, on ``"torch"`` or ``"cupy"`` arrays."""

    def __init__(self, name: str):
        self.name = name
        self.mod = importlib.import_module(name)

    # -- layout and dtype ------------------------------------------------------------------------------
    def astype(self, x, dtype: str):
        if self.name == "torch":
            return x.to(getattr(self.mod, dtype))
        return x.astype(dtype)

    def contiguous(self, x, shape=None):
        """A C-contiguous copy of ``x`` broadcast to ``shape`` (always a new array when shape is given)."""
        if self.name == "torch":
            y = x.expand(shape) if shape is not None else x
            return y.contiguous() if shape is None else y.clone(memory_format=self.mod.contiguous_format)
        y = self.mod.broadcast_to(x, shape) if shape is not None else x
        return self.mod.ascontiguousarray(y) if shape is None else y.copy(order="C")

    def copy_into(self, dst, src) -> None:
        if self.name == "torch":
            dst.copy_(src)
        else:
            dst[...] = src

    def swap_last(self, x):
        return x.transpose(-1, -2) if self.name == "torch" else self.mod.swapaxes(x, -1, -2)

    def empty(self, shape, dtype: str):
        if self.name == "torch":
            return self.mod.empty(tuple(shape), dtype=getattr(self.mod, dtype), device="cuda")
        return self.mod.empty(tuple(shape), dtype=dtype)

    # -- relu bit masks (cuBLASLt's RELU_AUX format) ---------------------------------------------------
    def pack_mask(self, mask, ld_bits: int):
        """Pack a boolean mask (..., cols, rows) — ``rows`` being cuBLASLt's row axis, contiguous in the
        mask's bit order — into cuBLASLt's bit mask: uint8 (..., cols, ld_bits // 8), bit ``r % 8`` of byte
        ``r // 8`` set where ``mask[..., c, r]``."""
        rows = mask.shape[-1]
        pad = ld_bits - rows
        mod = self.mod
        if self.name == "cupy":
            m = mask.astype(mod.uint8)
            if pad:
                m = mod.concatenate([m, mod.zeros((*m.shape[:-1], pad), mod.uint8)], axis=-1)
            m = m.reshape(*m.shape[:-1], ld_bits // 8, 8)
            shifts = mod.arange(8, dtype=mod.uint8)
            return mod.ascontiguousarray((m << shifts).sum(-1, dtype=mod.uint8))
        m = mask.to(mod.uint8)
        if pad:
            m = mod.nn.functional.pad(m, (0, pad))
        m = m.reshape(*m.shape[:-1], ld_bits // 8, 8)
        shifts = mod.arange(8, device=m.device, dtype=mod.uint8)
        return (m << shifts).sum(-1, dtype=mod.uint8).contiguous()

    def unpack_mask(self, bits, rows: int):
        """The inverse of :meth:`pack_mask`: a boolean (..., cols, rows) mask."""
        if self.name == "cupy":
            cp = self.mod
            shifts = cp.arange(8, dtype=cp.uint8)
            m = (bits[..., None] >> shifts) & 1
            return m.reshape(*bits.shape[:-1], bits.shape[-1] * 8)[..., :rows].astype(cp.bool_)
        torch = self.mod
        shifts = torch.arange(8, device=bits.device, dtype=torch.uint8)
        m = (bits.unsqueeze(-1) >> shifts) & 1
        return m.reshape(*bits.shape[:-1], bits.shape[-1] * 8)[..., :rows].bool()

    # -- epilog steps in place (the vocabulary of nvdispatch._epilog.apply_steps) --------------------
    def epilog_ops(self):
        if self.name == "torch":
            from .._epilog_torch import TORCH_INPLACE

            return TORCH_INPLACE
        from .._epilog_cupy import CUPY_INPLACE

        return CUPY_INPLACE
