"""Pure layout arithmetic for describing a row-major (NumPy-convention) matmul to cuBLASLt, which is
column-major. No GPU needed: the CPU test suite checks it.

Two *orientations* describe ``D = A @ B`` (``D`` of shape ``(..., m, n)``):

``"row"``
    cuBLASLt computes ``D^T = B^T A^T``: its A operand is our ``b`` seen as ``(n, k)``, its B operand our
    ``a`` seen as ``(k, m)``, and its column-major ``(n, m)`` output *is* a C-ordered ``(m, n)`` result.
    cuBLASLt's bias (one value per output row) then lies along our N: the ``(n,)``/``(1, n)`` neural-network
    bias is fused natively. DRELU_BGRAD/DGELU_BGRAD reduce over M (bias gradient ``(n,)``); cuBLASLt's
    BGRADA gives our ``bgradb`` and its BGRADB our ``bgrada``.
``"col"``
    cuBLASLt computes ``D = A B`` directly, its output being an F-ordered ``(m, n)`` result: bias along M
    (``(m, 1)``), bias gradient ``(m, 1)``; BGRADA/BGRADB map one to one.
"""

from __future__ import annotations

import math

__all__ = ["OP_N", "OP_T", "OP_C", "matrix_layout", "collapse_batch", "round_up", "relu_aux_ld_bits", "gelu_aux_ld"]

#: cublasOperation_t: as it is, transposed, conjugate-transposed (op C: a transposed layout whose memory holds the
#: conjugates of the operand's values, a Torch ``z.mH``, read without a copy)
OP_N, OP_T, OP_C = 0, 1, 2


def round_up(x: int, base: int) -> int:
    return -(-x // base) * base


def matrix_layout(rows: int, cols: int, srow: int, scol: int) -> tuple[int, int, int, int] | None:
    """How cuBLASLt can read a logical ``rows x cols`` matrix with element strides ``(srow, scol)``.

    Returns ``(op, mem_rows, mem_cols, ld)``: the memory holds a column-major ``mem_rows x mem_cols`` matrix
    with leading dimension ``ld`` and ``op`` (N or T) turns it into the logical one. None: the strides are
    not a (possibly transposed) column-major matrix; the operand must be copied.
    """
    if rows <= 1 and cols <= 1:
        return OP_N, rows, cols, max(rows, 1)
    if cols == 1:
        return (OP_N, rows, 1, rows) if srow == 1 else None
    if rows == 1:
        if scol == 1:
            return OP_T, cols, 1, cols
        return (OP_N, 1, cols, scol) if scol >= 1 else None
    if srow == 1 and scol >= rows:
        return OP_N, rows, cols, scol
    if scol == 1 and srow >= cols:
        return OP_T, cols, rows, srow
    return None


def collapse_batch(shape: tuple[int, ...], strides: tuple[int, ...], batch_shape: tuple[int, ...]) -> int | None:
    """The single batch stride (elements) of an operand whose batch dims are ``shape``/``strides``, broadcast
    against ``batch_shape`` (0 where it is broadcast); None if no single stride describes it."""
    nb = len(batch_shape)
    if len(shape) > nb:
        return None
    pad = nb - len(shape)
    full = [0] * pad + [0 if size == 1 else st for size, st in zip(shape, strides)]
    dims = [(batch_shape[i], full[i]) for i in range(nb) if batch_shape[i] != 1]
    if not dims:
        return 0
    step = dims[-1][1]
    expected = step
    for size, st in reversed(dims):
        if st != expected:
            return None
        expected = st * size
    return step


def relu_aux_ld_bits(rows: int) -> int:
    """cuBLASLt's ReLU bit-mask leading dimension (bits): a multiple of 128, at least ``rows``."""
    return round_up(max(rows, 1), 128)


def gelu_aux_ld(rows: int) -> int:
    """cuBLASLt's GELU aux leading dimension (elements): a multiple of 8, at least ``rows``."""
    return round_up(max(rows, 1), 8)


def batch_count(batch_shape: tuple[int, ...]) -> int:
    return math.prod(batch_shape) if batch_shape else 1
