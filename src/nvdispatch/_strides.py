"""Element strides: those of C-ordered (row-major) arrays, what a layout is when no strides are given; and whether
strides make elements overlap (a broadcast view), where nothing may be written."""

from __future__ import annotations

__all__ = ["c_strides", "overlapping"]


def c_strides(shape) -> tuple[int, ...]:
    """Element strides of a C-contiguous array of ``shape``.

    Examples
    --------
    >>> from nvdispatch._strides import c_strides
    >>> c_strides((2, 3, 4))
    (12, 4, 1)
    """
    out, step = [], 1
    for extent in reversed(shape):
        out.append(step)
        step *= max(int(extent), 1)
    return tuple(reversed(out))


def overlapping(shape, strides) -> bool:
    """Whether an array of ``shape`` and element ``strides`` has elements that share memory (a broadcast or
    expanded view: a stride 0 along an extent above 1, or strides that make two indices meet), where writing the
    array in place is ambiguous. Conservative: strides it cannot order (interleaved dimensions) count as
    overlapping.

    Examples
    --------
    >>> from nvdispatch._strides import overlapping
    >>> overlapping((4, 8), (8, 1)), overlapping((4, 8), (0, 1)), overlapping((1, 8), (0, 1))
    (False, True, False)
    """
    span = 0  # elements spanned by the faster dimensions
    for stride, n in sorted((abs(st), n) for n, st in zip(shape, strides) if n > 1):
        if stride <= span:
            return True
        span += stride * (n - 1)
    return False
