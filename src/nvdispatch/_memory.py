"""Memory kinds: what the view of an operand that an adapter hands to executors is, and what executors accept.

Executors never see a framework: an adapter hands each operand over as a view of its memory
(``OperandInfo.array``) and says which kinds that view is (``OperandInfo.memory``); an executor declares the
kinds it takes (``ModularExecutor.memory``), and a problem carries the kinds all its operands share
(``problem.memory``). A framework with an executor of its own names a kind of its own.

The built-in kinds:

``"host"`` (:data:`HOST`)
    a ``numpy.ndarray`` over the operand's host memory (zero-copy): the NumPy executor's;
``"cuda"`` (:data:`CUDA`)
    device memory the raw ``"cuda"`` executor reads by pointer: an object exposing ``__cuda_array_interface__``
    or CUDA DLPack, or one whose adapter gives a ``device_view``;
``"torch.Tensor"``, ``"cupy.ndarray"``, ``"dask.Array"``
    the framework's own array, for the executors that run that framework's operations.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["HOST", "CUDA", "TORCH_TENSOR", "CUPY_ARRAY", "DASK_ARRAY", "common_memory", "plain_memory"]

#: a ``numpy.ndarray`` over host memory
HOST = "host"
#: device memory read by pointer (``__cuda_array_interface__``, CUDA DLPack, an adapter's ``device_view``)
CUDA = "cuda"
#: a ``torch.Tensor`` (the Torch executor runs Torch's operations on it)
TORCH_TENSOR = "torch.Tensor"
#: a ``cupy.ndarray`` (the CuPy executor runs CuPy's operations on it)
CUPY_ARRAY = "cupy.ndarray"
#: a ``dask.array.Array`` (the Dask executor builds graphs of block calls)
DASK_ARRAY = "dask.Array"


def common_memory(infos: Iterable[Any], framework: str) -> frozenset[str]:
    """The memory kinds every operand of ``infos`` (OperandInfos) of ``framework`` (the call's) is handed over as.
    Operands of other frameworks are left out: a call places them (Dask takes small plain operands beside Dask
    arrays and wraps them itself; a coercing backend converts them)."""
    it = (info for info in infos if info.framework == framework)
    first = next(it, None)
    if first is None:
        return frozenset()
    kinds = first.memory
    for info in it:
        if info.memory is not kinds:
            kinds = kinds & info.memory
    return kinds


_PLAIN = {"cpu": frozenset({HOST}), "cuda": frozenset({CUDA})}


def plain_memory(device: Any) -> frozenset[str]:
    """The memory kinds of a view on ``device`` (a ``Device``) handed over as plain memory, as a framework with no
    executor of its own hands its arrays over (a host view on the CPU, device memory on a GPU): for operand
    descriptions made without an array (a traced program's buffers)."""
    return _PLAIN.get(device.kind, frozenset())
