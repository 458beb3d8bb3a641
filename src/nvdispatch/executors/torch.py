"""The Torch executor: ``torch.Tensor`` on the CPU and on CUDA devices, through Torch's own ops.

On CUDA, work is queued on the tensor's current stream, or on ``stream=`` when given (a
``torch.cuda.Stream``, a CuPy stream, anything with ``__cuda_stream__``, or a raw ``cudaStream_t`` int).
"""

from __future__ import annotations

import contextlib

from .._adapters import adapter_named
from .._memory import TORCH_TENSOR
from .base import ModularExecutor


class TorchExecutor(ModularExecutor):
    name = "torch"
    memory = frozenset({TORCH_TENSOR})
    device_kinds = frozenset({"cpu", "cuda"})

    def unavailable(self) -> str | None:
        try:
            import torch  # noqa: F401
        except ImportError:
            return "torch is not installed (pip install 'nvdispatch[torch]')"
        return None

    def coerce_operand(self, array):
        return adapter_named("torch").coerce(array)


def stream_context(stream, device):
    """A context that makes ``stream`` current for Torch on ``device`` (a no-op on the CPU or for None)."""
    if stream is None or device.kind != "cuda":
        return contextlib.nullcontext()
    return adapter_named("torch").native_stream_context(stream, device.index)

