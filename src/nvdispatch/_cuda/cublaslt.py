"""ctypes bindings of the cuBLASLt C API (the library located by cuda-pathfinder).

Only what the matmul plans need: handle, matmul descriptor, matrix layouts, preferences, heuristic and
``cublasLtMatmul``. Enum values are those of ``cublasLt.h`` (CUDA 12/13).
"""

from __future__ import annotations

import ctypes
import functools
import sys
import threading

from .._compiled import hotpath
from ..errors import CublasLtError
from .libs import library_unavailable, load_library

__all__ = [
    "lib",
    "unavailable",
    "handle",
    "check",
    "CublasLtError",
    "Desc",
    "Layout",
    "Preference",
    "HeuristicResult",
    "CUDA_DTYPE",
]

# cudaDataType_t
CUDA_DTYPE = {
    "float32": 0,
    "float64": 1,
    "float16": 2,
    "int8": 3,
    "complex64": 4,
    "complex128": 5,
    "uint8": 8,
    "int32": 10,
    "bfloat16": 14,
    "float8_e4m3fn": 28,
    "float8_e5m2": 29,
}

# cublasComputeType_t / cudaDataType_t of the FP8 matmuls
COMPUTE_32F, CUDA_R_32F = 68, 0

# cublasLtMatmulDescAttributes_t
DESC_TRANSA = 3
DESC_TRANSB = 4
DESC_EPILOGUE = 7
DESC_BIAS_POINTER = 8
DESC_BIAS_BATCH_STRIDE = 10
DESC_EPILOGUE_AUX_POINTER = 11
DESC_EPILOGUE_AUX_LD = 12
DESC_EPILOGUE_AUX_BATCH_STRIDE = 13
DESC_A_SCALE_POINTER = 17
DESC_B_SCALE_POINTER = 18
DESC_D_SCALE_POINTER = 20
DESC_AMAX_D_POINTER = 21
DESC_EPILOGUE_AUX_DATA_TYPE = 22
DESC_FAST_ACCUM = 25
DESC_BIAS_DATA_TYPE = 26

# cublasLtMatrixLayoutAttribute_t
LAYOUT_BATCH_COUNT = 5
LAYOUT_STRIDED_BATCH_OFFSET = 6

# cublasLtMatmulPreferenceAttributes_t
PREF_MAX_WORKSPACE_BYTES = 1
PREF_MIN_ALIGNMENT_A_BYTES = 5
PREF_MIN_ALIGNMENT_B_BYTES = 6
PREF_MIN_ALIGNMENT_C_BYTES = 7
PREF_MIN_ALIGNMENT_D_BYTES = 8


class Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class HeuristicResult(ctypes.Structure):
    _fields_ = [
        ("algo", Algo),
        ("workspaceSize", ctypes.c_size_t),
        ("state", ctypes.c_int),
        ("wavesCount", ctypes.c_float),
        ("reserved", ctypes.c_int * 4),
    ]


_vp, _sz, _i32 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int


def unavailable() -> str | None:
    return library_unavailable("cublasLt")


@functools.lru_cache(maxsize=1)
def lib():
    """The loaded cuBLASLt with argtypes declared."""
    L = load_library("cublasLt")
    sig = {
        "cublasLtCreate": [ctypes.POINTER(_vp)],
        "cublasLtDestroy": [_vp],
        "cublasLtGetVersion": [],
        "cublasLtMatmulDescCreate": [ctypes.POINTER(_vp), _i32, _i32],
        "cublasLtMatmulDescDestroy": [_vp],
        "cublasLtMatmulDescSetAttribute": [_vp, _i32, _vp, _sz],
        "cublasLtMatrixLayoutCreate": [ctypes.POINTER(_vp), _i32, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64],
        "cublasLtMatrixLayoutDestroy": [_vp],
        "cublasLtMatrixLayoutSetAttribute": [_vp, _i32, _vp, _sz],
        "cublasLtMatmulPreferenceCreate": [ctypes.POINTER(_vp)],
        "cublasLtMatmulPreferenceDestroy": [_vp],
        "cublasLtMatmulPreferenceSetAttribute": [_vp, _i32, _vp, _sz],
        "cublasLtMatmulAlgoGetHeuristic": [
            _vp,
            _vp,
            _vp,
            _vp,
            _vp,
            _vp,
            _vp,
            _i32,
            ctypes.POINTER(HeuristicResult),
            ctypes.POINTER(_i32),
        ],
        "cublasLtMatmul": [_vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _sz, _vp],
    }
    for name, args in sig.items():
        fn = getattr(L, name)
        fn.argtypes = args
        fn.restype = ctypes.c_size_t if name == "cublasLtGetVersion" else ctypes.c_int
    return L


@functools.lru_cache(maxsize=1)
def matmul_call():
    """``cublasLtMatmul`` taking its 16 arguments as ints (pointers, ``algo`` the address of a
    ``cublasLtMatmulAlgo_t``: ``ctypes.addressof(result.algo)``), returning the status: called directly through
    ``nvdispatch._hotpath`` where the extension is built (sparing the conversion of the 16 arguments ctypes makes
    on every launch), else the ctypes function."""
    compiled = hotpath()
    return lib().cublasLtMatmul if compiled is None else compiled.make_lt_matmul(address("cublasLtMatmul"))


def address(name: str) -> int:
    """The address of cuBLASLt's function ``name`` (what the compiled launches call)."""
    return ctypes.cast(getattr(lib(), name), ctypes.c_void_p).value


def check(status: int, what: str) -> None:
    """Raise :class:`~nvdispatch.errors.CublasLtError` naming ``what`` when ``status`` is not success."""
    if status != 0:
        raise CublasLtError(what, status)


def version() -> int:
    return int(lib().cublasLtGetVersion())


_handles: dict[int, int] = {}
_handle_lock = threading.Lock()


def handle(device_index: int) -> int:
    """The process-wide cuBLASLt handle of ``device_index`` (created once, never destroyed while work may
    be queued: it lives as long as the process, as Torch's do)."""
    h = _handles.get(device_index)
    if h is None:
        with _handle_lock:
            h = _handles.get(device_index)
            if h is None:
                from . import runtime

                p = _vp()
                runtime.on_device(device_index, lambda: check(lib().cublasLtCreate(ctypes.byref(p)), "cublasLtCreate"))
                h = _handles[device_index] = int(p.value)
    return h


def _set(setter, obj, attr: int, value, ctype) -> None:
    buf = ctype(value)
    check(setter(obj, attr, ctypes.byref(buf), ctypes.sizeof(buf)), f"set attribute {attr}")


class Desc:
    """A ``cublasLtMatmulDesc_t``."""

    def __init__(self, compute_type: int, scale_type: int):
        p = _vp()
        check(lib().cublasLtMatmulDescCreate(ctypes.byref(p), compute_type, scale_type), "cublasLtMatmulDescCreate")
        self.ptr = p.value

    def set_i8(self, attr: int, value: int) -> None:
        _set(lib().cublasLtMatmulDescSetAttribute, self.ptr, attr, value, ctypes.c_int8)

    def set_i32(self, attr: int, value: int) -> None:
        _set(lib().cublasLtMatmulDescSetAttribute, self.ptr, attr, value, ctypes.c_int32)

    def set_i64(self, attr: int, value: int) -> None:
        _set(lib().cublasLtMatmulDescSetAttribute, self.ptr, attr, value, ctypes.c_int64)

    def set_ptr(self, attr: int, value: int) -> None:
        _set(lib().cublasLtMatmulDescSetAttribute, self.ptr, attr, value, ctypes.c_void_p)

    def destroy(self, _finalizing=sys.is_finalizing) -> None:
        # at interpreter exit the library handle may already be gone; the process frees everything then
        if self.ptr and not _finalizing():
            lib().cublasLtMatmulDescDestroy(self.ptr)
            self.ptr = None

    __del__ = destroy


class Layout:
    """A column-major ``cublasLtMatrixLayout_t`` (rows, cols, ld), optionally strided-batched."""

    def __init__(self, dtype: int, rows: int, cols: int, ld: int, batch: int = 1, batch_stride: int = 0):
        p = _vp()
        check(lib().cublasLtMatrixLayoutCreate(ctypes.byref(p), dtype, rows, cols, ld), "cublasLtMatrixLayoutCreate")
        self.ptr = p.value
        if batch > 1:
            setter = lib().cublasLtMatrixLayoutSetAttribute
            _set(setter, self.ptr, LAYOUT_BATCH_COUNT, batch, ctypes.c_int32)
            _set(setter, self.ptr, LAYOUT_STRIDED_BATCH_OFFSET, batch_stride, ctypes.c_int64)

    def destroy(self, _finalizing=sys.is_finalizing) -> None:
        # at interpreter exit the library handle may already be gone; the process frees everything then
        if self.ptr and not _finalizing():
            lib().cublasLtMatrixLayoutDestroy(self.ptr)
            self.ptr = None

    __del__ = destroy


class Preference:
    """A ``cublasLtMatmulPreference_t`` with a workspace limit and operand alignments."""

    def __init__(self, max_workspace: int, alignment: int = 256):
        p = _vp()
        check(lib().cublasLtMatmulPreferenceCreate(ctypes.byref(p)), "cublasLtMatmulPreferenceCreate")
        self.ptr = p.value
        setter = lib().cublasLtMatmulPreferenceSetAttribute
        _set(setter, self.ptr, PREF_MAX_WORKSPACE_BYTES, max_workspace, ctypes.c_uint64)
        for attr in (PREF_MIN_ALIGNMENT_A_BYTES, PREF_MIN_ALIGNMENT_B_BYTES, PREF_MIN_ALIGNMENT_C_BYTES):
            _set(setter, self.ptr, attr, alignment, ctypes.c_uint32)
        _set(setter, self.ptr, PREF_MIN_ALIGNMENT_D_BYTES, alignment, ctypes.c_uint32)

    def destroy(self, _finalizing=sys.is_finalizing) -> None:
        # at interpreter exit the library handle may already be gone; the process frees everything then
        if self.ptr and not _finalizing():
            lib().cublasLtMatmulPreferenceDestroy(self.ptr)
            self.ptr = None

    __del__ = destroy


def heuristic(h, desc: Desc, a: Layout, b: Layout, c: Layout, d: Layout, pref: Preference, count: int):
    """Up to ``count`` algorithms, best first (an empty list when none fits)."""
    results = (HeuristicResult * count)()
    found = _i32(0)
    status = lib().cublasLtMatmulAlgoGetHeuristic(
        h, desc.ptr, a.ptr, b.ptr, c.ptr, d.ptr, pref.ptr, count, results, ctypes.byref(found)
    )
    if status != 0:
        return []
    return [results[i] for i in range(found.value) if results[i].state == 0]
