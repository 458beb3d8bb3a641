"""Chunk arithmetic and graph assembly shared by the Dask executor's operations.

Chunks are tuples of block sizes per axis, as Dask writes them. Operands broadcast against a result the
NumPy way (right-aligned; an axis of size 1 meets every block of the result's axis).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

__all__ = [
    "refine",
    "boundaries",
    "describe_chunks",
    "broadcast_target",
    "block_of",
    "wrap",
    "new_array",
    "meta_of",
    "empty_block",
    "tree_sum",
    "token",
    "itemsize",
    "largest_block_bytes",
]

Chunks = tuple[tuple[int, ...], ...]
#: bytes per element of the dtypes NumPy has no name for (Torch/CuPy chunks)
_ITEMSIZES = {"bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}


def itemsize(dtype: str) -> int:
    """Bytes per element of the dtype called ``dtype`` (bfloat16 and FP8 included)."""
    import numpy as np

    return _ITEMSIZES.get(dtype) or np.dtype(dtype).itemsize


def largest_block_bytes(chunks: Chunks, dtype: str) -> int:
    """Bytes of the largest block of an array of ``dtype`` chunked as ``chunks`` (0 where an axis has none)."""
    return math.prod(max(c) if c else 0 for c in chunks) * itemsize(dtype)


def boundaries(chunks: Sequence[int]) -> list[int]:
    return list(itertools.accumulate(chunks, initial=0))


def refine(*axes: Sequence[int]) -> tuple[int, ...]:
    """The coarsest chunks of one axis that every chunking in ``axes`` can be cut to (the union of their
    block boundaries); all must cover the same length."""
    cuts = sorted(set().union(*(boundaries(c) for c in axes)))
    sizes = tuple(b - a for a, b in zip(cuts, cuts[1:]))
    return sizes or tuple(axes[0])


def describe_chunks(chunks: Sequence[int]) -> str:
    """``(4 × 256)`` for even chunks, ``(3 blocks: 100, 100, 56)`` otherwise."""
    chunks = tuple(chunks)
    if len(set(chunks)) == 1:
        return f"({len(chunks)} × {chunks[0]})"
    head = ", ".join(map(str, chunks[:4])) + (", ..." if len(chunks) > 4 else "")
    return f"({len(chunks)} blocks: {head})"


def broadcast_target(shape: tuple[int, ...], out_chunks: Chunks) -> Chunks:
    """The chunks an operand of ``shape`` needs to meet a result chunked ``out_chunks`` block for block:
    the result's chunks along its own axes, one block where it broadcasts (size 1)."""
    lead = len(out_chunks) - len(shape)
    return tuple(
        (1,) if size == 1 and sum(out_chunks[lead + i]) != 1 else out_chunks[lead + i] for i, size in enumerate(shape)
    )


def block_of(name: str, shape: tuple[int, ...], out_index: tuple[int, ...]) -> tuple:
    """The key of an operand's block meeting result block ``out_index`` (right-aligned broadcasting)."""
    lead = len(out_index) - len(shape)
    return (name, *(0 if size == 1 else out_index[lead + i] for i, size in enumerate(shape)))


def wrap(x: Any):
    """A Dask array of ``x``: Dask arrays as they are, plain arrays as one block."""
    import dask.array as da

    if isinstance(x, da.Array):
        return x
    return da.from_array(x, chunks=tuple(x.shape) or (), asarray=False)


def rechunk(x: Any, chunks: Any):
    """``x.rechunk(chunks)``; chunks other than NumPy's are moved by Dask's task-based method (its peer-to-peer
    one, the default on ``distributed`` clusters, serialises NumPy blocks only: CuPy blocks fail there)."""
    import numpy as np

    method = None if isinstance(x._meta, np.ndarray) else "tasks"
    return x.rechunk(chunks, method=method)


def token(*parts: Any) -> str:
    from dask.base import tokenize

    return tokenize(*parts)


def new_array(name: str, dsk: dict, dependencies: list, chunks: Chunks, meta: Any):
    """A Dask array over graph layer ``dsk`` (named ``name``) that reads the collections ``dependencies``."""
    import dask.array as da
    from dask.highlevelgraph import HighLevelGraph

    graph = HighLevelGraph.from_collections(name, dsk, dependencies=dependencies)
    return da.Array(graph, name, chunks, meta=meta)


def meta_of(like: Any, ndim: int, dtype: str):
    """A zero-size array of ``like``'s type with ``ndim`` axes and dtype ``dtype`` (Dask's ``meta``)."""
    import array_api_compat

    xp = array_api_compat.array_namespace(like)
    return xp.empty((0,) * ndim, dtype=_dtype(xp, dtype), device=array_api_compat.device(like))


def _dtype(xp, name: str):
    return getattr(xp, name)


def empty_block(meta: Any, shape: tuple[int, ...], dtype: str):
    """An uninitialised block like ``meta`` (a chunk type's zero-size array; None: NumPy's), for explaining
    block calls without data."""
    import array_api_compat
    import numpy as np

    like = np.empty(0) if meta is None else meta
    xp = array_api_compat.array_namespace(like)
    return xp.empty(shape, dtype=_dtype(xp, dtype), device=array_api_compat.device(like))


def tree_sum(dsk: dict, prefix: str, index: tuple, keys: list, split_every: int, fn) -> Any:
    """Add graph nodes summing ``keys`` ``split_every`` at a time (keys ``(prefix-level, *index, n)``);
    returns the key of the total (the only key when there is one)."""
    level = 0
    while len(keys) > 1:
        nxt = []
        for g in range(0, len(keys), split_every):
            group = keys[g : g + split_every]
            if len(group) == 1:
                nxt.append(group[0])
                continue
            key = (f"{prefix}-{level}", *index, len(nxt))
            dsk[key] = (fn, *group)
            nxt.append(key)
        keys, level = nxt, level + 1
    return keys[0]
