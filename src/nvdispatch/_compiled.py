"""The optional compiled extension, ``nvdispatch._hotpath`` (``_hotpath.c``, built by ``setup.py`` where a C
compiler is): one place that says whether a process uses it."""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def hotpath() -> ModuleType | None:
    """``nvdispatch._hotpath`` where it is built and ``NVDISPATCH_PURE_PYTHON`` is not set; else None (the callers
    then take their Python route: ``linalg._route``, the ctypes ``cublasLtMatmul``)."""
    if os.environ.get("NVDISPATCH_PURE_PYTHON"):
        return None
    try:
        # by name: the extension is a leaf module with no source file, which a `from . import` would leave
        # source readers (the import-graph checks) to take for the package itself
        return importlib.import_module(f"{__package__}._hotpath")
    except ImportError:  # installed where no C compiler was
        return None
