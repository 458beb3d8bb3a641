"""An FP8 matmul problem in cuBLASLt's terms (pure arithmetic: the CPU test suite checks it).

On Ada and Hopper cuBLASLt's FP8 kernels take only the "TN" form — its A transposed, its B not — which in our
row-major terms means ``a`` row-major (``(..., m, k)``, unit stride along K) and ``b`` column-major (unit stride
along K too, as ``torch._scaled_mm`` wants its second operand), each with a leading dimension that is a multiple
of 16 bytes. Operands that are not so are copied into that layout first (the usual case for ``b``: a C-ordered
``(k, n)`` weight is transposed), and ``explain()`` says so. The kernels also need K a multiple of 16: any other K
is zero-padded (both operands copied into zeroed buffers; zeros add nothing to the products, and the scales and
amax are unchanged). Both orientations of :mod:`.lt_layout` keep these operand layouts: ``"row"``
(``D^T = B^T A^T``: C-ordered result, bias along N, the default) and ``"col"`` (``D = A B``: F-ordered result,
bias along M). Results whose leading dimension would not be 16-byte aligned (e.g. an FP8 result with
``n % 16 != 0``) are written to a padded buffer.

The kernels read 16-byte aligned pointers only — the operands', and (cuBLAS 12.9.1 and newer) the device scales'
too: a scale that is an element of a larger array (``scales[i]``, a per-sample scale under ``torch.func.vmap``)
sits 4 bytes from its neighbour, and cuBLASLt answers ``CUBLAS_STATUS_NOT_SUPPORTED``. Alignment is a property of
each call's pointers, not of the problem: :func:`misaligned` names the pointers a call must copy (a scale or bias
into a fresh buffer; ``a``/``b`` through the layout ``fp8_layout(p, realign=...)`` gives, which copies them as it
copies operands of an unsupported layout).
"""

from __future__ import annotations

from dataclasses import dataclass

from .._fp8 import Fp8Spec
from .._matmul_problem import MatmulProblem
from .._strides import c_strides
from . import lt_layout as L

__all__ = ["FP8_ALIGNMENT", "Fp8Layout", "fp8_layout", "misaligned"]

#: the byte alignment cuBLASLt's FP8 kernels need of every pointer they read (operands, scales)
FP8_ALIGNMENT = 16

_ITEMSIZE = {"float8_e4m3fn": 1, "float8_e5m2": 1, "bfloat16": 2, "float16": 2, "float32": 4, "uint8": 1}


def _align16(n: int, dtype: str) -> int:
    """``n`` elements rounded up to a multiple of 16 bytes."""
    return L.round_up(max(n, 1), max(16 // _ITEMSIZE[dtype], 1))


@dataclass(frozen=True)
class Fp8Layout:
    """``fp8_layout``'s answer: the problem as one FP8 ``cublasLtMatmul`` in ``orientation``."""

    orientation: str
    m_lt: int
    n_lt: int
    #: K as cuBLASLt sees it: the problem's, rounded up to a multiple of 16 (a and b copied, zero-padded)
    k: int
    batch: int
    #: a read in place (row-major, 16-byte leading dimension) or copied into a (…, m, lda) buffer
    a_copy: bool
    lda: int
    a_batch_stride: int
    #: b read in place (column-major) or transposed into a (…, n, ldb) buffer
    b_copy: bool
    ldb: int
    b_batch_stride: int
    #: result storage (…, n_lt, ldd) in cuBLASLt's column-major terms
    ldd: int
    #: "none", "into_d" (c copied into the result buffer, C = D) or "separate" (c copied into its own buffer)
    c_mode: str
    ldc: int
    #: bias copied to a contiguous (…, m_lt) vector (batched bias) or read in place
    bias_batched: bool
    aux: str | None
    aux_ld: int
    aux_dtype: str | None
    notes: tuple[str, ...]


def _direct(p: MatmulProblem, sig, vector: bool, unit: int, lead: int) -> tuple[int, int] | None:
    """(leading dimension, batch stride) when ``sig`` can be read in place with unit stride along axis
    ``unit`` and a leading stride along axis ``lead`` (a multiple of 16, at least K), else None."""
    k = p.k
    st = sig.strides if sig.strides is not None else c_strides(sig.shape)
    if vector:
        return (k, 0) if (st[0] == 1 or k == 1) and k % 16 == 0 else None
    s_unit, s_lead = st[unit], st[lead]
    if (s_unit == 1 or k == 1) and s_lead >= k and s_lead % 16 == 0:
        bs = L.collapse_batch(sig.shape[:-2], st[:-2], p.batch_shape)
        if bs is not None:
            return s_lead, bs
    return None


def _a_direct(p: MatmulProblem) -> tuple[int, int] | None:
    """(lda, batch stride) when ``a`` can be read in place as a row-major (m, k) matrix, else None."""
    return _direct(p, p.a, p.a_vector, -1, -2)


def _b_direct(p: MatmulProblem) -> tuple[int, int] | None:
    """(ldb, batch stride) when ``b`` can be read in place as a column-major (k, n) matrix, else None."""
    return _direct(p, p.b, p.b_vector, -2, -1)


def misaligned(pointers: dict[str, int]) -> tuple[str, ...]:
    """The names in ``pointers`` (name -> device address) whose address is not :data:`FP8_ALIGNMENT`-byte
    aligned, in their order."""
    return tuple(name for name, ptr in pointers.items() if ptr % FP8_ALIGNMENT)


def fp8_layout(p: MatmulProblem, realign: tuple[str, ...] = ()) -> Fp8Layout:
    """FP8 problem ``p`` in cuBLASLt's TN terms: which operand is copied, leading dimensions, result storage.
    ``realign``: the operands (``"a"``, ``"b"``) to copy whatever their layout (a call's pointer to them is not
    16-byte aligned)."""
    q: Fp8Spec = p.quantization
    m, n, k = p.m, p.n, p.k
    batch = L.batch_count(p.batch_shape)
    orientation = "col" if p.bias_axis == "m" else "row"
    m_lt, n_lt = (n, m) if orientation == "row" else (m, n)
    notes = []
    k_lt = L.round_up(k, 16)  # FP8 kernels take K a multiple of 16: zero columns pad it (they add nothing)
    padded = k_lt != k
    if padded:
        notes.append(f"K = {k} zero-padded to {k_lt} (FP8 kernels need K a multiple of 16): a and b are copied")
    a_direct = None if padded or "a" in realign else _a_direct(p)
    b_direct = None if padded or "b" in realign else _b_direct(p)
    for name in ("a", "b"):
        if name in realign and not padded:
            notes.append(f"copy {name}: its pointer is not {FP8_ALIGNMENT}-byte aligned (FP8 kernels need it)")
    a = a_direct
    if a is None:
        lda = L.round_up(k, 16)
        a = (lda, (m * lda if batch > 1 and not p.a_vector else 0))
        notes.append(f"copy a into a row-major buffer (leading dimension {lda}: FP8 kernels need 16-byte rows)")
    b = b_direct
    if b is None:
        ldb = L.round_up(k, 16)
        b = (ldb, (n * ldb if batch > 1 and not p.b_vector else 0))
        notes.append(
            "transpose b into a column-major buffer (cuBLASLt's FP8 kernels on Hopper/Ada take only the TN "
            f"layout: a row-major, b column-major; leading dimension {ldb})"
        )
    ldd = _align16(m_lt, q.result_type)
    if ldd != m_lt:
        notes.append(f"result written with leading dimension {ldd} (16-byte aligned) and returned as a strided view")
    c_mode, ldc = "none", 0
    if p.c is not None:
        if q.c_type == q.result_type:
            c_mode, ldc = "into_d", ldd
        else:
            c_mode, ldc = "separate", _align16(m_lt, q.c_type)
        notes.append(f"c copied into cuBLASLt's {q.c_type} layout first")
    bias_batched = False
    if "bias" in p.input_sigs:
        shape = p.input_sigs["bias"].shape
        bias_batched = len(shape) > 2 and any(d != 1 for d in shape[:-2])
    aux, aux_ld, aux_dtype = None, 0, None
    name = p.epilog.epilog.name
    if name in ("RELU_AUX", "RELU_AUX_BIAS"):
        aux, aux_ld = "relu", L.relu_aux_ld_bits(m_lt)
    elif name in ("GELU_AUX", "GELU_AUX_BIAS"):
        aux, aux_dtype = "gelu", q.result_type
        aux_ld = _align16(m_lt, aux_dtype)
    return Fp8Layout(
        orientation, m_lt, n_lt, k_lt, batch,
        a_direct is None, a[0], a[1],
        b_direct is None, b[0], b[1],
        ldd, c_mode, ldc, bias_batched, aux, aux_ld, aux_dtype, tuple(notes),
    )  # fmt: skip
