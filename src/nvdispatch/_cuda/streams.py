"""Streams as raw ``cudaStream_t`` handles (ints).

``stream_pointer(stream, framework, device_index)`` accepts what users pass as ``stream=``: ``None`` (the
framework's current stream: ``torch.cuda.current_stream()``, CuPy's current stream, or the legacy default
stream ``0`` for raw ``__cuda_array_interface__``/DLPack operands), a ``torch.cuda.Stream``, a CuPy stream,
any object implementing ``__cuda_stream__`` (cuda.core, the CUDA stream protocol), a cuda-bindings
``CUstream``/``cudaStream_t``, or a raw int.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["stream_pointer", "current_stream", "current_stream_getter", "framework_stream"]


def current_stream(framework: str, device_index: int | None) -> int:
    """The framework's current stream on ``device_index`` as a raw handle (0: the legacy default stream)."""
    if framework == "torch":
        import torch

        idx = device_index if device_index is not None else torch.cuda.current_device()
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        return int(raw(idx)) if raw is not None else int(torch.cuda.current_stream(idx).cuda_stream)
    if framework == "cupy":
        import cupy

        return int(cupy.cuda.get_current_stream().ptr)
    return 0


def current_stream_getter(framework: str, device_index: int):
    """A cheap callable giving what :func:`current_stream` gives for ``device_index`` (for per-call use);
    None where that is always the legacy default stream ``0``."""
    if framework == "torch":
        import torch

        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is not None:
            return lambda: raw(device_index)
    if framework in ("torch", "cupy"):
        return lambda: current_stream(framework, device_index)
    return None


def stream_pointer(stream: Any, framework: str = "", device_index: int | None = None) -> int:
    """Normalise ``stream`` to a raw ``cudaStream_t`` handle (see the module docstring)."""
    if stream is None:
        return current_stream(framework, device_index)
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        version, handle = proto() if callable(proto) else proto
        return int(handle)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(stream, torch.cuda.Stream):
        return int(stream.cuda_stream)
    ptr = getattr(stream, "ptr", None)  # CuPy streams
    if isinstance(ptr, int):
        return ptr
    if type(stream).__module__.startswith("cuda.bindings"):  # CUstream / cudaStream_t
        return int(stream)
    from ..errors import InvalidArgumentError, describe

    raise InvalidArgumentError(
        "stream",
        "a torch.cuda.Stream, a CuPy stream, an object with __cuda_stream__, a cuda-bindings stream or an int",
        describe(stream),
    )


def framework_stream(framework: str, stream: int, device_index: int | None):
    """A context making raw ``stream`` the current stream of ``framework`` ("torch"/"cupy"), so its
    allocations and ops are ordered on it; a no-op when it already is, or for other frameworks."""
    import contextlib

    if framework not in ("torch", "cupy") or stream == current_stream(framework, device_index):
        return contextlib.nullcontext()
    if framework == "torch":
        import torch

        dev = torch.device("cuda", device_index if device_index is not None else torch.cuda.current_device())
        return torch.cuda.stream(torch.cuda.ExternalStream(stream, device=dev))
    import cupy

    return cupy.cuda.ExternalStream(stream)
