"""The Torch executor: ``torch.Tensor`` on the CPU and on CUDA devices, through Torch's own ops.

On CUDA, work is queued on the tensor's current stream, or on ``stream=`` when given (a
``torch.cuda.Stream``, a CuPy stream, anything with ``__cuda_stream__``, or a raw ``cudaStream_t`` int).
"""

from __future__ import annotations

import contextlib

from .base import ModularExecutor


class TorchExecutor(ModularExecutor):
    name = "torch"
    frameworks = frozenset({"torch"})
    device_kinds = frozenset({"cpu", "cuda"})

    def unavailable(self) -> str | None:
        try:
            import torch  # noqa: F401
        except ImportError:
            return "torch is not installed"
        return None

    def coerce_operand(self, array):
        import torch

        if isinstance(array, torch.Tensor):
            return array
        return torch.from_dlpack(array) if hasattr(array, "__dlpack__") else torch.as_tensor(array)


def stream_context(stream, device):
    """A context that makes ``stream`` current for Torch on ``device`` (a no-op on the CPU or for None)."""
    if stream is None or device.kind != "cuda":
        return contextlib.nullcontext()
    import torch

    if isinstance(stream, torch.cuda.Stream):
        return torch.cuda.stream(stream)
    ptr = None
    if isinstance(stream, int):
        ptr = stream
    elif hasattr(stream, "__cuda_stream__"):
        ptr = stream.__cuda_stream__()[1]
    elif hasattr(stream, "ptr"):  # CuPy
        ptr = stream.ptr
    if ptr is None:
        from ..errors import InvalidArgumentError, describe

        raise InvalidArgumentError(
            "stream", "a torch.cuda.Stream, a CuPy stream, an object with __cuda_stream__, or an int", describe(stream)
        )
    return torch.cuda.stream(torch.cuda.ExternalStream(ptr, device=torch.device("cuda", device.index or 0)))
