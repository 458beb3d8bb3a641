"""The one compiled part, optional: nvdispatch._hotpath (_hotpath.c: matmul's cached hit; _hotpath_fft.c: the
transforms' cached hit; _hotpath_lt.c, _hotpath_cufft.c: the cuBLASLt and cuFFT launches; _hotpath_ffi.c: the XLA
FFI handler that runs cuBLASLt plans inside ``jax.jit`` on the GPU; _hotpath_epilog.c: the CPU linear layer's bias
and activation in one sweep; _hotpath_launch.c: prepared launches of the Numba kernels of ``fft.convolve``;
_hotpath_reading.c: a framework's precision settings read without a Python frame; _hotpath_tiled.c: the CPU linear
layer as one blocked GEMM with its epilog applied per register tile; _hotpath_cores.c: whether another thread of the
process is running), built
for the stable ABI (one build serves CPython 3.10 and later). Where it cannot be built the package installs without
it: ``nvdispatch.matmul`` and the transforms take the same route in Python, cuBLASLt and cuFFT are launched through
ctypes, Numba launches the convolution kernels, and the CPU linear layer uses its other engines.

The XLA FFI handler is compiled against the XLA FFI C API header of the jaxlib installed where the extension is
built (``jaxlib/include/xla/ffi/api/c_api.h``, found without importing JAX); without jaxlib there (an isolated
build environment, for one) the extension is built without it and JAX programs stage their matmuls as Python
buffer callbacks; so does a header the handler does not compile against (the rest of the extension is built
all the same). ``NVDISPATCH_XLA_FFI_INCLUDE=DIR`` names another include directory; ``NVDISPATCH_XLA_FFI=0``
leaves the handler out. Everything else is in pyproject.toml."""

import importlib.util
import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

#: what the handler uses of the header; an older header leaves it out
_FFI_NEEDS = ("XLA_FFI_Metadata_Extension", "XLA_FFI_DeviceOrdinal_Get", "XLA_FFI_Stream_Get")


def _xla_ffi_include():
    """The include directory holding ``xla/ffi/api/c_api.h`` (jaxlib's), or None."""
    if os.environ.get("NVDISPATCH_XLA_FFI", "1") == "0":
        return None
    dirs = [os.environ["NVDISPATCH_XLA_FFI_INCLUDE"]] if os.environ.get("NVDISPATCH_XLA_FFI_INCLUDE") else []
    try:
        spec = importlib.util.find_spec("jaxlib")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        dirs += [os.path.join(base, "include") for base in spec.submodule_search_locations]
    for inc in dirs:
        header = os.path.join(inc, "xla", "ffi", "api", "c_api.h")
        if os.path.isfile(header):
            with open(header, encoding="utf-8") as fh:
                text = fh.read()
            if all(name in text for name in _FFI_NEEDS):
                return inc
    return None


class _BuildExt(build_ext):
    """Where the handler does not compile against the header found (an XLA FFI API it does not know), build the
    extension without it rather than not at all."""

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001 - a compiler error of any kind
            if ("NVD_XLA_FFI", "1") not in ext.define_macros:
                raise
            print(f"nvdispatch: building without the XLA FFI handler ({type(exc).__name__}: {exc})")
            ext.define_macros = [m for m in ext.define_macros if m[0] != "NVD_XLA_FFI"]
            ext.include_dirs = [d for d in ext.include_dirs if d != _ffi]
            super().build_extension(ext)


_ffi = _xla_ffi_include()

setup(
    ext_modules=[
        Extension(
            "nvdispatch._hotpath",
            [
                "src/nvdispatch/_hotpath.c",
                "src/nvdispatch/_hotpath_lt.c",
                "src/nvdispatch/_hotpath_cache.c",
                "src/nvdispatch/_hotpath_fft.c",
                "src/nvdispatch/_hotpath_cufft.c",
                "src/nvdispatch/_hotpath_ffi.c",
                "src/nvdispatch/_hotpath_epilog.c",
                "src/nvdispatch/_hotpath_launch.c",
                "src/nvdispatch/_hotpath_reading.c",
                "src/nvdispatch/_hotpath_tiled.c",
                "src/nvdispatch/_hotpath_cores.c",
            ],
            include_dirs=["src/nvdispatch"] + ([_ffi] if _ffi else []),
            py_limited_api=True,
            libraries=["pthread"] if os.name == "posix" else [],  # the tiled GEMM's threads (older C libraries)
            define_macros=[("Py_LIMITED_API", "0x030A0000")] + ([("NVD_XLA_FFI", "1")] if _ffi else []),
            depends=[
                "src/nvdispatch/_hotpath.h",
                "src/nvdispatch/_hotpath_lt.h",
                "src/nvdispatch/_hotpath_tiled_body.h",
            ],
            optional=True,
        )
    ],
    cmdclass={"build_ext": _BuildExt},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
