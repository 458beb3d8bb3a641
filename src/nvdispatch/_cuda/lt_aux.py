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

__all__ = ["aux_output", "aux_input_pointer", "bias_gradient_output"]


def aux_output(p: MatmulProblem, s: LtSetup, kind: str, device_index: int, stream: int):
    """``(aux array in the caller's kind, its pointer)`` of the epilogue's aux output (``s.aux_out``)."""
    batch = p.batch_shape
    if s.aux_out == "relu":
        nbytes = s.aux_ld // 8
        buf, ptr = empty(kind, (*batch, s.n_lt, nbytes), "uint8", device_index, stream)
        if s.orientation == "row":
            return buf, ptr
        st = c_strides((*batch, s.n_lt, nbytes))
        return make_view(kind, buf, (*batch, nbytes, s.n_lt), (*st[:-2], 1, nbytes)), ptr
    ld = s.aux_ld
    buf, ptr = empty(kind, (*batch, s.n_lt, ld), p.result_dtype, device_index, stream)
    st = c_strides((*batch, s.n_lt, ld))
    if s.orientation == "row":  # (m, n) rows padded to ld
        shape, strides = (*batch, p.m, p.n), (*st[:-2], ld, 1)
    else:
        shape, strides = (*batch, p.m, p.n), (*st[:-2], 1, ld)
    if p.a_vector or p.b_vector:
        keep_axes = [
            i
            for i, d in enumerate(shape)
            if not ((i == len(shape) - 2 and p.a_vector) or (i == len(shape) - 1 and p.b_vector))
        ]
        shape = tuple(shape[i] for i in keep_axes)
        strides = tuple(strides[i] for i in keep_axes)
    return make_view(kind, buf, shape, strides), ptr


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


def bias_gradient_output(p: MatmulProblem, s: LtSetup, kind: str, device_index: int, stream: int):
    """``(bias gradient in the caller's kind and shape, the pointer cuBLASLt writes it to)`` (``s.bgrad``)."""
    bshape = (*p.batch_shape, s.bgrad_len)
    g, ptr = empty(kind, bshape, p.result_dtype, device_index, stream)
    if s.bgrad in ("drelu_bgrad", "dgelu_bgrad") and p.options.bgrad_axis == "m":
        g = make_view(kind, g, (*p.batch_shape, s.bgrad_len, 1), c_strides((*p.batch_shape, s.bgrad_len, 1)))
    elif s.bgrad in ("bgrada", "bgradb") and p.batch_shape:
        src = p.a if s.bgrad == "bgrada" else p.b
        vec = p.a_vector if s.bgrad == "bgrada" else p.b_vector
        if vec or len(src.shape) == 2:  # the operand is not batched: every batch gives the same
            g = make_view(kind, g, (s.bgrad_len,), (1,))
    return g, ptr
