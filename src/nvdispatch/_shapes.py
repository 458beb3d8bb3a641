"""Shape arithmetic the problem builders share, in plain Python: shapes of any size (``np.broadcast_shapes``
refuses those whose element count a NumPy array could not hold), and sizes only compared, never converted to
integers or hashed, so the symbolic sizes of a traced program (a Torch fake tensor's under ``dynamic=True``) stay
symbolic instead of being fixed to the sizes seen first."""

from __future__ import annotations

import operator

__all__ = ["broadcast_shapes", "as_size", "is_symbolic"]


def is_symbolic(value) -> bool:
    """Whether ``value`` is a traced program's symbolic number (a type with the symbolic-number protocol's
    ``__sym_float__``, as Torch's ``SymInt``/``SymFloat``/``SymBool``), which a check may compare or order but
    must not convert (that would fix the program to the value seen first).

    >>> is_symbolic(3), is_symbolic(2.5)
    (False, False)
    """
    return not isinstance(value, (int, float, complex)) and hasattr(type(value), "__sym_float__")


def as_size(value):
    """``value`` as an integer size: ``operator.index(value)``, except that a symbolic integer (a type with the
    symbolic-number protocol's ``__sym_float__``, as a Torch ``SymInt`` of a traced program) is kept as it is:
    indexing it would fix the traced program to the value seen first. ``TypeError`` for what is no integer.

    >>> import numpy as np
    >>> as_size(np.int64(5)), as_size(7)
    (5, 7)
    """
    return value if is_symbolic(value) else operator.index(value)


def broadcast_shapes(*shapes: tuple) -> tuple:
    """NumPy's broadcast of ``shapes``; ``ValueError`` when they do not broadcast.

    >>> broadcast_shapes((3, 1, 5), (4, 1), ())
    (3, 4, 5)
    """
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for shape in shapes:
        for i, size in enumerate(shape, ndim - len(shape)):
            if size == 1:
                continue
            if out[i] == 1:
                out[i] = size
            elif out[i] != size:
                raise ValueError(f"shapes {[tuple(s) for s in shapes]} do not broadcast")
    return tuple(out)
