"""The cuBLASLt matmul plan shared by the ``cuda`` and ``cupy`` executors.

:func:`setup` turns a :class:`~nvdispatch._matmul_problem.MatmulProblem` into cuBLASLt terms for one
orientation (see :mod:`.lt_layout`): operand layouts (with the copies needed where strides cannot be
described), the epilogue, bias/aux/bias-gradient pointers' layouts. :func:`probe` asks cuBLASLt's heuristic
which orientation it can run fused (cached per problem) and :class:`LtMatmulPlan` holds descriptors,
preference, chosen algorithm and per-stream workspaces; a cached ``execute`` is one ``cublasLtMatmul``
launch on the caller's stream, with no host synchronisation.

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

import ctypes
import threading
from dataclasses import dataclass, field

import numpy as np

from .._matmul_problem import MatmulProblem, scalar_value
from . import lt_autotune
from . import lt_layout as L
from .arrays import c_strides, empty, make_view, result_kind, storage_shape

__all__ = ["LtSetup", "setup", "probe", "LtMatmulPlan", "lt_types", "DEFAULT_MAX_WORKSPACE"]

#: workspace cuBLASLt may use (the figure NVIDIA recommends for Hopper); ``preferences.max_workspace_bytes``
#: replaces it
DEFAULT_MAX_WORKSPACE = 32 << 20

_REAL_FLOAT = {"float16", "bfloat16", "float32", "float64"}
LT_DTYPES = _REAL_FLOAT | {"complex64", "complex128"}

# cublasComputeType_t
_COMPUTE = {"float16": 68, "bfloat16": 68, "float32": 68, "float64": 70, "complex64": 68, "complex128": 70}
_COMPUTE_SCALE = {64: "float16", 65: "float16", 70: "float64", 71: "float64"}


def lt_types(problem: MatmulProblem) -> tuple[int, int, str]:
    """(compute type, scale cudaDataType, scale dtype name) of ``problem``."""
    from .cublaslt import CUDA_DTYPE

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


# -- the problem in cuBLASLt terms --------------------------------------------------------------------------
@dataclass
class Operand:
    """One cuBLASLt input operand: our ``source`` operand ("a"/"b"), maybe copied to C order first."""

    source: str
    copy: bool
    op: int
    rows: int
    cols: int
    ld: int
    batch_stride: int


@dataclass
class LtSetup:
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
    if lay is None or bs is None or sig.dtype != p.result_dtype:
        copy = True  # a C-ordered copy broadcast to the full batch
        sr, sc = c, 1
        bs = r * c if p.batch_shape else 0
        lay = L.matrix_layout(c, r, sc, sr) if transpose else L.matrix_layout(r, c, sr, sc)
    op, mr, mc, ld = lay
    return Operand(source, copy, op, mr if op == L.OP_N else mc, mc if op == L.OP_N else mr, ld, bs)


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
        if o.op == L.OP_T:
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
        rs = p.promoted_shape
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
            del rs
        if s.aux_in != "direct":
            s.notes.append(f"{name} converted to cuBLASLt's layout ({s.aux_in})")
    if spec.epilog.name in ("DRELU_BGRAD", "DGELU_BGRAD"):
        s.bgrad, s.bgrad_len = spec.outputs[0], m_lt
    elif spec.epilog.name == "BGRADA":
        s.bgrad, s.bgrad_len = "bgrada", m
    elif spec.epilog.name == "BGRADB":
        s.bgrad, s.bgrad_len = "bgradb", n
    return s


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


# -- descriptors and the heuristic --------------------------------------------------------------------------
class HeuristicMemo:
    """``algorithms``: cuBLASLt's heuristic answers for the descriptor and layouts a subclass sets up (``lt``,
    ``desc``, ``a``, ``b``, ``c``, ``d``, ``max_workspace``, and empty ``prefs``/``algos`` dicts), memoised
    per (alignment, count). Shared by :class:`_Core` and the FP8 core (:mod:`.lt_fp8`)."""

    def algorithms(self, handle: int, alignment: int, count: int = 1) -> list:
        key = (alignment, count)
        got = self.algos.get(key)
        if got is None:
            pref = self.prefs.get(alignment)
            if pref is None:
                pref = self.prefs[alignment] = self.lt.Preference(self.max_workspace, alignment)
            got = self.algos[key] = self.lt.heuristic(handle, self.desc, self.a, self.b, self.c, self.d, pref, count)
        return got


class _Core(HeuristicMemo):
    """Descriptors, layouts and preference of one setup (host objects only)."""

    def __init__(self, p: MatmulProblem, s: LtSetup, max_workspace: int, alignment: int = 256):
        from . import cublaslt as lt

        self.lt = lt
        dt = lt.CUDA_DTYPE[p.result_dtype]
        compute, scale, _ = lt_types(p)
        self.desc = lt.Desc(compute, scale)
        self.desc.set_i32(lt.DESC_TRANSA, s.lt_a.op)
        self.desc.set_i32(lt.DESC_TRANSB, s.lt_b.op)
        if s.epilogue != 1:
            self.desc.set_i32(lt.DESC_EPILOGUE, s.epilogue)
        bias = p.input_sigs.get("bias")
        if bias is not None and s.epilogue & 4 and bias.dtype != p.result_dtype and not s.bias_cast:
            self.desc.set_i32(lt.DESC_BIAS_DATA_TYPE, lt.CUDA_DTYPE[bias.dtype])
        if (bias is not None and s.epilogue & 4 and s.bias_batch_stride) or (s.bgrad and s.batch > 1):
            stride = s.bias_batch_stride if bias is not None else s.bgrad_len
            self.desc.set_i64(lt.DESC_BIAS_BATCH_STRIDE, stride)
        if s.aux_out or s.aux_in:
            self.desc.set_i64(lt.DESC_EPILOGUE_AUX_LD, s.aux_ld)
            if s.batch > 1:
                self.desc.set_i64(lt.DESC_EPILOGUE_AUX_BATCH_STRIDE, s.aux_batch_stride)
        b = s.batch
        self.a = lt.Layout(dt, s.lt_a.rows, s.lt_a.cols, s.lt_a.ld, b, s.lt_a.batch_stride)
        self.b = lt.Layout(dt, s.lt_b.rows, s.lt_b.cols, s.lt_b.ld, b, s.lt_b.batch_stride)
        self.d = lt.Layout(dt, s.m_lt, s.n_lt, max(s.m_lt, 1), b, s.m_lt * s.n_lt)
        if s.c_mode == "direct":
            self.c = lt.Layout(dt, s.m_lt, s.n_lt, s.c_ld, b, s.c_batch_stride)
        else:
            self.c = self.d
        self.max_workspace = max_workspace
        self.prefs: dict[int, object] = {}
        self.algos: dict[int, list] = {}


def max_workspace(p: MatmulProblem) -> int:
    """The workspace cap of ``p``'s plans: ``preferences.max_workspace_bytes``, else :data:`DEFAULT_MAX_WORKSPACE`."""
    cap = p.plan_preferences.max_workspace_bytes
    return DEFAULT_MAX_WORKSPACE if cap is None else cap


def _device_index(p: MatmulProblem) -> int:
    if p.device.index is not None:
        return p.device.index
    from . import runtime

    return runtime.current_device()


def probe(p: MatmulProblem) -> tuple[str | None, bool, str]:
    """Whether cuBLASLt fuses ``p`` natively: ``(orientation, bias_cast, why_not)`` (orientation None: no).

    Memoised in the shared plan cache (bounded with it, dropped by ``plan_cache.clear()``)."""
    from .._plan_cache import plan_cache

    return plan_cache.memo(("cublaslt-probe", p), lambda: _probe(p))


def _probe(p: MatmulProblem) -> tuple[str | None, bool, str]:
    from . import cublaslt as lt

    if p.result_dtype not in LT_DTYPES:
        return None, False, f"cuBLASLt has no {p.result_dtype} matmul"
    handle = lt.handle(_device_index(p))
    bias = p.input_sigs.get("bias")
    casts = (False, True) if bias is not None and bias.dtype != p.result_dtype else (False,)
    tried = []
    for orientation in orientations(p):
        for cast in casts:
            try:
                core = _Core(p, setup(p, orientation, cast), max_workspace(p))
                if core.algorithms(handle, 256):
                    return orientation, cast, ""
            except lt.CublasLtError as exc:
                tried.append(f"{orientation}: {exc}")
                continue
            tried.append(f"{orientation}{' (bias cast)' if cast else ''}: no algorithm")
    return None, False, f"cuBLASLt has no fused {p.epilog.epilog.name} kernel for this case ({'; '.join(tried)})"


# -- the plan -------------------------------------------------------------------------------------------
def _ptr_getter(framework: str):
    from .._adapters import adapter_named

    ad = adapter_named(framework)
    if ad is not None:
        return ad.data_ptr
    from .arrays import view

    return lambda x: view(x, framework).ptr


def _align(ptr: int) -> int:
    return 256 if ptr % 256 == 0 else (ptr & -ptr) or 256


class LtPlanCommon:
    """What the cuBLASLt plans (:class:`LtMatmulPlan`, the FP8 plan of :mod:`.lt_fp8`) share: tuning,
    autotune, time, workspace_bytes, release. The plan has ``_tuned``, ``_algo``, ``_workspaces`` (stream ->
    workspace), ``problem``, ``framework``, ``device_index``, ``_stream_pointer`` and
    ``execute(operands, stream_pointer)``."""

    tuning_kind = lt_autotune.TUNING_KIND
    validate_tuning = staticmethod(lt_autotune.validate_choice)

    def tuning(self):
        """The autotuned (or loaded) algorithm choice in use, None while the heuristic's first answer runs."""
        return self._tuned

    def autotune(self, operands, iterations: int = 3, stream=None):
        """Time the heuristic's candidates, smaller-workspace and split-K variants (see :mod:`.lt_autotune`)
        with CUDA events on ``stream``; keep and record the fastest. Returns ``[(label, seconds)]``."""
        sp = self._stream_pointer(stream, self.framework, self.device_index)

        def launch(result):
            self._algo = result
            self.execute(operands, sp)

        return lt_autotune.autotune(self, launch, sp, iterations, self.problem.plan_preferences.limit)

    def time(self, operands, iterations: int = 3, stream=None) -> float:
        sp = self._stream_pointer(stream, self.framework, self.device_index)
        return lt_autotune.gpu_seconds(lambda: self.execute(operands, sp), sp, self.device_index, iterations)

    @property
    def workspace_bytes(self) -> int:
        """Bytes of the workspaces this plan holds (one per stream it ran on), and at least what its algorithm
        needs before the first run allocates it (so the plan cache bounds it from insertion on)."""
        held = sum(int(w.nbytes) for w in list(self._workspaces.values()))
        return max(held, int(getattr(self._algo, "workspaceSize", 0) or 0))

    def release(self) -> None:
        """Give workspaces back in stream order (safe while launches using them are queued)."""
        ws, self._workspaces = self._workspaces, {}
        for w in ws.values():
            w.release()


class LtMatmulPlan(LtPlanCommon):
    """A planned cuBLASLt matmul (strategy ``"native"``; with ``fused=False`` the unfused matmul that the
    ``"inplace"`` fallback runs before its elementwise epilog)."""

    def __init__(self, p: MatmulProblem, *, fused: bool = True, tuning=None, orientation=None, bias_cast=False):
        from . import cublaslt as lt
        from .streams import current_stream_getter, stream_pointer
        from .xp import namespace_for

        self._planned = False  # set once planned: from then a new algorithm (autotune) makes a new direct call
        self.problem = p
        self.strategy = "native" if fused else "inplace"
        self.device_index = _device_index(p)
        self._lt = lt
        self._stream_pointer = stream_pointer
        if orientation is None:
            orientation, bias_cast, _ = probe(p) if fused else ("row", False, "")
            orientation = orientation or "row"
        self.setup = s = setup(p, orientation, bias_cast, None if fused else 1)
        self.handle = lt.handle(self.device_index)
        self.core = _Core(p, s, max_workspace(p))
        algos = self.core.algorithms(self.handle, 256)
        if not algos:
            raise lt.CublasLtError("cublasLtMatmulAlgoGetHeuristic (no algorithm)", 15)
        self._algo = algos[0]
        self._tuned = None  # the recorded autotune choice in use (see lt_autotune)
        saved = lt_autotune.saved_choice(self, tuning)
        if saved is not None:
            self._algo = saved
        self.framework = p.framework
        self._get_ptr = _ptr_getter(p.framework)
        xp_name = namespace_for(p.framework)
        self._xp = None
        if xp_name is not None:
            from .xp import Xp

            self._xp = Xp(xp_name)
        self._needs_xp = (
            s.lt_a.copy
            or s.lt_b.copy
            or s.c_mode == "copy"
            or s.bias_copy
            or s.bias_cast
            or s.aux_in not in (None, "direct")
        )
        if self._needs_xp and self._xp is None:
            from ..errors import ExecutorUnavailableError

            raise ExecutorUnavailableError(
                "operands", "CuPy or Torch to copy operands into cuBLASLt's layout", "neither installed"
            )
        compute, _, scale = lt_types(p)
        self._scale_dtype = np.dtype(scale)
        self._scalars: dict = {}
        self._workspaces: dict[int, object] = {}
        self._lock = threading.Lock()
        self._last = (None, None)  # (bias/bgrad ptr, aux ptr) set on the descriptor
        # per-call constants
        self._current_stream = current_stream_getter(p.framework, self.device_index)
        self._inputs = p.input_sigs
        self._direct_operands = not s.lt_a.copy and not s.lt_b.copy
        self._a_first = s.lt_a.source == "a"  # cuBLASLt's A is operand a (else b: the row orientation)
        self._order = "F" if (s.orientation == "col" and not p.a_vector and not p.b_vector) else "C"
        self._one, self._zero = self._scalar_buffer(1, []), self._scalar_buffer(0, [])
        self._torch_result = None  # (storage shape, dtype, transpose?) of Torch results, made like operand a
        if p.framework == "torch":
            import torch

            shape = tuple(int(d) for d in p.result_shape)
            storage = storage_shape(shape, self._order)
            self._torch_result = (storage, getattr(torch, p.result_dtype), storage is not shape)
        self.steps = self._describe()
        self.direct = self._direct_call()
        self._planned = True

    @property
    def _algo(self):
        """The ``cublasLtMatmul`` algorithm launches use (the heuristic's first, a saved or an autotuned one)."""
        return self._algorithm

    @_algo.setter
    def _algo(self, algo) -> None:
        self._algorithm = algo
        if self._planned:  # the compiled direct call holds the algorithm it launches: make it anew
            self.direct = self._direct_call()

    def _direct_call(self):
        """The Plan protocol's direct call for the commonest form, ``direct(a, b[, bias])`` (alpha 1, no c,
        the current stream): operands read in place, at most a bias, no aux input or output; else None.
        Compiled where it can be (:meth:`_compiled_direct`), else :meth:`_python_direct`."""
        s, p = self.setup, self.problem
        names = tuple(self._inputs)
        if (
            self._needs_xp
            or not self._direct_operands
            or s.c_mode != "none"
            or s.bgrad
            or s.aux_out
            or s.aux_in
            or p.epilog.outputs
            or names not in ((), ("bias",))
            or (names and self.strategy != "native")
        ):
            return None
        return self._compiled_direct() or self._python_direct

    def _python_direct(self, a, b, bias=None):
        """The direct call in Python (every alignment, every framework, an algorithm with a workspace)."""
        get, current = self._get_ptr, self._current_stream
        sp = current() if current is not None else 0
        out, ptr_d, kind = self._result(a, sp)
        ptr_a, ptr_b = (get(a), get(b)) if self._a_first else (get(b), get(a))
        bias_ptr = None if bias is None else get(bias)
        self._launch(ptr_a, ptr_b, ptr_d, ptr_d, bias_ptr, None, self._one, self._zero, sp, kind)
        return out

    def _compiled_direct(self):
        """The direct call compiled (``_hotpath_lt.c``), for Torch tensors whose result is allocated as they are
        (not transposed) and an algorithm without a workspace; None elsewhere or where the extension is not
        built. It launches on a descriptor of its own (it sets the bias pointer there, under its own lock) and
        hands calls whose pointers are not 256-byte aligned to :meth:`_python_direct`."""
        from .._compiled import hotpath

        compiled = hotpath()
        tr = self._torch_result
        if compiled is None or tr is None or tr[2] or self._algo.workspaceSize:
            return None
        import weakref

        lt, p, s = self._lt, self.problem, self.setup
        core = _Core(p, s, self.core.max_workspace)
        algo = self._algo
        ints = (
            lt.address("cublasLtMatmul"),
            lt.address("cublasLtMatmulDescSetAttribute"),
            self.handle,
            core.desc.ptr,
            core.a.ptr,
            core.b.ptr,
            core.c.ptr,
            core.d.ptr,
            ctypes.addressof(algo.algo),
            self._one,
            self._zero,
            int(self._a_first),
            lt.DESC_BIAS_POINTER if "bias" in self._inputs else -1,
        )
        keep = (core, algo, tuple(self._scalars.values()))  # alive as long as the direct call is
        storage, dtype, _ = tr
        return compiled.make_lt_direct(
            ints, keep, (storage,), {"dtype": dtype}, self._current_stream, lt.check,
            weakref.WeakMethod(self._python_direct),
        )

    # -- description ---------------------------------------------------------------------------------
    def _describe(self) -> tuple[str, ...]:
        s, p = self.setup, self.problem
        ops = "NT"
        form = (
            "D^T = B^T A^T (row-major result, bias along N native)"
            if s.orientation == "row"
            else ("D = A B (column-major result, bias along M native)")
        )
        steps = []
        for o in (s.lt_a, s.lt_b):
            if o.copy:
                steps.append(f"copy {o.source} to a C-ordered {p.result_dtype} array (its strides/dtype need it)")
        steps += [f"note: {n}" for n in s.notes]
        epi = p.epilog.epilog.name if self.strategy == "native" else "DEFAULT"
        steps.append(
            f"cublasLtMatmul {form}, op(A)={ops[s.lt_a.op]} op(B)={ops[s.lt_b.op]}, epilogue {epi}"
            + (
                f" (cuBLASLt {_lt_epi_name(s.epilogue)})"
                if self.strategy == "native" and s.epilogue != int(p.epilog.epilog)
                else ""
            )
            + f", batch {s.batch}, compute type {lt_types(p)[0]}, one launch on the caller's stream"
        )
        return tuple(steps)

    # -- execution ---------------------------------------------------------------------------------
    def _scalar(self, value, keep: list):
        """Host pointer to ``value`` in the scale type; a buffer not kept by the plan is kept in ``keep``."""
        if value.__class__ is int and (value == 1 or value == 0):
            return self._one if value else self._zero
        return self._scalar_buffer(value, keep)

    def _scalar_buffer(self, value, keep: list) -> int:
        value = scalar_value(value)
        buf = self._scalars.get(value)
        if buf is None:
            arr = np.array([value], dtype=self._scale_dtype)
            buf = (arr, arr.ctypes.data)
            if len(self._scalars) < 16:  # the plan keeps buffers of the first 16 values it sees
                self._scalars[value] = buf
            else:
                keep.append(arr)  # cuBLASLt reads host scalars during the call: alive until it returns
        return buf[1]

    def _workspace(self, stream: int, nbytes: int, kind_fw: str) -> int:
        ws = self._workspaces.get(stream)
        if ws is None or ws.nbytes < nbytes:
            from .._plan_cache import plan_cache
            from .memory import scratch

            fw = kind_fw  # Torch/CuPy results: their allocator; other kinds: cudaMallocAsync (memory.scratch)
            if ws is not None:
                ws.release()
            ws = self._workspaces[stream] = scratch(nbytes, fw, self.device_index, stream)
            plan_cache.resized(self)  # its bytes count towards the cache's bound from now on
        return ws.ptr

    def execute(self, operands, stream=None):
        """Queue the matmul on ``stream`` (default: the operands' framework's current stream)."""
        if stream is None:
            current = self._current_stream
            return self._execute(operands, current() if current is not None else 0)
        from .streams import framework_stream

        sp = stream if type(stream) is int else self._stream_pointer(stream, self.framework, self.device_index)
        fw = self._xp.name if self._xp is not None else ""  # the framework's own, or the one viewing its arrays
        with framework_stream(fw, sp, self.device_index):
            return self._execute(operands, sp)

    def _execute(self, operands, sp: int):
        p, s = self.problem, self.setup
        a, b = operands["a"], operands["b"]
        keep = []  # temporaries alive until the launch is queued (their memory is stream-ordered)
        xp = self._xp
        if self._needs_xp:
            xa = lambda x: _to_xp(x, self.framework, xp)  # noqa: E731
        # operands
        if self._direct_operands:  # cuBLASLt reads a and b in place (lt_a is b in the row orientation)
            get = self._get_ptr
            ptr_a, ptr_b = (get(a), get(b)) if self._a_first else (get(b), get(a))
        else:
            ptr_a = self._operand_ptr(s.lt_a, a, b, keep)
            ptr_b = self._operand_ptr(s.lt_b, a, b, keep)
        out, ptr_d, kind = self._result(a, sp)
        beta = operands.get("beta")
        c = operands.get("c")
        ptr_c = ptr_d
        if c is not None:
            beta = 1 if beta is None else beta
            if s.c_mode == "direct":
                ptr_c = self._get_ptr(c)
            else:
                xp.copy_into(_to_xp(out, kind, xp), xa(c))
        else:
            beta = 0
        # epilogue pointers
        aux_out = None
        outputs = {}
        bias_ptr = aux_ptr = None
        if self.strategy == "native":
            if "bias" in self._inputs:
                bias = operands["bias"]
                if s.bias_copy or s.bias_cast:
                    bx = xa(bias)
                    if s.bias_cast:
                        bx = xp.astype(bx, p.result_dtype)
                    if s.bias_copy:
                        bx = xp.contiguous(bx)
                    keep.append(bx)
                    bias_ptr = _xp_ptr(bx, xp)
                else:
                    bias_ptr = self._get_ptr(bias)
            if s.bgrad:
                bshape = (*p.batch_shape, s.bgrad_len)
                g, bias_ptr = empty(kind, bshape, p.result_dtype, self.device_index, sp)
                if s.bgrad in ("drelu_bgrad", "dgelu_bgrad") and p.options.bgrad_axis == "m":
                    g = _reshape(g, kind, (*p.batch_shape, s.bgrad_len, 1))
                elif s.bgrad in ("bgrada", "bgradb") and p.batch_shape:
                    src = p.a if s.bgrad == "bgrada" else p.b
                    vec = p.a_vector if s.bgrad == "bgrada" else p.b_vector
                    if vec or len(src.shape) == 2:  # the operand is not batched: every batch gives the same
                        g = make_view(kind, g, (s.bgrad_len,), (1,))
                outputs[s.bgrad] = g
            if s.aux_out:
                aux_out, aux_ptr = self._alloc_aux(kind, sp)
            elif s.aux_in:
                aux_ptr = self._aux_in_ptr(operands, keep)
        alpha_ptr = self._scalar(operands.get("alpha", 1), keep)
        beta_ptr = self._scalar(beta, keep)
        self._launch(ptr_a, ptr_b, ptr_c, ptr_d, bias_ptr, aux_ptr, alpha_ptr, beta_ptr, sp, kind)
        del keep
        if aux_out is not None:
            outputs[p.epilog.outputs[0]] = aux_out
        if self.strategy != "native" or not p.epilog.outputs:
            return out
        return out, outputs

    def _result(self, a, sp: int):
        """``(result, its pointer, its kind)``: a new result array in the caller's type."""
        if self._torch_result is not None:
            tshape, tdtype, transposed = self._torch_result
            out = a.new_empty(tshape, dtype=tdtype)  # a's device, the current stream's caching allocator
            ptr_d = out.data_ptr()
            return (out.transpose(-1, -2) if transposed else out), ptr_d, "torch"
        kind = _kind(a, self.framework)
        p = self.problem
        out, ptr_d = empty(kind, p.result_shape, p.result_dtype, self.device_index, sp, self._order)
        return out, ptr_d, kind

    def _launch(self, ptr_a, ptr_b, ptr_c, ptr_d, bias_ptr, aux_ptr, alpha_ptr, beta_ptr, sp: int, kind: str):
        """Queue ``cublasLtMatmul`` on ``sp`` (with the algorithm the pointers' alignment allows)."""
        algo = self._algo
        if (ptr_a | ptr_b | ptr_c | ptr_d) & 255:
            al = _align(ptr_a | ptr_b | ptr_c | ptr_d)
            cands = self.core.algorithms(self.handle, al)
            if not cands:
                raise self._lt.CublasLtError(f"no cuBLASLt algorithm for {al}-byte aligned operands", 15)
            algo = cands[0]
        ws_ptr = self._workspace(sp, algo.workspaceSize, kind) if algo.workspaceSize else 0
        lt = self._lt
        core = self.core
        with self._lock:
            if (bias_ptr, aux_ptr) != self._last:
                if bias_ptr is not None:
                    core.desc.set_ptr(lt.DESC_BIAS_POINTER, bias_ptr)
                if aux_ptr is not None:
                    core.desc.set_ptr(lt.DESC_EPILOGUE_AUX_POINTER, aux_ptr)
                self._last = (bias_ptr, aux_ptr)
            status = lt.matmul_call()(
                self.handle,
                core.desc.ptr,
                alpha_ptr,
                ptr_a,
                core.a.ptr,
                ptr_b,
                core.b.ptr,
                beta_ptr,
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
            lt.check(status, "cublasLtMatmul")

    def _operand_ptr(self, o: Operand, a, b, keep) -> int:
        x = a if o.source == "a" else b
        if not o.copy:
            return self._get_ptr(x)
        p, xp = self.problem, self._xp
        sig = p.a if o.source == "a" else p.b
        vec = (o.source == "a" and p.a_vector) or (o.source == "b" and p.b_vector)
        y = xp.astype(_to_xp(x, self.framework, xp), p.result_dtype)
        if vec:
            y = xp.contiguous(y)
        else:
            y = xp.contiguous(y, (*p.batch_shape, *sig.shape[-2:]))
        keep.append(y)
        return _xp_ptr(y, xp)

    def _alloc_aux(self, kind, sp):
        p, s = self.problem, self.setup
        batch = p.batch_shape
        if s.aux_out == "relu":
            nbytes = s.aux_ld // 8
            buf, ptr = empty(kind, (*batch, s.n_lt, nbytes), "uint8", self.device_index, sp)
            if s.orientation == "row":
                return buf, ptr
            st = c_strides((*batch, s.n_lt, nbytes))
            return make_view(kind, buf, (*batch, nbytes, s.n_lt), (*st[:-2], 1, nbytes)), ptr
        ld = s.aux_ld
        buf, ptr = empty(kind, (*batch, s.n_lt, ld), p.result_dtype, self.device_index, sp)
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

    def _aux_in_ptr(self, operands, keep) -> int:
        p, s, xp = self.problem, self.setup, self._xp
        if s.aux_in == "direct":
            name = "relu_aux" if "relu_aux" in p.input_sigs else "gelu_aux"
            return self._get_ptr(operands[name])
        if "gelu_aux" in p.input_sigs:
            g = _to_xp(operands["gelu_aux"], self.framework, xp)
            g = g.reshape(p.promoted_shape) if (p.a_vector or p.b_vector) else g
            buf = xp.empty((*p.batch_shape, s.n_lt, s.aux_ld), p.result_dtype)
            view = buf[..., : s.m_lt]
            xp.copy_into(view, xp.swap_last(g) if s.orientation == "col" else g)
            keep.append(buf)
            return _xp_ptr(buf, xp)
        mask = _to_xp(operands["relu_aux"], self.framework, xp)
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
        return _xp_ptr(bits, xp)


def _lt_epi_name(value: int) -> str:
    from .._epilog import Epilog

    try:
        return Epilog(value).name
    except ValueError:
        return str(value)


def _kind(x, framework: str) -> str:
    return result_kind(x, framework)


def _to_xp(x, framework: str, xp):
    from .._adapters import adapter_named
    from .arrays import CudaArray

    if framework == xp.name and not isinstance(x, CudaArray):
        return x
    return adapter_named(xp.name).view_device_array(x)


def _xp_ptr(x, xp) -> int:
    from .._adapters import adapter_named

    return adapter_named(xp.name).data_ptr(x)


def _reshape(x, kind: str, shape):
    return make_view(kind, x, shape, c_strides(shape))


def _unfused_gemm(p: MatmulProblem) -> tuple[LtMatmulPlan, bool]:
    """The GEMM of the unfused strategy and whether it adds the bias: cuBLASLt's BIAS epilogue where it takes
    the case (a pass over the result saved), else the DEFAULT epilogue."""
    if p.epilog.steps[:1] == ("add_bias",) and p.epilog.epilog.name != "BIAS":
        import dataclasses

        from .._epilog import Epilog, spec_of

        biased = dataclasses.replace(
            p, epilog=spec_of(Epilog.BIAS), inputs=tuple(i for i in p.inputs if i[0] == "bias")
        )
        orientation, cast, _ = probe(biased)
        if orientation is not None:
            return LtMatmulPlan(biased, orientation=orientation, bias_cast=cast), True
    return LtMatmulPlan(p, fused=False, orientation="row"), False


class InplacePlan:
    """Strategy ``"inplace"``: the unfused matmul (cuBLASLt with the DEFAULT epilogue, or its BIAS epilogue
    where the epilog starts by adding a bias; or the framework's own matmul), then the epilog's other steps
    on the result through CuPy/Torch ops, in place (a saved pre-activation is the GEMM's result itself where
    the framework can write the activation to a new array: no copy). Used where cuBLASLt has no fused kernel
    for the case, and timed against it by autotune; ``steps`` say why. ``relu_aux`` keeps cuBLASLt's bit-mask
    format (so both strategies of one executor speak the same format) and a boolean mask is accepted too."""

    strategy = "inplace"
    tuning_kind = lt_autotune.TUNING_KIND  # its tuning is its GEMM's

    def __init__(self, p: MatmulProblem, why: str, via: str = "lt"):
        from .xp import Xp, namespace_for

        self.problem = p
        self.device_index = _device_index(p)
        self.xp = Xp(namespace_for(p.framework))
        self.framework = p.framework
        self.via = via
        import dataclasses

        self.mm, bias_in_gemm = _unfused_gemm(p) if via == "lt" else (None, False)
        tail = p.epilog.steps[1:] if bias_in_gemm else p.epilog.steps  # the epilog's steps after the GEMM
        #: the framework's out-of-place vocabulary (None: CuPy's ops write in place only)
        self.fresh_ops = getattr(self.xp, "epilog_ops_fresh", lambda: None)()
        split = "save_pre_activation" in tail and self.fresh_ops is not None
        i = tail.index("save_pre_activation") if split else len(tail)
        #: the tail as two epilog specs: the steps in place, then (after a pre-activation kept without a copy)
        #: the steps writing a new array, or None
        self._in_place = dataclasses.replace(p.epilog, steps=tail[:i])
        self._fresh = dataclasses.replace(p.epilog, steps=tail[i + 1 :]) if split else None
        first = self.mm.steps if self.mm is not None else (f"{self.xp.name}.matmul (+ alpha, beta * c)",)
        why = f"not fused: {why}" if why else "unfused variant (for autotuning)"
        name = self.xp.name
        described = [f"{st} (in place, {name})" for st in self._in_place.steps]
        if split:
            described.append("save_pre_activation (the GEMM's result itself, no copy)")
            described += [f"{st} (into a new array, {name})" for st in self._fresh.steps]
        self.steps = (*first, *described, why)
        self.ld_bits = L.relu_aux_ld_bits(p.n)

    def _finish(self, d, inputs: dict, ops) -> tuple:
        """The epilog's tail on ``d``: (result, aux); the result is ``d`` unless the tail wrote a new array."""
        from .._epilog import STEPS, apply_steps

        axis = self.problem.options.bgrad_axis
        d, aux = apply_steps(self._in_place, d, inputs, ops, bgrad_axis=axis)
        if self._fresh is None:
            return d, aux
        aux[STEPS["save_pre_activation"].output] = d  # never written again: the activation makes a new array
        d, more = apply_steps(self._fresh, d, inputs, self.fresh_ops, bgrad_axis=axis)
        return d, {**aux, **more}

    @property
    def workspace_bytes(self) -> int:
        return self.mm.workspace_bytes if self.mm is not None else 0

    def release(self) -> None:
        if self.mm is not None:
            self.mm.release()

    def tuning(self):
        """The GEMM's autotuned algorithm choice (recorded under the GEMM's own key), None untuned."""
        return self.mm.tuning() if self.mm is not None else None

    def autotune(self, operands, iterations: int = 3, stream=None):
        """Tune the GEMM's cuBLASLt algorithm as the native plan tunes its own (the elementwise tail has no
        knobs). Returns ``[(label, seconds)]``."""
        return self.mm.autotune(operands, iterations, stream) if self.mm is not None else []

    def time(self, operands, iterations: int = 3, stream=None) -> float:
        """GPU seconds of one call (CUDA events, as the native plan is timed: Matmul.autotune compares them)."""
        from .streams import stream_pointer

        sp = stream_pointer(stream, self.framework, self.device_index)
        return lt_autotune.gpu_seconds(lambda: self.execute(operands, sp), sp, self.device_index, iterations)

    def execute(self, operands, stream=None):
        from .streams import framework_stream, stream_pointer

        sp = stream_pointer(stream, self.framework, self.device_index)
        with framework_stream(self.xp.name, sp, self.device_index):
            return self._run(operands, sp)

    def _run(self, operands, sp):
        from .._epilog import INPUTS
        from .arrays import as_kind

        p, xp = self.problem, self.xp
        kind = _kind(operands["a"], self.framework)
        if self.mm is not None:
            out = self.mm._execute(operands, sp)
            d = _to_xp(out, self.framework, xp)
        else:
            a = xp.astype(_to_xp(operands["a"], self.framework, xp), p.result_dtype)
            b = xp.astype(_to_xp(operands["b"], self.framework, xp), p.result_dtype)
            d = xp.mod.matmul(a, b)
            alpha = scalar_value(operands.get("alpha", 1))
            if alpha != 1:
                d *= alpha
            c = operands.get("c")
            if c is not None:
                beta = operands.get("beta")
                beta = 1 if beta is None else scalar_value(beta)
                if beta != 0:
                    d += beta * xp.astype(_to_xp(c, self.framework, xp), p.result_dtype)
            out = d
        dd = d.reshape(p.promoted_shape) if (p.a_vector or p.b_vector) else d
        inputs = {}
        for name, sig in p.inputs:
            x = _to_xp(operands[name], self.framework, xp)
            if INPUTS[name].mask_of and sig.dtype == "uint8":  # cuBLASLt's bits -> a boolean mask
                x = xp.unpack_mask(xp.contiguous(x), p.n)
            inputs[name] = INPUTS[name].prepare(x, p)
        ops = xp.epilog_ops()
        name = p.epilog.epilog.name
        if name in ("BGRADA", "BGRADB"):
            if name == "BGRADA":
                a = xp.astype(_to_xp(operands["a"], self.framework, xp), p.result_dtype)
                aux = {"bgrada": ops.sum(a.reshape(1, -1) if p.a_vector else a, -1, False)}
            else:
                b = xp.astype(_to_xp(operands["b"], self.framework, xp), p.result_dtype)
                aux = {"bgradb": ops.sum(b.reshape(-1, 1) if p.b_vector else b, -2, False)}
        else:
            done, aux = self._finish(dd, inputs, ops)
            if done is not dd:  # the tail wrote the result to a new array
                out = done.reshape(p.result_shape) if (p.a_vector or p.b_vector) else done
                if self.mm is not None:
                    out = as_kind(kind, out, xp.name)
        if "relu_aux" in aux:
            aux["relu_aux"] = xp.pack_mask(xp.contiguous(aux["relu_aux"]), self.ld_bits)
        elif "gelu_aux" in aux and (p.a_vector or p.b_vector):
            aux["gelu_aux"] = aux["gelu_aux"].reshape(p.result_shape)
        result = out if self.mm is not None else as_kind(kind, out, xp.name)
        if not p.epilog.outputs:
            return result
        return result, {k: as_kind(kind, v, xp.name) for k, v in aux.items()}
