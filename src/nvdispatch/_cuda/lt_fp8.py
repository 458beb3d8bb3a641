"""FP8 matmul on cuBLASLt (compute capability 8.9+): one ``cublasLtMatmul`` on FP8 tensor cores, scales, amax
and the epilog fused (semantics in :mod:`nvdispatch._fp8`; the operand layout in :mod:`.lt_fp8_layout`). The
plan shares the regular plan's launch sequence (:mod:`.lt_launch`), tuning and timing (:mod:`.lt_plan_base`).

Scales: Python-number scales of ``a``/``b`` are folded into ``alpha`` and of ``c`` into ``beta`` (exact:
cuBLASLt multiplies them the same way); device scales go to ``A_SCALE_POINTER``/``B_SCALE_POINTER``; the d scale
of an FP8 result is always a device pointer (Python numbers are kept in small device buffers, one per value).
``result_amax`` is ``AMAX_D_POINTER``: max(|t|) before the d scale, a float32 0-d array on the device.

Pointers: the FP8 kernels read 16-byte aligned ones only (see :mod:`.lt_fp8_layout`). A call whose device scale or
bias is not (an element of a larger array: ``scales[i]``, a per-sample scale under ``torch.func.vmap``) copies it
into a fresh buffer; one whose ``a`` or ``b`` is not (a view at an odd offset) runs the plan's variant that copies
that operand (made on first need, kept by the plan). A launch cuBLASLt still refuses raises
:class:`~nvdispatch.errors.CublasLtError` saying the problem and each pointer's alignment.

Results whose leading dimension is padded (see :mod:`.lt_fp8_layout`) are returned as a strided view of their
buffer. CuPy has no FP8 or bfloat16 dtypes: for CuPy and raw CUDA operands FP8 data travels as ``uint8`` (see
``options.operand_types``) and FP8/bf16 results come back as ``uint8``/``uint16`` arrays holding the bits.
"""

from __future__ import annotations

import numpy as np

from .._fp8 import Fp8Spec
from .._fp8_types import is_fp8
from .._matmul_problem import MatmulProblem, scalar_value
from .._plan_cache import plan_cache
from . import cublaslt as lt
from . import lt_autotune
from . import lt_layout as L
from .arrays import as_kind, result_kind
from .lt_descriptors import HeuristicMemo, device_index, max_workspace
from .lt_fp8_layout import FP8_ALIGNMENT, Fp8Layout, fp8_layout, misaligned
from .lt_launch import alignment
from .lt_plan_base import LtPlanBase
from .xp import as_xp, namespace_for

__all__ = ["Fp8Descriptors", "decline", "probe", "refused", "Fp8LtPlan"]

#: a non-null pointer set on the descriptor while asking the heuristic (it never dereferences pointers)
_PLACEHOLDER = 1 << 20


_BIAS, _DEFAULT = 4, 1  # cublasLtEpilogue_t; the BIAS bit is set in every epilogue adding a bias


class Fp8Descriptors(HeuristicMemo):
    """Descriptor, layouts and preferences of one FP8 problem (host objects only).

    ``epilogue`` and ``device_scales`` (the operands, of "a" and "b", whose scales are device pointers) describe
    another form of the problem than its own (see :meth:`related`)."""

    def __init__(
        self, p: MatmulProblem, s: Fp8Layout, max_workspace: int, *, epilogue: int | None = None, device_scales=None
    ):
        q: Fp8Spec = p.quantization
        cuda_type = lt.CUDA_DTYPE
        epi = int(p.epilog.epilog) if epilogue is None else epilogue
        if device_scales is None:
            device_scales = {name for name in ("a", "b") if q.scale_kind(name) == "device"}
        self._form = (p, s, epi, frozenset(device_scales))
        self.desc = lt.Desc(lt.COMPUTE_32F, lt.CUDA_R_32F)
        self.desc.set_i32(lt.DESC_TRANSA, L.OP_T)
        self.desc.set_i32(lt.DESC_TRANSB, L.OP_N)
        if epi != _DEFAULT:
            self.desc.set_i32(lt.DESC_EPILOGUE, epi)
        if "bias" in p.input_sigs and epi & _BIAS:
            self.desc.set_i32(lt.DESC_BIAS_DATA_TYPE, cuda_type[q.bias_type])
            if s.bias_batched:
                self.desc.set_i64(lt.DESC_BIAS_BATCH_STRIDE, s.m_lt)
        if s.aux and epi == int(p.epilog.epilog):
            self.desc.set_i64(lt.DESC_EPILOGUE_AUX_LD, s.aux_ld)
            if s.batch > 1:
                self.desc.set_i64(lt.DESC_EPILOGUE_AUX_BATCH_STRIDE, s.aux_ld * s.n_lt)
            if s.aux_dtype is not None and is_fp8(s.aux_dtype):
                self.desc.set_i32(lt.DESC_EPILOGUE_AUX_DATA_TYPE, cuda_type[s.aux_dtype])
        # the pointers each call sets: placeholders now, so the heuristic sees which features are used
        for name, attr in (("a", lt.DESC_A_SCALE_POINTER), ("b", lt.DESC_B_SCALE_POINTER)):
            if name in device_scales:
                self.desc.set_ptr(attr, _PLACEHOLDER)
        if q.fp8_result:
            self.desc.set_ptr(lt.DESC_D_SCALE_POINTER, _PLACEHOLDER)
        if q.amax:
            self.desc.set_ptr(lt.DESC_AMAX_D_POINTER, _PLACEHOLDER)
        if q.fast_accum:
            self.desc.set_i8(lt.DESC_FAST_ACCUM, 1)  # an int8_t attribute
        # operands: cuBLASLt's A is (k x m_lt) column-major with op T, its B (k x n_lt) column-major with op N
        if s.orientation == "row":  # A = our b, B = our a
            ta, lda, bsa, tb, ldb, bsb = q.b_type, s.ldb, s.b_batch_stride, q.a_type, s.lda, s.a_batch_stride
        else:
            ta, lda, bsa, tb, ldb, bsb = q.a_type, s.lda, s.a_batch_stride, q.b_type, s.ldb, s.b_batch_stride
        b = s.batch
        self.a = lt.Layout(cuda_type[ta], s.k, s.m_lt, lda, b, bsa)
        self.b = lt.Layout(cuda_type[tb], s.k, s.n_lt, ldb, b, bsb)
        self.d = lt.Layout(cuda_type[q.result_type], s.m_lt, s.n_lt, s.ldd, b, s.ldd * s.n_lt)
        if s.c_mode == "separate" or (s.c_mode == "none" and q.c_type != q.result_type):
            ldc = s.ldc or s.ldd  # without c, C is not read: its layout only names the type cuBLASLt pairs
            self.c = lt.Layout(cuda_type[q.c_type], s.m_lt, s.n_lt, ldc, b, ldc * s.n_lt)
        else:
            self.c = self.d
        self.max_workspace = max_workspace
        self.prefs: dict[int, object] = {}
        self.algos: dict[tuple[int, int], list] = {}

    def related(self) -> list[tuple[str, HeuristicMemo]]:
        """The problem as ``torch._scaled_mm(bias=...)`` hands it to cuBLASLt — the epilogue's bias alone (no
        activation, no aux output), both scales device pointers — when that is not its own form: the heuristic
        ranks each epilogue's kernels apart, and the kernels it prefers for that form may run this epilogue too
        (``cublasLtMatmulAlgoCheck`` says), so autotune times them as well."""
        p, s, epi, device_scales = self._form
        plain = _BIAS if epi & _BIAS else _DEFAULT
        if plain == epi and device_scales == {"a", "b"}:
            return []
        form = Fp8Descriptors(p, s, self.max_workspace, epilogue=plain, device_scales={"a", "b"})
        return [(f"{'bias' if plain == _BIAS else 'plain'} form with device scales", form)]


def decline(p: MatmulProblem) -> str | None:
    """Why the cuda executor cannot run FP8 problem ``p`` on cuBLASLt (None: it can)."""
    if namespace_for(p.framework) is None:
        return "FP8 matmuls need CuPy or Torch installed (for layout copies and results)"
    if 0 in (p.m, p.n, p.k) or 0 in p.batch_shape:
        return "zero-size FP8 matmul: left to the reference path"
    try:
        cc = lt_autotune.compute_capability(device_index(p))
    except Exception as exc:  # noqa: BLE001 - a device we cannot query cannot run FP8 either
        return f"cannot query the GPU's compute capability ({exc})"
    if cc < (8, 9):
        return f"FP8 tensor cores need compute capability 8.9 or newer (this GPU: {cc[0]}.{cc[1]})"
    ok, why = probe(p)
    return None if ok else why


def probe(p: MatmulProblem) -> tuple[bool, str]:
    """Whether cuBLASLt's heuristic offers an FP8 kernel for ``p``: ``(ok, why_not)`` (memoised in the plan
    cache, like the other cuBLASLt probe)."""
    return plan_cache.memo(("cublaslt-fp8-probe", p), lambda: _probe(p))


def _probe(p: MatmulProblem) -> tuple[bool, str]:
    try:
        core = Fp8Descriptors(p, fp8_layout(p), max_workspace(p))
        algos = core.algorithms(lt.handle(device_index(p)), 256)
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


_POINTER_NAMES = {
    lt.DESC_A_SCALE_POINTER: "scale_a",
    lt.DESC_B_SCALE_POINTER: "scale_b",
    lt.DESC_D_SCALE_POINTER: "scale_d",
    lt.DESC_AMAX_D_POINTER: "result_amax",
    lt.DESC_BIAS_POINTER: "bias",
    lt.DESC_EPILOGUE_AUX_POINTER: "aux",
}


def refused(exc: lt.CublasLtError, q: Fp8Spec, s: Fp8Layout, pointers: dict[str, int]) -> lt.CublasLtError:
    """``exc`` (a launch cuBLASLt refused) saying what was launched: the FP8 problem, its TN layout and each
    pointer's alignment, against the FP8 kernels' requirements."""
    aligned = ", ".join(f"{name} {alignment(ptr)}" for name, ptr in pointers.items())
    hint = (
        f"{q.describe()}; TN layout, K {s.k}, lda {s.lda}, ldb {s.ldb}, ldd {s.ldd}, batch {s.batch}; pointer "
        f"alignments (bytes): {aligned}. FP8 kernels need every pointer {FP8_ALIGNMENT}-byte aligned, leading "
        "dimensions multiples of 16 bytes and K a multiple of 16"
    )
    return lt.CublasLtError(exc.call, exc.status, hint=hint)


class Fp8LtPlan(LtPlanBase):
    """A planned FP8 cuBLASLt matmul (strategy ``"native"``)."""

    strategy = "native"

    def __init__(self, p: MatmulProblem, *, tuning=None, realign: tuple[str, ...] = ()):
        self._start(p, "native")
        self.q: Fp8Spec = p.quantization
        self.setup = s = fp8_layout(p, realign)
        self.realign = realign
        #: realign -> the plan's variant copying those operands (calls whose pointers to them are misaligned)
        self._variants: dict[tuple[str, ...], Fp8LtPlan] = {}
        # cuBLASLt's A (op T) is our a in the col orientation (D = A B), our b in the row one (D^T = B^T A^T)
        self._plan_launch(
            Fp8Descriptors(p, s, max_workspace(p)),
            a_first=s.orientation == "col",
            tuning=tuning,
            kind="FP8",
            min_alignment=16,  # FP8 kernels read 16-byte aligned operands only
        )
        self._d_scales: dict[float, object] = {}
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
        variants, self._variants = self._variants, {}
        for v in variants.values():
            v.release()

    def _realigned(self, names: tuple[str, ...]) -> Fp8LtPlan:
        """The variant of this plan that copies operands ``names`` (and those this plan copies for alignment)
        into aligned buffers (made once)."""
        variant = self._variants.get(names)
        if variant is None:
            realign = tuple(n for n in ("a", "b") if n in names or n in self.realign)
            variant = self._variants[names] = Fp8LtPlan(self.problem, realign=realign)
        return variant

    def _aligned_pointer(self, x, keep: list) -> int:
        """The pointer of device scale or bias ``x`` (a helper-namespace array), copied into a fresh buffer
        (16-byte aligned, as allocators give) where it is not :data:`FP8_ALIGNMENT`-byte aligned."""
        xp = self._xp
        keep.append(x)
        ptr = xp.data_ptr(x)
        if ptr % FP8_ALIGNMENT:
            x = xp.contiguous(x, tuple(x.shape))  # always a new array
            keep.append(x)
            ptr = xp.data_ptr(x)
        return ptr

    def _device_scalar(self, value: float, keep: list) -> int:
        """The pointer of a float32 device buffer holding ``value`` (the first 16 values' buffers kept)."""
        xp = self._xp
        buf = self._d_scales.get(value)
        if buf is None:
            buf = xp.full((1,), value, "float32", self.device_index)
            if len(self._d_scales) < 16:  # the plan keeps the buffers of the first 16 values it sees
                # filled once, then read on whichever stream later calls use: wait for the fill
                xp.synchronize(self.device_index)
                self._d_scales[value] = buf
            else:
                keep.append(buf)
        return xp.data_ptr(buf)

    def _execute(self, operands, sp: int):
        p, q, s, xp = self.problem, self.q, self.setup, self._xp
        fw, helper, dev = self.framework, xp.name, self.device_index
        keep: list = []  # temporaries alive until the launch is queued (their memory is stream-ordered)
        scales = operands.get("quantization_scales") or {}
        a_x, b_x = as_xp(operands["a"], fw, helper), as_xp(operands["b"], fw, helper)
        read = {}  # the operands read in place: their pointers must be aligned
        if not s.a_copy:
            read["a"] = xp.data_ptr(a_x)
        if not s.b_copy:
            read["b"] = xp.data_ptr(b_x)
        realign = misaligned(read)
        if realign:
            return self._realigned(realign)._execute(operands, sp)
        batch = p.batch_shape
        padded = s.k != p.k  # K zero-padded: the copies' padding must read as +0, whose FP8 bits are 0
        # operands in the TN layout
        if s.a_copy:
            rows = (1,) if p.a_vector else (*batch, p.m)
            shape, dtype = (*rows, s.lda), "uint8" if "a" in q.storage else q.a_type
            buf = xp.zeros(shape, dtype, dev) if padded else xp.empty(shape, dtype, dev)
            xp.copy_into(buf[..., : p.k], a_x)
            keep.append(buf)
            ptr_a = xp.data_ptr(buf)
        else:
            ptr_a = read["a"]
        if s.b_copy:
            rows = (1,) if p.b_vector else (*batch, p.n)
            shape, dtype = (*rows, s.ldb), "uint8" if "b" in q.storage else q.b_type
            buf = xp.zeros(shape, dtype, dev) if padded else xp.empty(shape, dtype, dev)
            xp.copy_into(buf[..., : p.k], b_x if p.b_vector else xp.swap_last(b_x))
            keep.append(buf)
            ptr_b = xp.data_ptr(buf)
        else:
            ptr_b = read["b"]
        # result storage (…, n_lt, ldd) and its (…, m, n) view
        store = xp.empty((*batch, s.n_lt, s.ldd), q.result_type, dev)
        ptr_d = xp.data_ptr(store)
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
            src = xp.mod.broadcast_to(as_xp(c, fw, helper), p.result_shape).reshape(p.promoted_shape)
            if s.c_mode == "into_d":
                xp.copy_into(out, src)
            else:
                cbuf = xp.empty((*batch, s.n_lt, s.ldc), q.c_type, dev)
                xp.copy_into(self._view(cbuf, s.ldc), src)
                keep.append(cbuf)
                ptr_c = xp.data_ptr(cbuf)
        elif self.core.c is not self.core.d:
            # no c, and C's type differs from D's (an FP8 result): C is not read (beta = 0), but must not alias D
            # (cuBLASLt answers CUBLAS_STATUS_INVALID_VALUE): its own buffer, as NVIDIA's FP8 sample passes
            cbuf = xp.empty((*batch, s.n_lt, s.ldd), q.c_type, dev)
            keep.append(cbuf)
            ptr_c = xp.data_ptr(cbuf)
        # epilogue pointers
        ptrs = {}
        if "bias" in p.input_sigs:
            bias = as_xp(operands["bias"], fw, helper)
            if s.bias_batched:
                bias = xp.contiguous(bias.reshape(*bias.shape[:-2], s.m_lt), (*batch, s.m_lt))
            else:
                bias = xp.contiguous(bias.reshape(-1))  # itself where it is contiguous already
            ptrs[lt.DESC_BIAS_POINTER] = self._aligned_pointer(bias, keep)
        aux_out = None
        if s.aux == "relu":
            bits = xp.empty((*batch, s.n_lt, s.aux_ld // 8), "uint8", dev)
            ptrs[lt.DESC_EPILOGUE_AUX_POINTER] = xp.data_ptr(bits)
            aux_out = ("relu_aux", bits if s.orientation == "row" else xp.swap_last(bits))
        elif s.aux == "gelu":
            g = xp.empty((*batch, s.n_lt, s.aux_ld), s.aux_dtype, dev)
            ptrs[lt.DESC_EPILOGUE_AUX_POINTER] = xp.data_ptr(g)
            aux_out = ("gelu_aux", p.squeeze(self._view(g, s.aux_ld)))
        for name, attr in (("a", lt.DESC_A_SCALE_POINTER), ("b", lt.DESC_B_SCALE_POINTER)):
            if kinds.get(name) == "device":
                ptrs[attr] = self._aligned_pointer(as_xp(scales[name], fw, helper), keep)
        if q.fp8_result:
            if kinds.get("d") == "device":
                ptrs[lt.DESC_D_SCALE_POINTER] = self._aligned_pointer(as_xp(scales["d"], fw, helper), keep)
            else:
                ptrs[lt.DESC_D_SCALE_POINTER] = self._device_scalar(float(scales.get("d", 1.0)), keep)
        amax = None
        if q.amax:
            amax = xp.zeros((), "float32", dev)
            ptrs[lt.DESC_AMAX_D_POINTER] = xp.data_ptr(amax)
        scalars = self._unit_scalars if alpha == 1.0 and beta == 0.0 else np.array([alpha, beta], dtype=np.float32)
        alpha_ptr = scalars.ctypes.data
        pointers = tuple(ptrs.items())
        try:
            self.launch(ptr_a, ptr_b, ptr_c, ptr_d, alpha_ptr, alpha_ptr + 4, sp, pointers, helper)
        except lt.CublasLtError as exc:
            named = {"a": ptr_a, "b": ptr_b, "c": ptr_c, "d": ptr_d}
            named.update((_POINTER_NAMES.get(attr, str(attr)), ptr) for attr, ptr in pointers)
            raise refused(exc, q, s, named) from exc
        del keep
        kind = result_kind(operands["a"], fw)
        result = as_kind(kind, p.squeeze(out), helper)
        aux = {}
        if aux_out is not None:
            aux[aux_out[0]] = as_kind(kind, aux_out[1], helper)
        if amax is not None:
            aux["result_amax"] = as_kind(kind, amax, helper)
        return (result, aux) if aux else result

    def _view(self, store, ld: int):
        """The (…, m, n) result view of a (…, n_lt, ld) cuBLASLt column-major buffer."""
        p, s = self.problem, self.setup
        if s.orientation == "row":  # rows of the C-ordered result are the buffer's rows
            return store if ld == p.n else store[..., : p.n]
        return self._xp.swap_last(store if ld == p.m else store[..., : p.m])
