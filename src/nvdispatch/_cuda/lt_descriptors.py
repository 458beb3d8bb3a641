"""The host objects of a cuBLASLt matmul — matmul descriptor, matrix layouts, preferences — and what cuBLASLt's
heuristic answers for them: the algorithms (memoised per operand alignment) and, per problem, whether and in
which orientation a fused epilogue runs at all (:func:`probe`).
"""

from __future__ import annotations

from .._matmul_problem import MatmulProblem
from .._plan_cache import plan_cache
from . import cublaslt as lt
from .lt_setup import LT_DTYPES, LtSetup, lt_types, orientations, setup

__all__ = ["DEFAULT_MAX_WORKSPACE", "max_workspace", "device_index", "HeuristicMemo", "LtDescriptors", "probe"]

#: workspace cuBLASLt may use (the figure NVIDIA recommends for Hopper); ``preferences.max_workspace_bytes``
#: replaces it
DEFAULT_MAX_WORKSPACE = 32 << 20


def max_workspace(p: MatmulProblem) -> int:
    """The workspace cap of ``p``'s plans: ``preferences.max_workspace_bytes``, else :data:`DEFAULT_MAX_WORKSPACE`."""
    cap = p.plan_preferences.max_workspace_bytes
    return DEFAULT_MAX_WORKSPACE if cap is None else cap


def device_index(p: MatmulProblem) -> int:
    """The CUDA ordinal ``p`` runs on (its operands', else the current device)."""
    if p.device.index is not None:
        return p.device.index
    from . import runtime

    return runtime.current_device()


class HeuristicMemo:
    """``algorithms``: cuBLASLt's heuristic answers for the descriptor and layouts a subclass sets up (``desc``,
    ``a``, ``b``, ``c``, ``d``, ``max_workspace``, and empty ``prefs``/``algos`` dicts), memoised per
    (alignment, count). Shared by :class:`LtDescriptors` and the FP8 descriptors (:mod:`.lt_fp8`)."""

    def related(self) -> list[tuple[str, HeuristicMemo]]:
        """``[(label, descriptors)]`` of forms of this problem whose heuristic answers autotune times for this one
        too (where ``cublasLtMatmulAlgoCheck`` accepts them here); none by default."""
        return []

    def algorithms(self, handle: int, alignment: int, count: int = 1) -> list:
        key = (alignment, count)
        got = self.algos.get(key)
        if got is None:
            pref = self.prefs.get(alignment)
            if pref is None:
                pref = self.prefs[alignment] = lt.Preference(self.max_workspace, alignment)
            got = self.algos[key] = lt.heuristic(handle, self.desc, self.a, self.b, self.c, self.d, pref, count)
        return got


class LtDescriptors(HeuristicMemo):
    """Descriptor, layouts and preferences of one :class:`~.lt_setup.LtSetup` (host objects only)."""

    def __init__(self, p: MatmulProblem, s: LtSetup, max_workspace: int):
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
        self.algos: dict[tuple[int, int], list] = {}


def probe(p: MatmulProblem) -> tuple[str | None, bool, str]:
    """Whether cuBLASLt fuses ``p`` natively: ``(orientation, bias_cast, why_not)`` (orientation None: no).

    Memoised in the shared plan cache (bounded with it, dropped by ``plan_cache.clear()``)."""
    return plan_cache.memo(("cublaslt-probe", p), lambda: _probe(p))


def _probe(p: MatmulProblem) -> tuple[str | None, bool, str]:
    if p.result_dtype not in LT_DTYPES:
        return None, False, f"cuBLASLt has no {p.result_dtype} matmul"
    handle = lt.handle(device_index(p))
    bias = p.input_sigs.get("bias")
    casts = (False, True) if bias is not None and bias.dtype != p.result_dtype else (False,)
    tried = []
    for orientation in orientations(p):
        for cast in casts:
            try:
                core = LtDescriptors(p, setup(p, orientation, cast), max_workspace(p))
                if core.algorithms(handle, 256):
                    return orientation, cast, ""
            except lt.CublasLtError as exc:
                tried.append(f"{orientation}: {exc}")
                continue
            tried.append(f"{orientation}{' (bias cast)' if cast else ''}: no algorithm")
    return None, False, f"cuBLASLt has no fused {p.epilog.epilog.name} kernel for this case ({'; '.join(tried)})"
