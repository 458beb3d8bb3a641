"""Framework adapters: what nvdispatch knows of an array framework, and how to teach it another one.

Adding a framework is one adapter (a subclass of :class:`Adapter`) and one call, :func:`register_adapter`;
CONTRIBUTING.md ("Adding a framework") says which methods are required and which optional. An adapter hands
each operand to executors as a *view* of its memory (:attr:`OperandInfo.array`) of given *memory kinds*
(:attr:`OperandInfo.memory`): :data:`HOST` (a NumPy array over host memory, which the NumPy executor takes),
:data:`CUDA` (device memory read by pointer, the raw ``"cuda"`` executor's), or a framework's own kind
(:data:`TORCH_TENSOR`, :data:`CUPY_ARRAY`, :data:`DASK_ARRAY`) for the executors running that framework's
operations. Results come back through the adapter's :meth:`Adapter.wrap`.

Examples
--------
>>> import nvdispatch.adapters as adapters
>>> [ad.name for ad in adapters.adapters()][-2:]  # protocols, asked after every framework
['cuda_array_interface', 'dlpack']
>>> adapters.adapter_named("array_api_strict").default_executors
{'cpu': ('numpy',)}
"""

from __future__ import annotations

from ._adapters import (
    CPU,
    Adapter,
    Device,
    OperandInfo,
    adapter_named,
    adapters,
    register_adapter,
    unregister_adapter,
)
from ._memory import CUDA, CUPY_ARRAY, DASK_ARRAY, HOST, TORCH_TENSOR

__all__ = [
    "Adapter",
    "OperandInfo",
    "Device",
    "CPU",
    "HOST",
    "CUDA",
    "TORCH_TENSOR",
    "CUPY_ARRAY",
    "DASK_ARRAY",
    "register_adapter",
    "unregister_adapter",
    "adapters",
    "adapter_named",
]
