"""The epilogue's extra buffers of a regular cuBLASLt plan: the aux output it writes (RELU/GELU_AUX), the aux
input it reads (DRELU/DGELU), the bias gradient it writes (BGRAD epilogues) — each allocated or converted into
cuBLASLt's layout (see :class:`~.lt_setup.LtSetup`) and presented to the caller as the formats below.

Formats of the auxiliary outputs (cuBLASLt's own; documented for users in ``executors/cuda.py``):

``relu_aux``
    cuBLASLt's bit mask, ``uint8``. For results in the ``"row"`` orientation (the default; bias along N) it
    has shape ``(..., m, ceil128(n) / 8)``: bit ``j % 8`` of byte ``j // 8`` of row ``i`` is ``d[i, j] > 0``.
    In the ``"col"`` orientation (bias along M) it is the transposed view ``(..., ceil128(m) / 8, n)`` of a
    ``(..., n, ceil128(m) / 8)`` buffer. DRELU accepts either, or a boolean mask of the result's shape.
``gelu_aux``
    the pre-activation, result dtype and shape, as a view of a buffer whose leading dimension is padded to
    a multiple of 8 elements (cuBLASLt's requirement), C-ordered ("row") or F-ordered ("col").
"""

from __future__ import annotations

from .._matmul_problem import MatmulProblem
from .._strides import c_strides
from .arrays import empty, make_view
from .lt_setup import LtSetup
from .xp import as_xp

__all__ = ["aux_output", "aux_output_layout", "aux_input_pointer", "bias_gradient_output", "bias_gradient_layout"]


def aux_output_layout(p: MatmulProblem, s: LtSetup) -> tuple:
    """``(shape, dtype, view)`` of the epilogue's aux output (``s.aux_out``): the C-ordered buffer cuBLASLt
    writes, and the ``(shape, strides)`` in elements the caller sees of it (None: the buffer itself)."""
    batch = p.batch_shape
    if s.aux_out == "relu":
        nbytes = s.aux_ld // 8
        shape = (*batch, s.n_lt, nbytes)
        if s.orientation == "row":
            return shape, "uint8", None
        st = c_strides(shape)
        return shape, "uint8", ((*batch, nbytes, s.n_lt), (*st[:-2], 1, nbytes))
    ld = s.aux_ld
    buffer = (*batch, s.n_lt, ld)
    st = c_strides(buffer)
    shape = (*batch, p.m, p.n)
    strides = (*st[:-2], ld, 1) if s.orientation == "row" else (*st[:-2], 1, ld)  # (m, n) padded to ld
    if p.a_vector or p.b_vector:
        keep_axes = [
            i
            for i, d in enumerate(shape)
            if not ((i == len(shape) - 2 and p.a_vector) or (i == len(shape) - 1 and p.b_vector))
        ]
        shape = tuple(shape[i] for i in keep_axes)
        strides = tuple(strides[i] for i in keep_axes)
    return buffer, p.result_dtype, (shape, strides)


def aux_output(p: MatmulProblem, s: LtSetup, kind: str, device_index: int, stream: int):
    """``(aux array in the caller's kind, its pointer)`` of the epilogue's aux output (``s.aux_out``)."""
    shape, dtype, view = aux_output_layout(p, s)
    buf, ptr = empty(kind, shape, dtype, device_index, stream)
    return (buf if view is None else make_view(kind, buf, *view)), ptr


def aux_input_pointer(p: MatmulProblem, s: LtSetup, operands, framework: str, xp, get_ptr, keep: list) -> int:
    """The pointer of the epilogue's aux input (``s.aux_in``): the caller's array read in place, or converted
    into cuBLASLt's layout with the helper namespace ``xp`` (the conversion appended to ``keep``)."""
    if s.aux_in == "direct":
        name = "relu_aux" if "relu_aux" in p.input_sigs else "gelu_aux"
        return get_ptr(operands[name])
    if "gelu_aux" in p.input_sigs:
        g = as_xp(operands["gelu_aux"], framework, xp.name)
        g = g.reshape(p.promoted_shape) if (p.a_vector or p.b_vector) else g
        buf = xp.empty((*p.batch_shape, s.n_lt, s.aux_ld), p.result_dtype)
        view = buf[..., : s.m_lt]
        xp.copy_into(view, xp.swap_last(g) if s.orientation == "col" else g)
        keep.append(buf)
        return xp.data_ptr(buf)
    mask = as_xp(operands["relu_aux"], framework, xp.name)
    if s.aux_in == "repack":  # bits of the other orientation -> boolean (..., m, n)
        if s.orientation == "col":
            mask = xp.unpack_mask(xp.contiguous(mask), p.n)
        else:
            mask = xp.swap_last(xp.unpack_mask(xp.contiguous(xp.swap_last(mask)), p.m))
    elif p.a_vector or p.b_vector:
        mask = mask.reshape(p.promoted_shape)
    m2 = mask if s.orientation == "row" else xp.swap_last(mask)
    bits = xp.pack_mask(xp.contiguous(m2), s.aux_ld)
    if p.batch_shape and tuple(bits.shape[:-2]) != tuple(p.batch_shape):
        bits = xp.contiguous(bits, (*p.batch_shape, *bits.shape[-2:]))
    keep.append(bits)
    return xp.data_ptr(bits)


def bias_gradient_layout(p: MatmulProblem, s: LtSetup) -> tuple:
    """``(shape, dtype, view)`` of the bias gradient (``s.bgrad``): the C-ordered buffer cuBLASLt writes, and the
    ``(shape, strides)`` in elements the caller sees of it (None: the buffer itself)."""
    bshape = (*p.batch_shape, s.bgrad_len)
    view = None
    if s.bgrad in ("drelu_bgrad", "dgelu_bgrad") and p.options.bgrad_axis == "m":
        view = (*p.batch_shape, s.bgrad_len, 1), c_strides((*p.batch_shape, s.bgrad_len, 1))
    elif s.bgrad in ("bgrada", "bgradb") and p.batch_shape:
        src = p.a if s.bgrad == "bgrada" else p.b
        vec = p.a_vector if s.bgrad == "bgrada" else p.b_vector
        if vec or len(src.shape) == 2:  # the operand is not batched: every batch gives the same
            view = (s.bgrad_len,), (1,)
    return bshape, p.result_dtype, view


def bias_gradient_output(p: MatmulProblem, s: LtSetup, kind: str, device_index: int, stream: int):
    """``(bias gradient in the caller's kind and shape, the pointer cuBLASLt writes it to)`` (``s.bgrad``)."""
    shape, dtype, view = bias_gradient_layout(p, s)
    g, ptr = empty(kind, shape, dtype, device_index, stream)
    return (g if view is None else make_view(kind, g, *view)), ptr
