"""Raw CUDA utilities shared by the GPU executors (cuBLASLt matmul today, cuFFT next).

Nothing here is specific to one operation. Each piece is imported lazily, so importing
``nvdispatch._cuda`` never needs a GPU, cuda-bindings or any framework:

``runtime``
    cuda-bindings runtime helpers: availability (:func:`unavailable`), error checking, device count,
    stream-ordered allocation (``cudaMallocAsync``/``cudaFreeAsync``) and CUDA-event timing.
``libs``
    Locating and loading NVIDIA libraries (``cublasLt``, ``cufft``...) with cuda-pathfinder.
``streams``
    Normalising a ``stream=`` argument (CuPy/Torch stream, ``__cuda_stream__`` object, raw int) and the
    default stream of a framework (Torch's / CuPy's current stream, the legacy default stream otherwise).
``memory``
    Device allocation through the caller's framework (Torch caching allocator, CuPy memory pool) or
    stream-ordered ``cudaMallocAsync``; scratch buffers that are freed in stream order.
``arrays``
    Device views of operands (pointer, shape, strides) for Torch, CuPy, ``__cuda_array_interface__`` and
    DLPack objects, and results created as the caller's type (Torch tensor, CuPy array, Numba device
    array, or an object exposing ``__cuda_array_interface__``).
``xp``
    Small elementwise/copy helpers over Torch or CuPy (whichever owns or can view the memory), for the
    cases a library call cannot cover (layout copies, casts, fallbacks).
``cublaslt``
    ctypes bindings of the cuBLASLt C API (cuda-bindings has none).
``lt_layout``, ``lt_setup``, ``lt_fp8_layout``
    A row-major matmul problem in cuBLASLt's column-major terms (pure arithmetic, tested on the CPU).
``lt_descriptors``
    Descriptors, layouts and preferences of a problem, the heuristic's answers for them, and ``probe``: whether
    (and in which orientation) cuBLASLt fuses a problem's epilog.
``lt_launch``, ``lt_plan_base``
    The one launch sequence of every cuBLASLt plan, and what the plans share on top of it (tuning, timing,
    workspaces).
``lt_matmul``, ``lt_direct``, ``lt_aux``, ``lt_inplace``
    The regular cuBLASLt plan shared by the ``cuda`` and ``cupy`` executors: its direct call, its epilogue
    buffers, and the unfused ``inplace`` strategy beside it.
``lt_fp8``
    The FP8 cuBLASLt plan.
``lt_autotune``
    Timing cuBLASLt's candidate algorithms and recording the fastest.
"""

from __future__ import annotations

__all__ = ["unavailable"]


def unavailable() -> str | None:
    """Why raw CUDA execution is impossible here (missing cuda-bindings, no device), or None."""
    from .runtime import unavailable as _unavailable

    return _unavailable()
