"""Torch tensors, on the CPU and on CUDA devices (streams, caching allocator, autograd state)."""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from .base import CPU, Adapter, Device, OperandInfo

__all__ = ["TorchAdapter"]


def _grad_enabled() -> bool:
    return sys.modules["torch"].is_grad_enabled()


class TorchAdapter(Adapter):
    name = "torch"
    default_executors = {"cpu": ("torch",), "cuda": ("cuda", "torch")}

    def claims(self, cls: type) -> bool:
        torch = sys.modules.get("torch")
        return torch is not None and issubclass(cls, torch.Tensor)

    def info(self, name: str, x: Any) -> OperandInfo:
        dev = x.device
        device = CPU if dev.type == "cpu" else Device(dev.type, dev.index if dev.index is not None else 0)
        dtype = str(x.dtype).removeprefix("torch.")
        autograd = bool(x.requires_grad) and _grad_enabled()
        return OperandInfo(x, self.name, device, dtype, tuple(x.shape), tuple(x.stride()), autograd)

    @staticmethod
    def signature(x):
        return (x.dtype, x.shape, x.stride(), x.device, x.requires_grad and _grad_enabled())

    def device(self, x) -> Device:
        dev = x.device
        return CPU if dev.type == "cpu" else Device(dev.type, dev.index if dev.index is not None else 0)

    def data_ptr(self, x) -> int:
        return x.data_ptr()

    # -- streams -----------------------------------------------------------------------------------------
    def current_stream(self, device_index: int | None) -> int:
        import torch

        idx = device_index if device_index is not None else torch.cuda.current_device()
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        return int(raw(idx)) if raw is not None else int(torch.cuda.current_stream(idx).cuda_stream)

    def current_stream_getter(self, device_index: int):
        import torch

        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is not None:
            return lambda: raw(device_index)
        return lambda: self.current_stream(device_index)

    def stream_context(self, stream: int, device_index: int | None):
        import torch

        if stream == self.current_stream(device_index):
            return contextlib.nullcontext()
        dev = torch.device("cuda", device_index if device_index is not None else torch.cuda.current_device())
        return torch.cuda.stream(torch.cuda.ExternalStream(stream, device=dev))

    def native_stream_context(self, stream: Any, device_index: int | None):
        """A context making ``stream`` current for Torch (a no-op for None)."""
        if stream is None:
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
                "stream",
                "a torch.cuda.Stream, a CuPy stream, an object with __cuda_stream__, or an int",
                describe(stream),
            )
        return torch.cuda.stream(torch.cuda.ExternalStream(ptr, device=torch.device("cuda", device_index or 0)))

    # -- memory ------------------------------------------------------------------------------------------
    def empty(self, shape, dtype: str, device_index: int, stream: int, order: str = "C"):
        import torch

        from .._cuda.arrays import storage_shape

        shape = tuple(int(s) for s in shape)
        tshape = storage_shape(shape, order)
        arr = torch.empty(tshape, dtype=getattr(torch, dtype), device=torch.device("cuda", device_index))
        if tshape is not shape:
            arr = arr.transpose(-1, -2)
        return arr, arr.data_ptr()

    # -- conversion --------------------------------------------------------------------------------------
    def coerce(self, x):
        import torch

        if isinstance(x, torch.Tensor):
            return x
        return torch.from_dlpack(x) if hasattr(x, "__dlpack__") else torch.as_tensor(x)

    def to_numpy(self, x):
        return x.detach().cpu().numpy()

    def export(self, x):
        return x.detach()
