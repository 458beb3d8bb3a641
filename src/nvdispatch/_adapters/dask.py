"""Dask arrays: recognised without importing Dask, described by their chunks and chunk type.

A ``dask.array.Array`` is framework ``"dask"``; its device is that of its chunks (read from ``_meta``, the
zero-size array of the chunk type Dask keeps), and its ``chunks`` go into the operand description, so the
plan of a Dask call (which blocks meet where) is keyed by them. Checks that Dask itself would only make at
``compute()`` are made here, at the call: unknown (NaN) chunk sizes and chunk types no executor can run.

Mixing a Dask array with plain arrays: a plain operand small enough to broadcast (at most Dask's
``array.chunk-size``, 128 MiB by default; e.g. a bias) is taken and wrapped with ``dask.array.from_array``
by the Dask executor; a larger one raises :class:`~nvdispatch.errors.MixedOperandsError` saying how to
convert it.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any

from .._adapter_registry import adapter_for
from .._memory import DASK_ARRAY
from ..errors import MixedOperandsError, UnsupportedOperandError, describe
from .base import Adapter, OperandInfo

__all__ = ["DaskAdapter", "DaskLayout", "broadcast_limit"]

DASK = "dask"
_MEMORY = frozenset({DASK_ARRAY})
#: operands whose chunk sizes may be unknown along the last axis: cuBLASLt's bit-mask ReLU aux, whose width
#: per block only the block executor knows (the Dask executor returns it so and takes it back block by block)
_UNKNOWN_LAST_AXIS_OK = {"relu_aux", "epilog_inputs['relu_aux']"}


@dataclass(frozen=True)
class DaskLayout:
    """How a Dask array is cut: its chunk type's framework and its chunk sizes per axis (-1: unknown); ``meta``
    is Dask's zero-size array of the chunk type."""

    chunk_framework: str
    chunks: tuple[tuple[int, ...], ...]
    meta: Any = field(default=None, compare=False, repr=False)


class DaskAdapter(Adapter):
    name = DASK
    default_executors = {"cpu": ("dask",), "cuda": ("dask",)}

    def claims(self, cls: type) -> bool:
        mod = sys.modules.get("dask.array")
        return mod is not None and issubclass(cls, mod.Array)

    def info(self, name: str, x: Any) -> OperandInfo:
        chunks = tuple(tuple(c) for c in x.chunks)
        for axis, sizes in enumerate(chunks):
            if any(math.isnan(s) for s in sizes):
                last = axis == len(chunks) - 1
                if not (last and name in _UNKNOWN_LAST_AXIS_OK and str(x.dtype) == "uint8"):
                    raise UnsupportedOperandError(
                        name,
                        "a Dask array with known chunk sizes",
                        f"unknown (NaN) chunk sizes along axis {axis}",
                        "call x.compute_chunk_sizes() first (boolean indexing and similar leave sizes unknown)",
                    )
        meta = getattr(x, "_meta", None)

        ad = adapter_for(meta) if meta is not None else None
        if ad is None or ad is self:
            raise UnsupportedOperandError(
                name,
                "a Dask array of NumPy or CuPy chunks (or other arrays nvdispatch recognises)",
                f"chunks of type {type(meta).__module__}.{type(meta).__qualname__}",
            )
        if type(x.dtype).__module__.split(".")[0] != "numpy":  # Dask keeps a NumPy dtype per array
            raise UnsupportedOperandError(
                name,
                "a Dask array whose dtype is a NumPy dtype (chunks of NumPy, CuPy, ...)",
                f"chunks of type {type(meta).__module__}.{type(meta).__qualname__} with dtype {x.dtype}",
                "Dask does not support these chunks (it cannot concatenate or describe them); compute the blocks, "
                "or convert them to NumPy chunks (x.map_blocks(lambda t: t.numpy()))",
            )
        chunk = ad.info(name, meta)
        # unknown sizes (allowed above only where the block executor alone knows them) are written -1
        known = tuple(tuple(-1 if math.isnan(s) else int(s) for s in sizes) for sizes in chunks)
        shape = tuple(sum(sizes) if -1 not in sizes else -1 for sizes in known)
        layout = DaskLayout(chunk.framework, known, meta)
        return OperandInfo(x, DASK, chunk.device, str(x.dtype), shape, None, chunks=layout, memory=_MEMORY)

    def signature(self, x: Any):
        return (x.dtype, x.chunks, type(x._meta))

    can_roll = True

    def roll(self, x: Any, shifts, axes) -> Any:
        """Lazily, by ``dask.array.roll`` (slices and a concatenation); a copy when no axes."""
        import dask.array as da

        return da.roll(x, shifts, axes) if axes else x.copy()

    def coerce(self, x: Any) -> Any:
        """A plain array as a single-block Dask array (Dask arrays pass through)."""
        import dask.array as da

        if isinstance(x, da.Array):
            return x
        return da.from_array(x, chunks=tuple(x.shape) or (), asarray=False)

    def to_numpy(self, x: Any):
        import numpy as np

        return np.asarray(x.compute())

    def placement(self, infos: dict) -> tuple[str, Any]:
        """``("dask", device)`` for Dask operands, possibly mixed with small plain arrays, whose blocks are all
        of one framework and device kind; a typed error naming the operand that does not fit otherwise."""
        first_name, first = next((n, i) for n, i in infos.items() if i.framework == DASK)
        chunk_framework = first.chunks.chunk_framework
        limit = None
        for name, info in infos.items():
            own = info.chunks.chunk_framework if info.framework == DASK else info.framework
            if own != chunk_framework or info.device.kind != first.device.kind:
                what = f"Dask chunks of {own}" if info.framework == DASK else f"a {own} array"
                raise MixedOperandsError(
                    name,
                    f"blocks of the same framework and device as {first_name}'s chunks ({chunk_framework} on "
                    f"{first.device.kind})",
                    f"{what} on {info.device.kind}",
                    "convert one of them (e.g. x.map_blocks(cupy.asarray) for CuPy chunks)",
                )
            if info.framework == DASK:
                continue
            limit = broadcast_limit() if limit is None else limit
            nbytes = _nbytes(info)
            if nbytes > limit:
                raise MixedOperandsError(
                    name,
                    f"a Dask array like {first_name}, or a plain array of at most {limit / 2**20:.0f} MiB to "
                    "broadcast",
                    f"{describe(info.array)} ({nbytes / 2**20:.0f} MiB)",
                    "convert it with dask.array.from_array(x, chunks=...) (chunked like the other operand)",
                )
        return DASK, first.device


def broadcast_limit() -> int:
    """Largest plain operand (bytes) wrapped into a Dask call: Dask's ``array.chunk-size``."""
    import dask
    from dask.utils import parse_bytes

    return int(parse_bytes(dask.config.get("array.chunk-size", "128MiB")))


def _nbytes(info) -> int:
    import numpy as np

    try:
        itemsize = np.dtype(info.dtype).itemsize
    except TypeError:
        itemsize = 2  # bfloat16
    return math.prod(info.shape) * itemsize
