"""The epilog step vocabulary (see ``_epilog.apply_steps``) on NumPy arrays.

One vocabulary, two modes: in place (each step writes into the result, no full-size temporary beyond what a
step must return; strategy ``inplace``) and out of place (each step a separate NumPy expression returning a new
array; strategy ``plain``). Both give the semantics documented in ``_epilog``.
"""

from __future__ import annotations

import numpy as np

from ._epilog import gelu_tanh, gelu_tanh_grad

__all__ = ["NumpyEpilogOps", "accumulator_dtype"]

#: dtypes whose reductions accumulate in a wider one
_WIDER = {np.dtype(np.float16): np.dtype(np.float32)}


def accumulator_dtype(dtype) -> np.dtype | None:
    """The dtype a reduction of ``dtype`` data accumulates in, where wider than ``dtype`` (else None)."""
    return _WIDER.get(np.dtype(dtype))


#: integer dtypes of the floating ones' sizes (masks are applied to the bits: exact zeros, whatever the value)
_BITS = {2: np.int16, 4: np.int32, 8: np.int64}


class NumpyEpilogOps:
    """The epilog steps on NumPy arrays; ``inplace`` says whether elementwise steps write into ``d``; reductions
    return ``dtype`` (default: their operand's), accumulated in float32 at least for float16 data. Every step
    returns the result (``d`` itself in place)."""

    def __init__(self, inplace: bool, dtype=None):
        self.inplace = inplace
        self.dtype = None if dtype is None else np.dtype(dtype)

    def add_(self, d, x):
        return np.add(d, x, out=d if self.inplace else None)

    def relu_(self, d):
        # maximum keeps NaN, as cuBLASLt's RELU epilogue (see _epilog)
        return np.maximum(d, 0, out=d if self.inplace else None)

    @staticmethod
    def positive_mask(d):
        return np.greater(d, 0)

    def gelu_(self, d):
        return gelu_tanh(d, np, out=d if self.inplace else None)

    @staticmethod
    def copy(d):
        return d.copy()

    def mask_(self, d, mask):
        # 0 where the mask is clear, whatever d holds there (inf * 0 would be NaN): multiply the bits by 0/1
        if d.dtype.kind != "f":
            return np.multiply(d, mask, out=d if self.inplace else None)
        bits = d.view(_BITS[d.itemsize])
        return np.multiply(bits, mask, out=bits if self.inplace else None).view(d.dtype)

    def mul_(self, d, x):
        if self.inplace:
            return np.multiply(d, x, out=d, casting="unsafe")
        return np.multiply(d, x).astype(d.dtype, copy=False)

    @staticmethod
    def gelu_grad(x):
        return gelu_tanh_grad(x.astype(np.result_type(x, np.float32), copy=False))

    def sum(self, x, axis, keepdims):
        dtype = self.dtype or x.dtype
        wide = accumulator_dtype(dtype) or accumulator_dtype(x.dtype)
        return np.sum(x, axis=axis, keepdims=keepdims, dtype=wide or dtype).astype(dtype, copy=False)
