"""A matmul problem in cuBLASLt's terms, for one orientation (see :mod:`.lt_layout`): which of our operands is
cuBLASLt's A and B and how each is read (or copied first, where its strides or dtype cannot be described), the
epilogue, and the layouts of c, the bias, the aux outputs and inputs and the bias gradient. Pure arithmetic on
the problem: the CPU test suite checks it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._matmul_problem import MatmulProblem
from .._strides import c_strides
from . import lt_layout as L
from .cublaslt import CUDA_DTYPE

__all__ = ["LT_DTYPES", "lt_types", "Operand", "LtSetup", "setup", "orientations", "output_layouts"]

_REAL_FLOAT = {"float16", "bfloat16", "float32", "float64"}
LT_DTYPES = _REAL_FLOAT | {"complex64", "complex128"}

# cublasComputeType_t
_COMPUTE = {"float16": 68, "bfloat16": 68, "float32": 68, "float64": 70, "complex64": 68, "complex128": 70}
_COMPUTE_SCALE = {64: "float16", 65: "float16", 70: "float64", 71: "float64"}


def lt_types(problem: MatmulProblem) -> tuple[int, int, str]:
    """(compute type, scale cudaDataType, scale dtype name) of ``problem``."""
    dt = problem.result_dtype
    ct = problem.options.compute_type
    compute = int(ct) if ct is not None else _COMPUTE[dt]
    if problem.options.scale_type is not None:
        scale = problem.options.scale_type
    elif dt.startswith("complex"):
        scale = dt
    else:
        scale = _COMPUTE_SCALE.get(compute, "float32")
        if dt == "float64":
            scale = "float64"
    return compute, CUDA_DTYPE[scale], scale


@dataclass
class Operand:
    """One cuBLASLt input operand: our ``source`` operand ("a"/"b"), maybe copied to C order first. An operand whose
    memory holds the conjugates of its values (``ArraySig.conj``) is read with op C where its layout is a transposed
    one, else copied, ``conj_copy``: the copy conjugates."""

    source: str
    copy: bool
    op: int
    rows: int
    cols: int
    ld: int
    batch_stride: int
    conj_copy: bool = False


@dataclass
class LtSetup:
    """``setup``'s answer: the problem as one ``cublasLtMatmul`` in ``orientation``."""

    orientation: str
    epilogue: int
    m_lt: int
    n_lt: int
    k: int
    batch: int
    lt_a: Operand
    lt_b: Operand
    #: "none", "direct" (ld, batch stride) or "copy" (broadcast c into d first, then C = D)
    c_mode: str = "none"
    c_ld: int = 0
    c_batch_stride: int = 0
    bias_copy: bool = False
    bias_batch_stride: int = 0
    bias_cast: bool = False
    #: "relu"/"gelu" when the epilogue writes an aux output; its ld (bits for relu) and batch stride
    aux_out: str | None = None
    aux_ld: int = 0
    aux_batch_stride: int = 0
    #: how the aux input is used: None, "direct", "pack" (bool mask to bits), "repack" (bits of the other
    #: orientation), "copy" (gelu aux to a padded buffer)
    aux_in: str | None = None
    bgrad: str | None = None
    bgrad_len: int = 0
    notes: list[str] = field(default_factory=list)


def _matrix(sig, vector: str | None):
    """(shape2, strides2, batch_shape, batch_strides) of an operand; ``vector`` "a"/"b" for 1-D ones."""
    strides = sig.strides if sig.strides is not None else c_strides(sig.shape)
    if vector == "a":
        return (1, sig.shape[0]), (0, strides[0]), (), ()
    if vector == "b":
        return (sig.shape[0], 1), (strides[0], 0), (), ()
    return sig.shape[-2:], strides[-2:], sig.shape[:-2], strides[:-2]


def _operand(p: MatmulProblem, source: str, transpose: bool) -> Operand:
    sig = p.a if source == "a" else p.b
    vec = "a" if (source == "a" and p.a_vector) else ("b" if (source == "b" and p.b_vector) else None)
    (r, c), (sr, sc), bshape, bstrides = _matrix(sig, vec)
    copy = False
    bs = L.collapse_batch(bshape, bstrides, p.batch_shape)
    lay = L.matrix_layout(c, r, sc, sr) if transpose else L.matrix_layout(r, c, sr, sc)
    conj = getattr(sig, "conj", False)
    if lay is None or bs is None or sig.dtype != p.result_dtype or (conj and lay[0] != L.OP_T):
        copy = True  # a C-ordered copy broadcast to the full batch (conjugated, for a conjugated operand)
        sr, sc = c, 1
        bs = r * c if p.batch_shape else 0
        lay = L.matrix_layout(c, r, sc, sr) if transpose else L.matrix_layout(r, c, sr, sc)
    op, mr, mc, ld = lay
    if conj and not copy:  # a transposed layout of the conjugates: op C reads the values themselves
        op = L.OP_C
    return Operand(source, copy, op, mr if op == L.OP_N else mc, mc if op == L.OP_N else mr, ld, bs, conj and copy)


_BGRAD_SWAP = {256: 512, 512: 256}


def setup(p: MatmulProblem, orientation: str, bias_cast: bool = False, epilogue: int | None = None) -> LtSetup:
    """``p`` in cuBLASLt terms for ``orientation`` ("row" or "col"); ``epilogue`` overrides p's (e.g. 1:
    DEFAULT for the unfused fallback)."""
    m, n, k = p.m, p.n, p.k
    batch = L.batch_count(p.batch_shape)
    epi = int(p.epilog.epilog) if epilogue is None else epilogue
    if orientation == "row":
        lt_a, lt_b = _operand(p, "b", True), _operand(p, "a", True)
        m_lt, n_lt = n, m
        if epi in _BGRAD_SWAP:
            epi = _BGRAD_SWAP[epi]
    else:
        lt_a, lt_b = _operand(p, "a", False), _operand(p, "b", False)
        m_lt, n_lt = m, n
    # the layout math gives (op, mem rows, mem cols): store the *memory* shape for the layout descriptor
    for o in (lt_a, lt_b):
        if o.op != L.OP_N:
            o.rows, o.cols = o.cols, o.rows
    s = LtSetup(orientation, epi, m_lt, n_lt, k, batch, lt_a, lt_b)
    fused = epilogue is None

    if p.c is not None:
        s.c_mode = "copy"
        cshape = p.c.shape
        cstr = p.c.strides if p.c.strides is not None else c_strides(cshape)
        rshape = p.result_shape
        if (
            not p.a_vector
            and not p.b_vector
            and p.c.dtype == p.result_dtype
            and len(cshape) >= 2
            and tuple(cshape[-2:]) == (m, n)
        ):
            sm, sn = cstr[-2], cstr[-1]
            bs = L.collapse_batch(cshape[:-2], cstr[:-2], tuple(rshape[:-2]))
            if orientation == "row" and (sn == 1 or n == 1) and sm >= n and bs is not None:
                s.c_mode, s.c_ld, s.c_batch_stride = "direct", max(sm, 1), bs
            if orientation == "col" and (sm == 1 or m == 1) and sn >= m and bs is not None:
                s.c_mode, s.c_ld, s.c_batch_stride = "direct", max(sn, 1), bs
        if s.c_mode == "copy":
            s.notes.append("c is broadcast/copied into the result buffer first (its layout is not cuBLASLt's)")

    if not fused:
        return s
    spec = p.epilog
    inputs = p.input_sigs
    if "bias" in inputs:
        b = inputs["bias"]
        bstr = b.strides if b.strides is not None else c_strides(b.shape)
        if len(b.shape) == 1:
            ok, bs = bstr[0] == 1 or b.shape[0] == 1, 0
        else:
            axis = -1 if p.bias_axis == "n" else -2
            ok = bstr[axis] == 1 or b.shape[axis] == 1
            bs = L.collapse_batch(b.shape[:-2], bstr[:-2], p.batch_shape)
        if not ok or bs is None:
            s.bias_copy, bs = True, (m_lt if len(b.shape) > 1 and p.batch_shape else 0)
            s.notes.append("bias copied to a contiguous vector")
        s.bias_batch_stride = bs
        s.bias_cast = bias_cast and b.dtype != p.result_dtype
        if s.bias_cast:
            s.notes.append(f"bias cast {b.dtype} -> {p.result_dtype} (cuBLASLt takes no mixed bias here)")
    if spec.epilog.name in ("RELU_AUX", "RELU_AUX_BIAS"):
        s.aux_out, s.aux_ld = "relu", L.relu_aux_ld_bits(m_lt)
        s.aux_batch_stride = s.aux_ld * n_lt if p.batch_shape else 0
    elif spec.epilog.name in ("GELU_AUX", "GELU_AUX_BIAS"):
        s.aux_out, s.aux_ld = "gelu", L.gelu_aux_ld(m_lt)
        s.aux_batch_stride = s.aux_ld * n_lt if p.batch_shape else 0
    if spec.backward:
        name = "relu_aux" if "relu_aux" in inputs else "gelu_aux"
        sig = inputs[name]
        st = sig.strides if sig.strides is not None else c_strides(sig.shape)
        if name == "relu_aux":
            s.aux_ld = L.relu_aux_ld_bits(m_lt)
            s.aux_in = (
                "pack"
                if sig.dtype == "bool"
                else ("direct" if _bits_orientation(sig, st, p) == orientation else "repack")
            )
            s.aux_batch_stride = s.aux_ld * n_lt if p.batch_shape else 0
            if s.aux_in == "direct":
                s.aux_ld = (st[-2] if orientation == "row" else st[-1]) * 8
                bs = L.collapse_batch(sig.shape[:-2], st[:-2], p.batch_shape)
                if bs is None:
                    s.aux_in = "repack"
                else:
                    s.aux_batch_stride = bs * 8
        else:
            s.aux_ld = L.gelu_aux_ld(m_lt)
            s.aux_batch_stride = s.aux_ld * n_lt if p.batch_shape else 0
            s.aux_in = "copy"
            if len(sig.shape) >= 2 and not p.a_vector and not p.b_vector:
                sm, sn = st[-2], st[-1]
                ld = sm if orientation == "row" else sn
                inner = sn if orientation == "row" else sm
                bs = L.collapse_batch(sig.shape[:-2], st[:-2], p.batch_shape)
                if (inner == 1 or m_lt == 1) and ld % 8 == 0 and ld >= m_lt and bs is not None:
                    s.aux_in, s.aux_ld, s.aux_batch_stride = "direct", ld, bs
        if s.aux_in != "direct":
            s.notes.append(f"{name} converted to cuBLASLt's layout ({s.aux_in})")
    if spec.epilog.name in ("DRELU_BGRAD", "DGELU_BGRAD"):
        s.bgrad, s.bgrad_len = spec.outputs[0], m_lt
    elif spec.epilog.name == "BGRADA":
        s.bgrad, s.bgrad_len = "bgrada", m
    elif spec.epilog.name == "BGRADB":
        s.bgrad, s.bgrad_len = "bgradb", n
    return s


def output_layouts(p: MatmulProblem, s: LtSetup) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{name: (shape, dtype)}``: the C-ordered device buffers a plan of ``p`` in setup ``s`` writes, for callers
    that own them (``LtMatmulPlan.execute_into``): the result ``"out"`` (its ``(..., n, m)`` transpose in the
    ``"col"`` orientation), ``relu_aux`` as cuBLASLt's bits ``(..., n_lt, ld / 8)``, ``gelu_aux`` as the
    ``(..., n_lt, ld)`` padded buffer, bias gradients as ``(..., len)`` (one per batch matrix)."""
    batch, dt = tuple(p.batch_shape), p.result_dtype
    out = (*batch, p.m, p.n) if s.orientation == "row" else (*batch, p.n, p.m)
    layouts = {"out": (out, dt)}
    if s.aux_out == "relu":
        layouts["relu_aux"] = ((*batch, s.n_lt, s.aux_ld // 8), "uint8")
    elif s.aux_out == "gelu":
        layouts["gelu_aux"] = ((*batch, s.n_lt, s.aux_ld), dt)
    if s.bgrad:
        layouts[s.bgrad] = ((*batch, s.bgrad_len), dt)
    return layouts


def _bits_orientation(sig, st, p) -> str:
    """Which orientation produced a uint8 relu bit mask, from its shape and strides."""
    shape = sig.shape
    if len(shape) >= 2 and st[-1] == 1 and shape[-2] == p.m and shape[-1] * 8 >= p.n and (shape[-1] * 8) % 128 == 0:
        return "row"
    if len(shape) >= 2 and st[-2] == 1 and shape[-1] == p.n and shape[-2] * 8 >= p.m:
        return "col"
    return "row"


def orientations(p: MatmulProblem) -> tuple[str, ...]:
    """The orientations worth trying for ``p``, best first."""
    name = p.epilog.epilog.name
    if p.bias_axis is not None:
        return ("row",) if p.bias_axis == "n" else ("col",)
    if name in ("DRELU_BGRAD", "DGELU_BGRAD"):
        return ("row",) if p.options.bgrad_axis == "n" else ("col",)
    if name in ("DRELU", "DGELU"):
        sig = p.input_sigs["relu_aux" if name == "DRELU" else "gelu_aux"]
        st = sig.strides if sig.strides is not None else c_strides(sig.shape)
        if sig.dtype == "uint8":
            first = _bits_orientation(sig, st, p)
        else:
            first = "col" if len(st) >= 2 and st[-2] == 1 and st[-1] != 1 else "row"
        return (first, "col" if first == "row" else "row")
    return ("row", "col")
