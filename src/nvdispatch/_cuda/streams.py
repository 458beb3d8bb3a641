"""Streams as raw ``cudaStream_t`` handles (ints).

``stream_pointer(stream, framework, device_index)`` accepts what users pass as ``stream=``: ``None`` (the
framework's current stream: ``torch.cuda.current_stream()``, CuPy's current stream, or the legacy default
stream ``0`` for raw ``__cuda_array_interface__``/DLPack operands), a ``torch.cuda.Stream``, a CuPy stream,
any object implementing ``__cuda_stream__`` (cuda.core, the CUDA stream protocol), a cuda-bindings
``CUstream``/``cudaStream_t``, or a raw int.
"""

from __future__ import annotations

import contextlib
from typing import Any

from .._adapter_registry import adapter_named, adapters
from ..errors import InvalidArgumentError, describe

__all__ = ["stream_pointer", "current_stream", "current_stream_getter", "framework_stream"]


def current_stream(framework: str, device_index: int | None) -> int:
    """The framework's current stream on ``device_index`` as a raw handle (0: the legacy default stream)."""
    ad = adapter_named(framework)
    return 0 if ad is None else ad.current_stream(device_index)


def current_stream_getter(framework: str, device_index: int):
    """A cheap callable giving what :func:`current_stream` gives for ``device_index`` (for per-call use);
    None where that is always the legacy default stream ``0``."""
    ad = adapter_named(framework)
    return None if ad is None else ad.current_stream_getter(device_index)


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
    for ad in adapters():  # a framework's own stream object (torch.cuda.Stream, cupy.cuda.Stream)
        handle = ad.stream_handle(stream)
        if handle is not None:
            return handle
    if type(stream).__module__.startswith("cuda.bindings"):  # CUstream / cudaStream_t
        return int(stream)
    raise InvalidArgumentError(
        "stream",
        "a torch.cuda.Stream, a CuPy stream, an object with __cuda_stream__, a cuda-bindings stream or an int",
        describe(stream),
    )


def framework_stream(framework: str, stream: int, device_index: int | None):
    """A context making raw ``stream`` the current stream of ``framework`` ("torch"/"cupy"), so its
    allocations and ops are ordered on it; a no-op when it already is, or for other frameworks."""
    ad = adapter_named(framework)
    return contextlib.nullcontext() if ad is None else ad.stream_context(stream, device_index)
