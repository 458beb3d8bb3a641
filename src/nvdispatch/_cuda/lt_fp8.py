"""FP8 matmul on cuBLASLt (compute capability 8.9+): one ``cublasLtMatmul`` on FP8 tensor cores, scales,
amax and the epilog fused (semantics in :mod:`nvdispatch._fp8`).

Layout: on Ada and Hopper cuBLASLt's FP8 kernels take only the "TN" form — its A transposed, its B not —
which in our row-major terms means ``a`` row-major (``(..., m, k)``, unit stride along K) and ``b``
column-major (unit stride along K too, as ``torch._scaled_mm`` wants its second operand), each with a leading
dimension that is a multiple of 16 bytes. Operands that are not so are copied into that layout first (the
usual case for ``b``: a C-ordered ``(k, n)`` weight is transposed), and ``explain()`` says so. The kernels
also need K a multiple of 16: any other K is zero-padded (both operands copied into zeroed buffers; zeros add
nothing to the products, and the scales and amax are unchanged). Both orientations
of :mod:`.lt_layout` keep these operand layouts: ``"row"`` (``D^T = B^T A^T``: C-ordered result, bias along N,
the default) and ``"col"`` (``D = A B``: F-ordered result, bias along M).

Scales: Python-number scales of ``a``/``b`` are folded into ``alpha`` and of ``c`` into ``beta`` (exact:
cuBLASLt multiplies them the same way); device scales go to ``A_SCALE_POINTER``/``B_SCALE_POINTER``; the d scale
of an FP8 result is always a device pointer (Python numbers are kept in small device buffers, one per value).
``result_amax`` is ``AMAX_D_POINTER``: max(|t|) before the d scale, a float32 0-d array on the device.

Results whose leading dimension would not be 16-byte aligned (e.g. an FP8 result with ``n % 16 != 0``) are
written to a padded buffer and returned as a strided view of it. CuPy has no FP8 or bfloat16 dtypes: for CuPy
and raw CUDA operands FP8 data travels as ``uint8`` (see ``options.operand_types``) and FP8/bf16 results come
back as ``uint8``/``uint16`` arrays holding the bits.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

import numpy as np

from .._fp8 import Fp8Spec, is_fp8
from .._matmul_problem import MatmulProblem, scalar_value
from . import lt_autotune
from . import lt_layout as L
from .arrays import CudaArray, c_strides, result_kind
from .lt_matmul import DEFAULT_MAX_WORKSPACE, HeuristicMemo, LtPlanCommon, _align, _device_index, max_workspace

__all__ = ["Fp8Layout", "fp8_layout", "decline", "probe", "Fp8LtPlan"]

#: cudaDataType_t of the FP8 formats
FP8_CUDA_DTYPE = {"float8_e4m3fn": 28, "float8_e5m2": 29}
_ITEMSIZE = {"float8_e4m3fn": 1, "float8_e5m2": 1, "bfloat16": 2, "float16": 2, "float32": 4, "uint8": 1}
# cublasLtMatmulDescAttributes_t (cublasLt.h)
DESC_A_SCALE_POINTER = 17
DESC_B_SCALE_POINTER = 18
DESC_C_SCALE_POINTER = 19
DESC_D_SCALE_POINTER = 20
DESC_AMAX_D_POINTER = 21
DESC_EPILOGUE_AUX_DATA_TYPE = 22
DESC_FAST_ACCUM = 25
_COMPUTE_32F, _CUDA_R_32F = 68, 0
#: a non-null pointer set on the descriptor while asking the heuristic (it never dereferences pointers)
_PLACEHOLDER = 1 << 20


def _cuda_type(name: str) -> int:
    from .cublaslt import CUDA_DTYPE

    return FP8_CUDA_DTYPE.get(name) or CUDA_DTYPE[name]


def _align16(n: int, dtype: str) -> int:
    """``n`` elements rounded up to a multiple of 16 bytes."""
    return L.round_up(max(n, 1), max(16 // _ITEMSIZE[dtype], 1))


# -- the problem in cuBLASLt terms (pure arithmetic: tested on the CPU) ------------------------------------
@dataclass(frozen=True)
class Fp8Layout:
    orientation: str
    m_lt: int
    n_lt: int
    k: int
    batch: int
    #: K as cuBLASLt sees it: the problem's, rounded up to a multiple of 16 (a and b copied, zero-padded)
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


def fp8_layout(p: MatmulProblem) -> Fp8Layout:
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
    a = None if padded else _a_direct(p)
    if a is None:
        lda = L.round_up(k, 16)
        a = (lda, (m * lda if batch > 1 and not p.a_vector else 0))
        notes.append(f"copy a into a row-major buffer (leading dimension {lda}: FP8 kernels need 16-byte rows)")
    b = None if padded else _b_direct(p)
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
        padded or _a_direct(p) is None, a[0], a[1],
        padded or _b_direct(p) is None, b[0], b[1],
        ldd, c_mode, ldc, bias_batched, aux, aux_ld, aux_dtype, tuple(notes),
    )  # fmt: skip


# -- descriptors and the heuristic ----------------------------------------------------------------------
class _Fp8Core(HeuristicMemo):
    """Descriptor, layouts and preferences of one FP8 problem (host objects only)."""

    def __init__(self, p: MatmulProblem, s: Fp8Layout, max_workspace: int = DEFAULT_MAX_WORKSPACE):
        from . import cublaslt as lt

        q: Fp8Spec = p.quantization
        self.lt = lt
        self.desc = lt.Desc(_COMPUTE_32F, _CUDA_R_32F)
        self.desc.set_i32(lt.DESC_TRANSA, L.OP_T)
        self.desc.set_i32(lt.DESC_TRANSB, L.OP_N)
        epi = int(p.epilog.epilog)
        if epi != 1:
            self.desc.set_i32(lt.DESC_EPILOGUE, epi)
        if "bias" in p.input_sigs:
            self.desc.set_i32(lt.DESC_BIAS_DATA_TYPE, _cuda_type(q.bias_type))
            if s.bias_batched:
                self.desc.set_i64(lt.DESC_BIAS_BATCH_STRIDE, s.m_lt)
        if s.aux:
            self.desc.set_i64(lt.DESC_EPILOGUE_AUX_LD, s.aux_ld)
            if s.batch > 1:
                self.desc.set_i64(lt.DESC_EPILOGUE_AUX_BATCH_STRIDE, s.aux_ld * s.n_lt)
            if s.aux_dtype is not None and is_fp8(s.aux_dtype):
                self.desc.set_i32(DESC_EPILOGUE_AUX_DATA_TYPE, _cuda_type(s.aux_dtype))
        # the pointers each call sets: placeholders now, so the heuristic sees which features are used
        for name, attr in (("a", DESC_A_SCALE_POINTER), ("b", DESC_B_SCALE_POINTER)):
            if q.scale_kind(name) == "device":
                self.desc.set_ptr(attr, _PLACEHOLDER)
        if q.fp8_result:
            self.desc.set_ptr(DESC_D_SCALE_POINTER, _PLACEHOLDER)
        if q.amax:
            self.desc.set_ptr(DESC_AMAX_D_POINTER, _PLACEHOLDER)
        if q.fast_accum:
            self.desc.set_i8(DESC_FAST_ACCUM, 1)  # an int8_t attribute
        # operands: cuBLASLt's A is (k x m_lt) column-major with op T, its B (k x n_lt) column-major with op N
        if s.orientation == "row":  # A = our b, B = our a
            ta, lda, bsa, tb, ldb, bsb = q.b_type, s.ldb, s.b_batch_stride, q.a_type, s.lda, s.a_batch_stride
        else:
            ta, lda, bsa, tb, ldb, bsb = q.a_type, s.lda, s.a_batch_stride, q.b_type, s.ldb, s.b_batch_stride
        b = s.batch
        self.a = lt.Layout(_cuda_type(ta), s.k, s.m_lt, lda, b, bsa)
        self.b = lt.Layout(_cuda_type(tb), s.k, s.n_lt, ldb, b, bsb)
        self.d = lt.Layout(_cuda_type(q.result_type), s.m_lt, s.n_lt, s.ldd, b, s.ldd * s.n_lt)
        if s.c_mode == "separate" or (s.c_mode == "none" and q.c_type != q.result_type):
            ldc = s.ldc or s.ldd  # without c, C is not read: its layout only names the type cuBLASLt pairs
            self.c = lt.Layout(_cuda_type(q.c_type), s.m_lt, s.n_lt, ldc, b, ldc * s.n_lt)
        else:
            self.c = self.d
        self.max_workspace = max_workspace
        self.prefs: dict[int, object] = {}
        self.algos: dict[tuple[int, int], list] = {}


def decline(p: MatmulProblem) -> str | None:
    """Why the cuda executor cannot run FP8 problem ``p`` on cuBLASLt (None: it can)."""
    from .xp import namespace_for

    if namespace_for(p.framework) is None:
        return "FP8 matmuls need CuPy or Torch installed (for layout copies and results)"
    if 0 in (p.m, p.n, p.k) or 0 in p.batch_shape:
        return "zero-size FP8 matmul: left to the reference path"
    try:
        cc = lt_autotune.compute_capability(_device_index(p))
    except Exception as exc:  # noqa: BLE001 - a device we cannot query cannot run FP8 either
        return f"cannot query the GPU's compute capability ({exc})"
    if cc < (8, 9):
        return f"FP8 tensor cores need compute capability 8.9 or newer (this GPU: {cc[0]}.{cc[1]})"
    ok, why = probe(p)
    return None if ok else why


def probe(p: MatmulProblem) -> tuple[bool, str]:
    """Whether cuBLASLt's heuristic offers an FP8 kernel for ``p``: ``(ok, why_not)`` (memoised in the plan
    cache, like the other cuBLASLt probe)."""
    from .._plan_cache import plan_cache

    return plan_cache.memo(("cublaslt-fp8-probe", p), lambda: _probe(p))


def _probe(p: MatmulProblem) -> tuple[bool, str]:
    from . import cublaslt as lt

    try:
        core = _Fp8Core(p, fp8_layout(p), max_workspace(p))
        algos = core.algorithms(lt.handle(_device_index(p)), 256)
    except lt.CublasLtError as exc:
        return False, f"cuBLASLt rejects this FP8 matmul ({exc})"
    if not algos:
        q, s = p.quantization, fp8_layout(p)
        hint = []
        if p.k % 16:
            hint.append(f"K = {p.k} tried zero-padded to {s.k}")
        if q.fp8_result and s.m_lt % 16:
            hint.append(f"the result's extent along the bias ({s.m_lt}) is not a multiple of 16 (FP8 results)")
        return False, (
            f"cuBLASLt's heuristic has no FP8 kernel for {q.a_type} x {q.b_type} -> {q.result_type} "
            f"with epilogue {p.epilog.epilog.name}" + (f" ({'; '.join(hint)})" if hint else "")
        )
    return True, ""


# -- the plan -------------------------------------------------------------------------------------------
_CUPY_STORAGE = {"float8_e4m3fn": "uint8", "float8_e5m2": "uint8", "bfloat16": "uint16"}


class Fp8LtPlan(LtPlanCommon):
    """A planned FP8 cuBLASLt matmul (strategy ``"native"``)."""

    strategy = "native"

    def __init__(self, p: MatmulProblem, *, tuning=None):
        from . import cublaslt as lt
        from .streams import current_stream_getter, stream_pointer
        from .xp import Xp, namespace_for

        self.problem = p
        self.q: Fp8Spec = p.quantization
        self.device_index = _device_index(p)
        self.framework = p.framework
        self._lt = lt
        self._stream_pointer = stream_pointer
        self._xp = Xp(namespace_for(p.framework))
        self._torch_device = None  # the result's torch.device, made on first use (Torch helper only)
        self.setup = s = fp8_layout(p)
        self.handle = lt.handle(self.device_index)
        self.core = _Fp8Core(p, s, max_workspace(p))
        algos = self.core.algorithms(self.handle, 256)
        if not algos:
            raise lt.CublasLtError("cublasLtMatmulAlgoGetHeuristic (no FP8 algorithm)", 15)
        self._algo = algos[0]
        self._tuned = None
        saved = lt_autotune.saved_choice(self, tuning)
        if saved is not None:
            self._algo = saved
        self._current_stream = current_stream_getter(p.framework, self.device_index)
        self._workspaces: dict[int, object] = {}
        self._d_scales: dict[float, object] = {}
        self._lock = threading.Lock()
        self._last: tuple = ()
        # per-call constants: the scales' kinds, and alpha 1 and beta 0 as cuBLASLt reads them (host memory, alive
        # as long as the plan)
        self._scale_kinds = dict(self.q.scales)
        self._unit_scalars = np.array([1.0, 0.0], dtype=np.float32)
        self.steps = self._describe()

    # -- description ---------------------------------------------------------------------------------
    def _describe(self) -> tuple[str, ...]:
        p, q, s = self.problem, self.q, self.setup
        steps = [f"note: {n}" for n in s.notes]
        scales = []
        for name in ("a", "b"):
            kind = q.scale_kind(name)
            if kind:
                scales.append(f"{name}: " + ("device pointer" if kind == "device" else "folded into alpha"))
        if q.scale_kind("c"):
            scales.append("c: folded into beta")
        if q.fp8_result:
            scales.append("d: device pointer" + (" (from a Python number)" if q.scale_kind("d") != "device" else ""))
        form = "D^T = B^T A^T (row-major result)" if s.orientation == "row" else "D = A B (column-major result)"
        steps.append(
            f"cublasLtMatmul FP8 {q.a_type} x {q.b_type} -> {q.result_type} on tensor cores, {form}, TN layout "
            f"(op(A)=T, op(B)=N), epilogue {p.epilog.epilog.name}"
            + (f" with a {q.bias_type} bias" if "bias" in p.input_sigs else "")
            + f", scales [{', '.join(scales) or 'none'}]"
            + (", amax of the result before the d scale" if q.amax else "")
            + (", fast accumulation" if q.fast_accum else "")
            + f", batch {s.batch}, one launch on the caller's stream"
        )
        return tuple(steps)

    # -- execution ---------------------------------------------------------------------------------
    def release(self) -> None:
        super().release()
        self._d_scales = {}

    def _workspace(self, stream: int, nbytes: int) -> int:
        ws = self._workspaces.get(stream)
        if ws is None or ws.nbytes < nbytes:
            from .._plan_cache import plan_cache
            from .memory import scratch

            if ws is not None:
                ws.release()
            ws = self._workspaces[stream] = scratch(nbytes, self._xp.name, self.device_index, stream)
            plan_cache.resized(self)  # its bytes count towards the cache's bound from now on
        return ws.ptr

    def execute(self, operands, stream=None):
        """Queue the FP8 matmul on ``stream`` (default: the operands' framework's current stream)."""
        if stream is None:  # the current stream: the helper framework allocates on it already
            current = self._current_stream
            return self._execute(operands, current() if current is not None else 0)
        from .streams import framework_stream

        sp = stream if type(stream) is int else self._stream_pointer(stream, self.framework, self.device_index)
        with framework_stream(self._xp.name, sp, self.device_index):
            return self._execute(operands, sp)

    # array helpers in the helper namespace (Torch or CuPy)
    def _as_xp(self, x):
        if self.framework == self._xp.name and not isinstance(x, CudaArray):  # already the helper's array
            return x
        from .lt_matmul import _to_xp

        return _to_xp(x, self.framework, self._xp)

    def _empty(self, shape, dtype: str):
        xp = self._xp
        if xp.name == "torch":
            torch = xp.mod
            dev = self._torch_device
            if dev is None:
                dev = self._torch_device = torch.device("cuda", self.device_index)
            return torch.empty(tuple(shape), dtype=getattr(torch, dtype), device=dev)
        return xp.mod.empty(tuple(shape), dtype=_CUPY_STORAGE.get(dtype, dtype))

    def _buffer(self, shape, dtype: str, zeroed: bool):
        """An operand buffer; ``zeroed`` where K is padded (the padding must read as +0, whose FP8 bits are 0)."""
        if not zeroed:
            return self._empty(shape, dtype)
        xp = self._xp
        if xp.name == "torch":
            torch = xp.mod
            dev = torch.device("cuda", self.device_index)
            return torch.zeros(tuple(shape), dtype=torch.uint8, device=dev).view(getattr(torch, dtype))
        return xp.mod.zeros(tuple(shape), dtype=_CUPY_STORAGE.get(dtype, dtype))

    def _ptr(self, x) -> int:
        return x.data_ptr() if self._xp.name == "torch" else x.data.ptr

    def _device_scalar(self, value: float, keep: list) -> int:
        buf = self._d_scales.get(value)
        if buf is None:
            xp = self._xp
            if xp.name == "torch":
                torch = xp.mod
                buf = torch.full((1,), value, dtype=torch.float32, device=torch.device("cuda", self.device_index))
            else:
                buf = xp.mod.full((1,), value, dtype=np.float32)
            if len(self._d_scales) < 16:  # the plan keeps the buffers of the first 16 values it sees
                # filled once, then read on whichever stream later calls use: wait for the fill
                if xp.name == "torch":
                    xp.mod.cuda.current_stream(self.device_index).synchronize()
                else:
                    xp.mod.cuda.get_current_stream().synchronize()
                self._d_scales[value] = buf
            else:
                keep.append(buf)
        return self._ptr(buf)

    def _execute(self, operands, sp: int):
        p, q, s, xp = self.problem, self.q, self.setup, self._xp
        keep: list = []  # temporaries alive until the launch is queued (their memory is stream-ordered)
        scales = operands.get("quantization_scales") or {}
        a_x, b_x = self._as_xp(operands["a"]), self._as_xp(operands["b"])
        batch = p.batch_shape
        # operands in the TN layout
        if s.a_copy:
            rows = (1,) if p.a_vector else (*batch, p.m)
            buf = self._buffer((*rows, s.lda), "uint8" if "a" in q.storage else q.a_type, s.k != p.k)
            xp.copy_into(buf[..., : p.k], a_x)
            keep.append(buf)
            ptr_a = self._ptr(buf)
        else:
            ptr_a = self._ptr(a_x)
        if s.b_copy:
            rows = (1,) if p.b_vector else (*batch, p.n)
            buf = self._buffer((*rows, s.ldb), "uint8" if "b" in q.storage else q.b_type, s.k != p.k)
            xp.copy_into(buf[..., : p.k], b_x if p.b_vector else xp.swap_last(b_x))
            keep.append(buf)
            ptr_b = self._ptr(buf)
        else:
            ptr_b = self._ptr(b_x)
        # result storage (…, n_lt, ldd) and its (…, m, n) view
        store = self._empty((*batch, s.n_lt, s.ldd), q.result_type)
        ptr_d = self._ptr(store)
        out = self._view(store, s.ldd)
        # c
        alpha = float(scalar_value(operands.get("alpha", 1)))
        kinds = self._scale_kinds
        for name in ("a", "b"):
            if kinds.get(name) == "host":
                alpha *= float(scales[name])
        beta, ptr_c = 0.0, ptr_d
        c = operands.get("c")
        if c is not None:
            b_val = operands.get("beta")
            beta = (1.0 if b_val is None else float(scalar_value(b_val))) * float(scales.get("c", 1.0))
            src = xp.mod.broadcast_to(self._as_xp(c), p.result_shape).reshape(p.promoted_shape)
            if s.c_mode == "into_d":
                xp.copy_into(out, src)
            else:
                cbuf = self._empty((*batch, s.n_lt, s.ldc), q.c_type)
                xp.copy_into(self._view(cbuf, s.ldc), src)
                keep.append(cbuf)
                ptr_c = self._ptr(cbuf)
        elif self.core.c is not self.core.d:
            # no c, and C's type differs from D's (an FP8 result): C is not read (beta = 0), but must not alias D
            # (cuBLASLt answers CUBLAS_STATUS_INVALID_VALUE, measured on the H200): its own buffer, as NVIDIA's sample
            cbuf = self._empty((*batch, s.n_lt, s.ldd), q.c_type)
            keep.append(cbuf)
            ptr_c = self._ptr(cbuf)
        # epilogue pointers
        ptrs = {}
        if "bias" in p.input_sigs:
            bias = self._as_xp(operands["bias"])
            if s.bias_batched:
                bias = xp.contiguous(bias.reshape(*bias.shape[:-2], s.m_lt), (*batch, s.m_lt))
            else:
                bias = bias.reshape(-1)
                if (bias.stride(0) if xp.name == "torch" else bias.strides[0] // bias.itemsize) != 1:
                    bias = xp.contiguous(bias)
            keep.append(bias)
            ptrs[self._lt.DESC_BIAS_POINTER] = self._ptr(bias)
        aux_out = None
        if s.aux == "relu":
            bits = self._empty((*batch, s.n_lt, s.aux_ld // 8), "uint8")
            ptrs[self._lt.DESC_EPILOGUE_AUX_POINTER] = self._ptr(bits)
            aux_out = ("relu_aux", bits if s.orientation == "row" else xp.swap_last(bits))
        elif s.aux == "gelu":
            g = self._empty((*batch, s.n_lt, s.aux_ld), s.aux_dtype)
            ptrs[self._lt.DESC_EPILOGUE_AUX_POINTER] = self._ptr(g)
            aux_out = ("gelu_aux", p.squeeze(self._view(g, s.aux_ld)))
        for name, attr in (("a", DESC_A_SCALE_POINTER), ("b", DESC_B_SCALE_POINTER)):
            if kinds.get(name) == "device":
                sx = self._as_xp(scales[name])
                keep.append(sx)
                ptrs[attr] = self._ptr(sx)
        if q.fp8_result:
            if kinds.get("d") == "device":
                sx = self._as_xp(scales["d"])
                keep.append(sx)
                ptrs[DESC_D_SCALE_POINTER] = self._ptr(sx)
            else:
                ptrs[DESC_D_SCALE_POINTER] = self._device_scalar(float(scales.get("d", 1.0)), keep)
        amax = None
        if q.amax:
            if xp.name == "torch":
                amax = xp.mod.zeros((), dtype=xp.mod.float32, device=xp.mod.device("cuda", self.device_index))
            else:
                amax = xp.mod.zeros((), dtype=np.float32)
            ptrs[DESC_AMAX_D_POINTER] = self._ptr(amax)
        # the algorithm for these pointers' alignment
        algo = self._algo
        mixed = ptr_a | ptr_b | ptr_d | (ptr_c or 0)
        if mixed & 255:
            al = _align(mixed)
            cands = self.core.algorithms(self.handle, al) if al >= 16 else []
            if not cands:
                raise self._lt.CublasLtError(f"no FP8 cuBLASLt algorithm for {al}-byte aligned operands", 15)
            algo = cands[0]
        ws_ptr = self._workspace(sp, algo.workspaceSize) if algo.workspaceSize else 0
        scalars = self._unit_scalars if alpha == 1.0 and beta == 0.0 else np.array([alpha, beta], dtype=np.float32)
        lt, core = self._lt, self.core
        key = tuple(sorted(ptrs.items()))
        with self._lock:
            if key != self._last:
                for attr, ptr in ptrs.items():
                    core.desc.set_ptr(attr, ptr)
                self._last = key
            status = lt.matmul_call()(
                self.handle,
                core.desc.ptr,
                scalars.ctypes.data,
                ptr_a if s.orientation == "col" else ptr_b,
                core.a.ptr,
                ptr_b if s.orientation == "col" else ptr_a,
                core.b.ptr,
                scalars.ctypes.data + 4,
                ptr_c,
                core.c.ptr,
                ptr_d,
                core.d.ptr,
                ctypes.addressof(algo.algo),
                ws_ptr,
                algo.workspaceSize,
                sp,
            )
        if status:
            lt.check(status, "cublasLtMatmul (FP8)")
        del keep
        kind = result_kind(operands["a"], self.framework)
        result = self._wrap(kind, p.squeeze(out))
        aux = {}
        if aux_out is not None:
            aux[aux_out[0]] = self._wrap(kind, aux_out[1])
        if amax is not None:
            aux["result_amax"] = self._wrap(kind, amax)
        return (result, aux) if aux else result

    def _view(self, store, ld: int):
        """The (…, m, n) result view of a (…, n_lt, ld) cuBLASLt column-major buffer."""
        p, s = self.problem, self.setup
        if s.orientation == "row":  # rows of the C-ordered result are the buffer's rows
            return store if ld == p.n else store[..., : p.n]
        return self._xp.swap_last(store if ld == p.m else store[..., : p.m])

    def _wrap(self, kind: str, x):
        from .arrays import as_kind

        return as_kind(kind, x, self._xp.name)
