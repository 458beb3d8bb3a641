"""Array passes on raw device pointers, with no array framework: what the ``cuda`` executor's prepared FFTs
(:mod:`nvdispatch.executors.cuda_fft_prepared`) run where neither CuPy nor Torch can (a Numba- or JAX-only user).

Made of :mod:`.raw_calls`'s primitives only, all on the caller's stream:

* a strided copy (:func:`copy_geometry`, :func:`strided_copy`): the kept region of ``x`` (any positive strides)
  into C-contiguous scratch, as few ``cudaMemcpy2DAsync``/``cudaMemcpy3DAsync`` calls as the layout allows (dims
  merged where both sides are contiguous across them; one copy for a C-contiguous ``x`` of the scratch's extents),
  widening real to complex by writing each real element into the real part of a complex one (the destination's
  element pitch twice the source's; width one real element; the imaginary parts zeroed first);
* zeroing (``cudaMemsetAsync``) for padding and widening;
* conjugation and the norm's scale: ``cublasSscal``/``cublasDscal`` over the real view (imaginary parts: every
  other real element from the second, ``incx=2``).
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

from . import raw_calls

__all__ = ["CopyGeometry", "copy_geometry", "strided_copy", "scale_and_conj", "MAX_COPIES", "MAX_PITCH"]

#: the most copy calls one strided copy may take (beyond that the executor declines: the layout is too scattered)
MAX_COPIES = 4096
#: the largest pitch given to a 2-D/3-D copy (cudaDevAttrMaxPitch is 2**31 - 1 bytes on current GPUs)
MAX_PITCH = 2**31 - 1


@dataclass(frozen=True)
class CopyGeometry:
    """A strided copy as ``copies`` calls: ``width`` bytes per row; ``rows``/``slices``: ``(count, src pitch, dst
    pitch)`` in bytes of the 2-D/3-D copy (None: not used); ``loops``: ``(count, src step, dst step)`` the host
    iterates over, one copy each."""

    width: int
    rows: tuple[int, int, int] | None
    slices: tuple[int, int, int] | None
    loops: tuple[tuple[int, int, int], ...]
    empty: bool = False

    @property
    def copies(self) -> int:
        return 0 if self.empty else math.prod(n for n, _, _ in self.loops)

    def describe(self) -> str:
        call = "cudaMemcpy3DAsync" if self.slices else "cudaMemcpy2DAsync"
        return f"{self.copies} {call} call{'s' if self.copies != 1 else ''}"


@functools.lru_cache(maxsize=256)
def copy_geometry(extents: tuple[int, ...], src_strides: tuple[int, ...], dst_strides: tuple[int, ...],
                  width: int) -> CopyGeometry:  # fmt: skip
    """How to copy an array of ``extents`` whose elements are ``width`` bytes, at byte strides ``src_strides``
    (positive where the extent is above 1) to byte strides ``dst_strides`` (non-overlapping), with the fewest
    copy calls."""
    if any(n == 0 for n in extents):
        return CopyGeometry(width, None, None, (), empty=True)
    dims: list[tuple[int, int, int]] = []
    for n, s, d in zip(extents, src_strides, dst_strides):
        if n == 1:
            continue
        if dims and dims[-1][1] == s * n and dims[-1][2] == d * n:  # contiguous across both: one dim
            dims[-1] = (dims[-1][0] * n, s, d)
        else:
            dims.append((n, s, d))
    if dims and dims[-1][1] == width and dims[-1][2] == width:  # rows of adjacent elements on both sides
        width *= dims.pop()[0]
    best = CopyGeometry(width, None, None, tuple(dims))
    for i, (n, s, d) in enumerate(dims):
        if not (width <= s <= MAX_PITCH and width <= d <= MAX_PITCH):
            continue
        rest = dims[:i] + dims[i + 1 :]
        cand = CopyGeometry(width, (n, s, d), None, tuple(rest))
        for j, (m, ss, dd) in enumerate(rest):  # a 3-D copy: slices whose steps are whole pitches, rows fitting
            if ss % s == 0 and dd % d == 0 and ss // s >= n and dd // d >= n:
                three = CopyGeometry(width, (n, s, d), (m, ss, dd), tuple(rest[:j] + rest[j + 1 :]))
                if three.copies < cand.copies:
                    cand = three
        if cand.copies < best.copies:
            best = cand
    return best


def strided_copy(g: CopyGeometry, dst: int, src: int, stream: int) -> None:
    """Queue the copy ``g`` from ``src`` to ``dst`` (device pointers) on ``stream``."""
    if g.empty:
        return
    counts = [range(n) for n, _, _ in g.loops]
    for idx in itertools.product(*counts):
        so = sum(i * s for i, (_, s, _) in zip(idx, g.loops))
        do = sum(i * d for i, (_, _, d) in zip(idx, g.loops))
        if g.slices is not None:
            (n, s, d), (m, ss, dd) = g.rows, g.slices
            raw_calls.copy3d(dst + do, d, dd // d, src + so, s, ss // s, g.width, n, m, stream)
        elif g.rows is not None:
            n, s, d = g.rows
            raw_calls.copy2d(dst + do, d, src + so, s, g.width, n, stream)
        else:
            raw_calls.copy2d(dst + do, g.width, src + so, g.width, g.width, 1, stream)


def _scal(real_dtype: str, n: int, alpha: float, ptr: int, incx: int, itemsize: int, stream: int, dev: int) -> None:
    """``scal`` over ``n`` elements, in calls of at most cuBLAS's ``int`` count."""
    done = 0
    while done < n:
        k = min(n - done, raw_calls.INT_MAX)
        raw_calls.scal(real_dtype, k, alpha, ptr + done * incx * itemsize, incx, stream, dev)
        done += k


def scale_and_conj(ptr: int, count: int, dtype: str, scale: float, conj: bool, stream: int, dev: int) -> None:
    """In place on the ``count`` contiguous ``dtype`` elements at ``ptr``: multiply by ``scale`` and, for a
    complex ``dtype`` where ``conj``, conjugate (the imaginary parts multiplied by ``-scale``)."""
    complex_ = dtype.startswith("complex")
    real = {"complex64": "float32", "complex128": "float64"}.get(dtype, dtype)
    rsz = 4 if real == "float32" else 8
    if not (complex_ and conj):
        if scale != 1.0:
            _scal(real, count * (2 if complex_ else 1), scale, ptr, 1, rsz, stream, dev)
        return
    if scale != 1.0:
        _scal(real, count, scale, ptr, 2, rsz, stream, dev)  # real parts
    _scal(real, count, -scale, ptr + rsz, 2, rsz, stream, dev)  # imaginary parts
