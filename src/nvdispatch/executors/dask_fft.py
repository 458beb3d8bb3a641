"""FFT on Dask arrays: block by block along whole axes, rechunking (pencil/slab transposes) where needed.

A block transform is right only when the block holds whole transformed axes. Each call is cut into
*stages*; a stage transforms axes that are whole (one chunk) in the current chunking, one
``nvdispatch.fft`` call per block on the worker. Where a transformed axis is chunked, a stage first
rechunks: its axes become whole while the other axes are split to keep blocks no larger than they were
(Dask's ``"auto"`` with that limit), so no block grows and no worker ever holds the whole array unless the
array has a single axis. For ``fftn``/``rfftn`` over several chunked axes this is the pencil (slab)
decomposition: transform the axes that are whole, transpose by rechunking, transform the rest.
``rfftn`` does its real-to-complex axis (the last of ``axes``) in the first stage, ``irfftn`` its
complex-to-real axis in the last; c2c axes are separable, and the per-stage ``norm`` scalings multiply to
the requested one. ``explain()`` lists each stage and what each rechunk moves.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from .. import fft
from .._fft_problem import FFTProblem
from ..errors import InvalidArgumentError
from . import dask_graph as G
from . import dask_tasks as T
from .dask_matmul import block_lines

_log = logging.getLogger("nvdispatch")


def decline(problem: FFTProblem) -> str | None:
    return None


def strategies(problem: FFTProblem) -> tuple[str, ...]:
    return ("stages",)


def plan(problem: FFTProblem, strategy: str, tuning=None):
    return DaskFFTPlan(problem)


class Stage:
    """One pass over the blocks: an optional rechunk (``target``), then ``func(**kwargs)`` per block."""

    def __init__(self, target, func: str, kwargs: dict, out_chunks, out_dtype: str, note: str | None):
        self.target, self.func, self.kwargs = target, func, kwargs
        self.out_chunks, self.out_dtype, self.note = out_chunks, out_dtype, note


class DaskFFTPlan:
    """The stages of one Dask FFT (from the operand's chunks); ``execute`` builds the graph."""

    strategy = "stages"

    def __init__(self, p: FFTProblem):
        self.problem = p
        self.chunk_framework = p.chunks.chunk_framework if p.chunks is not None else "numpy"
        self.chunk_meta = p.chunks.meta if p.chunks is not None else None
        chunks = p.chunks.chunks if p.chunks is not None else tuple((s,) for s in p.shape)
        self.stages = self._stages(list(chunks))
        self._steps = self._describe()

    # -- planning ------------------------------------------------------------------------------------------
    def _stages(self, chunks: list) -> list[Stage]:
        p = self.problem
        length = dict(zip(p.axes, p.lengths))
        last = p.axes[-1]
        remaining = list(p.axes)
        dtype = p.dtype
        limit = max(G.largest_block_bytes(chunks, p.compute_dtype), 1 << 20)
        stages: list[Stage] = []
        while remaining:
            first = not stages
            group = self._whole_group(remaining, chunks, first)
            target, note = None, None
            if not group:
                group = self._group_to_make_whole(remaining, len(chunks), first)
                target = _rechunk_target(chunks, group, dtype, limit, tuple(_shape(chunks)))
                note = self._rechunk_note(chunks, target, dtype)
                chunks = list(target)
            func, kwargs, out_dtype = self._call(group, first, len(remaining) == len(group), length)
            for ax in group:
                n = length[ax]
                if ax == last and p.kind == "r2c":
                    n = n // 2 + 1
                chunks[ax] = (n,)
            stages.append(Stage(target, func, kwargs, tuple(chunks), out_dtype, note))
            remaining = [ax for ax in remaining if ax not in group]
            dtype = out_dtype
        return stages

    def _whole_group(self, remaining, chunks, first: bool) -> list[int]:
        """The remaining axes a stage can transform now (whole, and in an order the transform allows)."""
        p = self.problem
        last = p.axes[-1]
        whole = [ax for ax in remaining if len(chunks[ax]) == 1]
        if p.kind == "r2c" and first and last not in whole:
            return []  # the real-to-complex axis goes first
        if p.kind == "c2r" and last in whole and len(whole) < len(remaining):
            whole.remove(last)  # the complex-to-real axis goes last
        return whole

    def _group_to_make_whole(self, remaining, ndim: int, first: bool) -> list[int]:
        """The axes the next rechunk makes whole: all remaining ones when other axes can hold the split,
        else half of them (a slab), keeping the real-to-complex axis first / complex-to-real axis last."""
        p = self.problem
        last = p.axes[-1]
        if ndim > len(remaining):
            return list(remaining)
        if len(remaining) == 1:
            return list(remaining)  # a 1-D array transformed along its only axis: one block
        if p.kind == "r2c" and first:
            others = [ax for ax in remaining if ax != last]
            return others[len(others) // 2 + len(others) % 2 :] + [last]
        if p.kind == "c2r":
            others = [ax for ax in remaining if ax != last]
            return others[: max(1, len(others) // 2)] if len(others) > 1 else others
        return remaining[len(remaining) // 2 :]

    def _call(self, group, first: bool, final: bool, length):
        """(function, keyword arguments, output dtype) of a stage's block call."""
        p = self.problem
        last = p.axes[-1]
        if not p.ndim_api:
            return p.func, {"n": p.lengths[0], "axis": p.axes[0], "norm": p.norm}, p.result_dtype
        axes = [ax for ax in p.axes if ax in group]  # the caller's order (the last stays last)
        s = [length[ax] for ax in axes]
        kwargs = {"s": tuple(s), "axes": tuple(axes), "norm": p.norm}
        if p.kind == "r2c":
            return ("rfftn" if first else "fftn"), kwargs, p.compute_dtype
        if p.kind == "c2r":
            return (
                ("irfftn" if last in group else "ifftn"),
                kwargs,
                (p.result_dtype if last in group else p.compute_dtype),
            )
        return p.func, kwargs, p.compute_dtype

    def _rechunk_note(self, chunks, target, dtype: str) -> str:
        shape = _shape(chunks)
        moved = math.prod(shape) * G.itemsize(dtype)
        changes = ", ".join(
            f"axis {ax} {G.describe_chunks(was)} → {G.describe_chunks(now)}"
            for ax, (was, now) in enumerate(zip(chunks, target))
            if tuple(was) != tuple(now)
        )
        biggest = G.largest_block_bytes(target, dtype)
        return (
            f"rechunk x ({changes}) so the transformed axes are whole: an all-to-all exchange moving up to "
            f"{_mib(moved)} between workers, blocks of at most {_mib(biggest)}"
        )

    # -- explain -------------------------------------------------------------------------------------------
    def _describe(self) -> tuple[str, ...]:
        p = self.problem
        steps = [f"Dask graph: {p.describe()} in {len(self.stages)} stage(s)"]
        for n, st in enumerate(self.stages, 1):
            if st.note:
                steps.append(f"stage {n}: {st.note}")
            args = ", ".join(f"{k}={v!r}" for k, v in st.kwargs.items())
            blocks = math.prod(len(c) for c in st.out_chunks)
            steps.append(f"stage {n}: nvdispatch.fft.{st.func}(block, {args}) on each of {blocks} blocks")
        steps.append(
            f"block calls run {self.chunk_framework} blocks through nvdispatch.fft on each worker "
            "(executor chosen there, under the caller's backend state; plans from the worker's cache)"
        )
        return tuple(steps)

    @property
    def steps(self) -> tuple[str, ...]:
        return (*self._steps, *block_lines(self.explain_block))

    def explain_block(self, state: T.CarriedState):
        """The explanation of the first stage's first block call, as a worker would run it."""
        p = self.problem
        st = self.stages[0]
        chunks = st.target if st.target is not None else (p.chunks.chunks if p.chunks else [(s,) for s in p.shape])
        block = G.empty_block(self.chunk_meta, tuple(c[0] for c in chunks), p.dtype)
        with T.applied(state):
            return getattr(fft, st.func).__nvdispatch_explain__(block, **st.kwargs)

    def release(self) -> None:
        pass

    # -- the graph -----------------------------------------------------------------------------------------
    def execute(self, operands, stream=None):
        import dask.array as da

        x = G.wrap(operands["x"])
        state = T.carry_state()
        meta_like = x._meta
        for st in self.stages:
            if st.target is not None:
                x = G.rechunk(x, st.target)
            call = T.FFTBlockCall(st.func, tuple(st.kwargs.items()), state)
            x = da.map_blocks(
                T.fft_block,
                call,
                x,
                name=f"nvdispatch-fft-{st.func}-" + G.token(x.name, call),
                chunks=st.out_chunks,
                dtype=np.dtype(st.out_dtype),
                meta=G.meta_of(meta_like, len(st.out_chunks), st.out_dtype),
            )
        _log.debug(
            "dask fft %s: %d stage(s) %s, %d rechunk(s)",
            x.name,
            len(self.stages),
            [st.func for st in self.stages],
            sum(st.target is not None for st in self.stages),
        )
        return x


def _shape(chunks) -> list[int]:
    return [sum(c) for c in chunks]


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def _rechunk_target(chunks, group, dtype: str, limit: int, shape: tuple[int, ...]):
    """Chunks with the ``group`` axes whole and the others split ("auto") to blocks of at most ``limit``."""
    from dask.array.core import normalize_chunks

    spec = tuple(-1 if ax in group else "auto" for ax in range(len(chunks)))
    return normalize_chunks(spec, shape, limit=limit, dtype=np.dtype(dtype), previous_chunks=tuple(chunks))


# -- frequencies ----------------------------------------------------------------------------------------------------
def freq(n: int, d, real: bool, chunks, like):
    """``fftfreq``/``rfftfreq`` as a Dask array of blocks like ``like`` (a length-1 result of the plain call,
    which fixed dtype and device), chunked ``chunks`` (anything ``dask.array`` accepts)."""
    import dask.array as da
    from dask.array.core import normalize_chunks

    length = n // 2 + 1 if real else n
    try:
        (sizes,) = normalize_chunks(chunks, (length,), dtype=np.dtype(str(like.dtype).removeprefix("torch.")))
    except (ValueError, TypeError) as exc:
        raise InvalidArgumentError("chunks", f"a chunking of a length-{length} axis", repr(chunks), str(exc)) from None
    meta = like[:0]
    name = f"nvdispatch-{'r' if real else ''}fftfreq-" + G.token(n, d, sizes, str(like.dtype), str(type(like)))
    bounds = G.boundaries(sizes)
    dsk = {(name, i): (T.freq_block, a, b, n, d, real, meta) for i, (a, b) in enumerate(zip(bounds, bounds[1:]))}
    return da.Array(dsk, name, (sizes,), meta=meta)

