"""The epilog step vocabulary (see ``_epilog.apply_steps``) on CuPy arrays, in place.

Used by the GPU executors' unfused fallback (``_cuda/lt_inplace.InplacePlan``) on CuPy arrays; the semantics are
those documented in ``_epilog``. float16 math (GELU, its gradient, reductions) runs in float32.
"""

from __future__ import annotations

from ._epilog import gelu_tanh, gelu_tanh_grad

__all__ = ["CupyEpilogOps", "CUPY_INPLACE"]


def _cupy():
    import cupy

    return cupy


def _wide(x):
    cupy = _cupy()
    return x.astype(cupy.float32) if x.dtype == cupy.float16 else x


class CupyEpilogOps:
    """The epilog steps on CuPy arrays, in place."""

    @staticmethod
    def add_(d, x):
        d += x.astype(d.dtype, copy=False)

    @staticmethod
    def relu_(d):
        _cupy().maximum(d, 0, out=d)  # keeps NaN, as cuBLASLt's RELU epilogue

    @staticmethod
    def positive_mask(d):
        return d > 0

    @staticmethod
    def gelu_(d):
        cupy = _cupy()
        x = _wide(d)
        r = gelu_tanh(x, cupy, out=x)
        if r is not d:
            d[...] = r

    @staticmethod
    def copy(d):
        return d.copy()

    @staticmethod
    def mask_(d, mask):
        d[...] = _cupy().where(mask, d, 0)  # 0 where the mask is clear, even where d is inf/NaN

    @staticmethod
    def mul_(d, x):
        d *= x

    @staticmethod
    def gelu_grad(x):
        return gelu_tanh_grad(_wide(x), _cupy()).astype(x.dtype)

    @staticmethod
    def sum(x, axis, keepdims):
        cupy = _cupy()
        if x.dtype == cupy.float16:  # accumulate in float32, round once
            return x.sum(axis=axis, keepdims=keepdims, dtype=cupy.float32).astype(x.dtype)
        return x.sum(axis=axis, keepdims=keepdims)


CUPY_INPLACE = CupyEpilogOps()
