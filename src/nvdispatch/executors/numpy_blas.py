"""NumPy's own BLAS, reached without linking against it: the OpenBLAS library NumPy loaded, its cblas
``?gemm`` entry points by address (for the compiled engine ``gemm`` of ``numpy_matmul_engines``), and its
thread pool (for the compiled engine ``tiled``, which runs its shares on the BLAS's own workers).

NumPy's wheels carry their own OpenBLAS (``numpy.libs/libscipy_openblas64_-*.so``, 64-bit integer interface,
symbols ``scipy_cblas_sgemm64_``...); SciPy's wheels carry another (``scipy_cblas_sgemm``, 32-bit integers), with
a thread pool of its own. Calling NumPy's one keeps a call on the same library and the same worker threads as the
``np.matmul`` it sits beside (two BLAS pools would each leave workers spinning on the cores after a call).

The library is found among those the process has mapped (``/proc/self/maps``), NumPy's own copy first; where
there is none (MKL, Accelerate, a platform without ``/proc``), :func:`library` is None and :func:`gemm` too: the
engines that need it are not offered.
"""

from __future__ import annotations

import ctypes
import functools
import os

__all__ = ["library", "gemm", "pool", "GEMM_KINDS"]

#: result dtype -> the cblas letter and the kind code of ``_hotpath.gemm_bias_activation``
GEMM_KINDS = {"float32": ("s", 0), "float64": ("d", 1), "complex64": ("c", 2), "complex128": ("z", 3)}
#: thread-count setters of the OpenBLAS builds NumPy ships (64- and 32-bit integer interfaces) and a plain one:
#: what tells an OpenBLAS apart from another library that happens to have "openblas" in its name
_MARKERS = (
    "scipy_openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
    "openblas_set_num_threads64_",
    "openblas_set_num_threads",
)
#: the gemm symbol's name pattern -> its integer width (None: ask the library's configuration)
_GEMM_SYMBOLS = (
    ("scipy_cblas_{}gemm64_", True),
    ("cblas_{}gemm64_", True),
    ("scipy_cblas_{}gemm", None),
    ("cblas_{}gemm", None),
)
#: how many threads the BLAS runs now (what threadpoolctl and ``OPENBLAS_NUM_THREADS`` set)
_THREAD_COUNTS = (
    "scipy_openblas_get_num_threads64_",
    "scipy_openblas_get_num_threads",
    "openblas_get_num_threads64_",
    "openblas_get_num_threads",
)
#: OpenBLAS's pthread-compatible pool entry (``gotoblas_pthread(n, function, args, stride)``: function(args + i
#: * stride) for i < n, the first on the caller, the rest on the BLAS's workers); builds threaded by OpenMP (or on
#: Windows) have none
_POOL_RUN = "gotoblas_pthread"
_CONFIGS = (
    "scipy_openblas_get_config64_",
    "scipy_openblas_get_config",
    "openblas_get_config64_",
    "openblas_get_config",
)


#: dlopen's RTLD_NOLOAD (glibc, musl: 4; macOS: 0x10): a handle only to a library already loaded
_NOLOAD = getattr(os, "RTLD_NOLOAD", 0)


@functools.cache
def library() -> ctypes.CDLL | None:
    """The OpenBLAS NumPy loaded, or None."""
    import numpy as np

    here = os.path.dirname(os.path.dirname(os.path.abspath(np.__file__)))
    candidates = []
    try:  # the wheels' bundled copy: named beside the package (no need to read the whole map of a large process)
        bundled = os.path.join(here, "numpy.libs")
        candidates += sorted(os.path.join(bundled, f) for f in os.listdir(bundled) if "openblas" in f.lower())
    except OSError:
        pass
    found = _first_openblas(candidates, loaded_only=True)
    if found is not None:
        return found
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                path = line.split()[-1]
                name = os.path.basename(path).lower()
                if "openblas" in name and path.startswith("/") and path not in candidates:
                    candidates.append(path)
    except OSError:
        return None
    # NumPy's own copy first (wheels bundle it beside the package); another OpenBLAS (SciPy's) is not the one
    candidates.sort(key=lambda path: not path.startswith(os.path.join(here, "numpy")))
    return _first_openblas(candidates, loaded_only=False)


def _first_openblas(paths: list[str], loaded_only: bool) -> ctypes.CDLL | None:
    """The first of ``paths`` that is an OpenBLAS (``loaded_only``: and already loaded: never a second copy)."""
    for path in paths:
        try:
            lib = ctypes.CDLL(path, mode=_NOLOAD | ctypes.RTLD_LOCAL) if loaded_only else ctypes.CDLL(path)
        except OSError:
            continue
        if any(getattr(lib, marker, None) is not None for marker in _MARKERS):
            return lib
    return None


@functools.cache
def gemm(dtype: str) -> tuple[int, bool] | None:
    """``(address, ilp64)`` of NumPy's BLAS's cblas gemm for ``dtype`` (float32, float64, complex64, complex128):
    the function's address and whether it takes 64-bit integers; None where there is no such function, or its
    integer width cannot be told."""
    lib = library()
    if lib is None or dtype not in GEMM_KINDS:
        return None
    letter = GEMM_KINDS[dtype][0]
    for pattern, ilp64 in _GEMM_SYMBOLS:
        fn = getattr(lib, pattern.format(letter), None)
        if fn is None:
            continue
        if ilp64 is None:
            ilp64 = _ilp64_by_config(lib)
            if ilp64 is None:
                return None
        return ctypes.cast(fn, ctypes.c_void_p).value, ilp64
    return None


def _ilp64_by_config(lib: ctypes.CDLL) -> bool | None:
    """Whether an unsuffixed cblas takes 64-bit integers, as the build's configuration string says."""
    for name in _CONFIGS:
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype = ctypes.c_char_p
            return b"USE64BITINT" in (fn() or b"")
    return None


@functools.cache
def pool() -> tuple[int, int] | None:
    """``(run, size)``: addresses of the thread pool of NumPy's OpenBLAS (``gotoblas_pthread`` and its
    ``get_num_threads``), or None where NumPy's BLAS is not an OpenBLAS with one (OpenMP builds, MKL,
    Accelerate). Work run on it shares the cores with NumPy's own products without crowding them: a worker
    still spinning after ``np.matmul`` takes it at once."""
    lib = library()
    run = None if lib is None else getattr(lib, _POOL_RUN, None)
    size = None if run is None else next((getattr(lib, n) for n in _THREAD_COUNTS if hasattr(lib, n)), None)
    if size is None:
        return None
    return ctypes.cast(run, ctypes.c_void_p).value, ctypes.cast(size, ctypes.c_void_p).value
