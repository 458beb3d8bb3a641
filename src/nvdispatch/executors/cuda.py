"""The raw cuda-python executor (``"cuda"``): NVIDIA libraries called directly.

Libraries are located with cuda-pathfinder and called through ctypes (cuBLASLt for matmul, cuFFT for
fft); streams, events and memory go through cuda-bindings (see :mod:`nvdispatch._cuda`). It takes CUDA
memory (``"cuda"`` views: Torch CUDA tensors, CuPy arrays, any object exposing ``__cuda_array_interface__``
(Numba device arrays included) or DLPack on a CUDA device), and creates results of the kind the operand's
adapter names: a Torch tensor, a CuPy array, a Numba device array, or for other objects an
:class:`nvdispatch._cuda.arrays.CudaArray` exposing ``__cuda_array_interface__``.

Execution is asynchronous on the caller's stream: ``stream=`` (a Torch/CuPy stream, a
``__cuda_stream__`` object or a raw ``cudaStream_t`` int) or by default the operands' framework's current
stream (``torch.cuda.current_stream()``, CuPy's current stream, the legacy default stream ``0`` for raw
CAI/DLPack operands). Nothing synchronizes the host.

Matmul auxiliary formats (cuBLASLt's): ``relu_aux`` is a ``uint8`` bit mask, ``(..., m, ceil128(n)/8)``
for the default (bias along N) orientation; DRELU also takes a boolean mask of the result's shape. See
:mod:`nvdispatch._cuda.lt_aux` for the exact layouts.
"""

from __future__ import annotations

from .._adapters import adapter_for, adapter_named
from .._memory import CUDA
from .base import ModularExecutor


class CudaExecutor(ModularExecutor):
    name = "cuda"
    memory = frozenset({CUDA})
    device_kinds = frozenset({"cuda"})

    def unavailable(self) -> str | None:
        from .._cuda import runtime

        return runtime.unavailable()

    def coerce_operand(self, array):
        """Device arrays pass through; host arrays are copied to the current device (a ``CudaArray``)."""
        ad = adapter_for(array)
        if ad is not None and ad.device(array).kind == "cuda":
            return array
        return adapter_named("cuda_array_interface").coerce(array)
