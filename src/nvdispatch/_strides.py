"""Element strides of C-ordered (row-major) arrays: what a layout is when no strides are given."""

from __future__ import annotations

__all__ = ["c_strides"]


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
