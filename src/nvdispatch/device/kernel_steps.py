"""A launch of a compiled kernel, described once: which kernel, its grid, block and dynamic shared memory, and its
arguments, the arrays among them named by their place in a tuple of per-call operands.

A plan describes its launches for its fixed problem when it is made; each call then hands the operands only:

* :func:`launch_with_numba` launches the steps through Numba on arrays (Numba device arrays, or NumPy arrays
  under Numba's CUDA simulator), each operand reshaped to what its step says;
* the ``"cuda"`` executor launches the same steps from device pointers through the driver, their parameters
  packed once (:mod:`nvdispatch.executors.cuda_numba_launch`).

Scalar arguments are NumPy scalars of the type the kernel was compiled for (``np.int64``, ``np.float32``...), so
that the Numba type of every argument follows from the step itself (:meth:`KernelStep.argument_types`).

Examples
--------
>>> import numpy as np
>>> a = ArrayArg(1, (4, 8), np.dtype(np.complex64))
>>> a.ndim, a.itemsize, a.c_strides()
(2, 8, (64, 8))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ArrayArg", "KernelStep", "launch_with_numba"]


@dataclass(frozen=True)
class ArrayArg:
    """A C-contiguous array argument: operand ``operand`` of the call seen with ``shape`` and ``dtype``."""

    operand: int
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def c_strides(self) -> tuple[int, ...]:
        """The strides in bytes of a C-contiguous array of this shape."""
        strides, step = [], self.itemsize
        for extent in reversed(self.shape):
            strides.append(step)
            step *= extent
        return tuple(reversed(strides))


@dataclass(frozen=True)
class KernelStep:
    """One launch: ``dispatcher[grid, block, stream, shared](*args)`` with the :class:`ArrayArg` of ``args``
    taken from the call's operands."""

    dispatcher: Any  # a numba.cuda.jit kernel
    grid: tuple[int, ...]
    block: tuple[int, ...]
    shared: int
    args: tuple[Any, ...]  # ArrayArg | NumPy scalar

    def argument_types(self) -> tuple:
        """The Numba types of the arguments (what the kernel is compiled for); not under the simulator."""
        from numba.cuda import types
        from numba.np.numpy_support import from_dtype

        out = []
        for a in self.args:
            if isinstance(a, ArrayArg):
                out.append(types.Array(from_dtype(a.dtype), a.ndim, "C"))
            else:
                out.append(from_dtype(np.asarray(a).dtype))
        return tuple(out)


def _reshaped(operand, arg: ArrayArg):
    return operand if tuple(operand.shape) == arg.shape else operand.reshape(arg.shape)


def launch_with_numba(
    steps: Sequence[KernelStep],
    operands: Sequence[Any],
    stream=0,
    view: Callable[[Any, ArrayArg], Any] = _reshaped,
) -> None:
    """Launch ``steps`` in order through Numba on ``stream`` (a Numba stream, or 0), each array argument
    ``view(operands[arg.operand], arg)``: by default the operand (a C-contiguous array) reshaped to the
    argument's shape."""
    for step in steps:
        args = [view(operands[a.operand], a) if isinstance(a, ArrayArg) else a for a in step.args]
        step.dispatcher[step.grid, step.block, stream, step.shared](*args)
