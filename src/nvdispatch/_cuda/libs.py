"""Locate and load NVIDIA dynamic libraries with cuda-pathfinder (the CUDA wheels, CUDA_HOME, system)."""

from __future__ import annotations

import ctypes
import functools

from ..errors import ExecutorUnavailableError

__all__ = ["load_library", "library_unavailable"]


@functools.cache
def _load(name: str):
    try:
        import cuda.pathfinder as pathfinder
    except ImportError:
        return None, "cuda-pathfinder is not installed (pip install 'nvdispatch[cuda]')"
    try:
        loaded = pathfinder.load_nvidia_dynamic_lib(name)
    except Exception as exc:  # noqa: BLE001 - pathfinder raises several not-found types
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return None, f"lib{name} was not found ({first}); pip install the nvidia-{name.lower()} wheel"
    path = getattr(loaded, "abs_path", None)
    try:
        return ctypes.CDLL(path) if path else ctypes.CDLL(f"lib{name}.so"), None
    except OSError as exc:
        return None, f"lib{name} could not be loaded: {exc}"


def library_unavailable(name: str) -> str | None:
    """Why NVIDIA library ``name`` (e.g. ``"cublasLt"``, ``"cufft"``) cannot be loaded, or None."""
    return _load(name)[1]


def load_library(name: str) -> ctypes.CDLL:
    """The ``ctypes.CDLL`` of NVIDIA library ``name`` (loaded once per process)."""
    lib, why = _load(name)
    if lib is None:
        raise ExecutorUnavailableError("library", f"lib{name}", why)
    return lib
