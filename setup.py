"""The one compiled part, optional: nvdispatch._hotpath (_hotpath.c: matmul's cached hit; _hotpath_fft.c: the
transforms' cached hit; _hotpath_lt.c, _hotpath_cufft.c: the cuBLASLt and cuFFT launches), built for the stable
ABI (one build serves CPython 3.10 and later). Where it cannot be built the package installs without it:
``nvdispatch.matmul`` and the transforms take the same route in Python, and cuBLASLt and cuFFT are launched
through ctypes. Everything else is in pyproject.toml."""

from setuptools import Extension, setup

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
            ],
            depends=["src/nvdispatch/_hotpath.h"],
            py_limited_api=True,
            define_macros=[("Py_LIMITED_API", "0x030A0000")],
            optional=True,
        )
    ],
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
