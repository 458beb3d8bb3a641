"""Kernel launches prepared once and queued per call by the compiled extension (``_hotpath_launch.c``): the
driver's ``cuLaunchKernel`` with parameters packed at plan time (:mod:`.kernel_params`), only the operands'
device pointers and the stream handed per call.

:class:`PreparedLaunches` runs a fixed sequence of :class:`LaunchSpec` in one call (the GIL released around
the launches) in the plan's context; :func:`unavailable` says why a process cannot (no compiled extension, no
driver library), the plan then launching another way.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from .._compiled import hotpath
from ..errors import CudaRuntimeError
from .kernel_params import PackedParameters

__all__ = ["LaunchSpec", "PreparedLaunches", "driver_entry_points", "unavailable", "dims3"]

_ENTRY_POINTS = ("cuLaunchKernel", "cuCtxGetCurrent", "cuCtxPushCurrent_v2", "cuCtxPopCurrent_v2")


@functools.cache
def driver_entry_points() -> tuple[int, ...] | None:
    """The addresses of the driver's ``cuLaunchKernel``, ``cuCtxGetCurrent``, ``cuCtxPushCurrent_v2`` and
    ``cuCtxPopCurrent_v2``, or None where the driver library cannot be loaded by its name."""
    name = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"
    try:
        lib = ctypes.CDLL(name)
        return tuple(ctypes.cast(getattr(lib, entry), ctypes.c_void_p).value for entry in _ENTRY_POINTS)
    except (OSError, AttributeError):
        return None


def unavailable() -> str | None:
    """Why prepared launches cannot run in this process, or None."""
    hp = hotpath()
    if hp is None:
        return "the compiled extension (nvdispatch._hotpath) is not built"
    if not hasattr(hp, "make_kernel_launches"):
        return "the compiled extension predates prepared launches (rebuild it)"
    if driver_entry_points() is None:
        return "the CUDA driver library could not be loaded by its name"
    return None


def dims3(dims: Sequence[int]) -> tuple[int, int, int]:
    """A grid or block of one to three extents as three.

    >>> dims3((64,)), dims3((8, 2))
    ((64, 1, 1), (8, 2, 1))
    """
    if not 1 <= len(dims) <= 3:
        raise ValueError(f"dims3: one to three extents, got {tuple(dims)}")
    d = (*(int(v) for v in dims), 1, 1)
    return d[0], d[1], d[2]


@dataclass(frozen=True)
class LaunchSpec:
    """One launch: ``function`` (a ``CUfunction`` or ``CUkernel`` handle), grid and block (three extents),
    dynamic shared memory in bytes, the packed parameters, and ``patches``: ``(parameter, operand)`` pairs, the
    parameter slots that take operand ``operand``'s device pointer per call."""

    function: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int
    parameters: PackedParameters
    patches: tuple[tuple[int, int], ...]


class PreparedLaunches:
    """``launches(stream, *pointers)``: queue every launch, in order, on ``stream`` (a raw ``cudaStream_t``), in
    ``context`` (a ``CUcontext`` handle, pushed for the call where another is current; 0: the current one), with
    the operands' device pointers written into their parameters. Raises
    :class:`~nvdispatch.errors.CudaRuntimeError` with the driver's status when a launch fails (the launches
    before it are queued)."""

    __slots__ = ("_run", "operands", "count")

    def __init__(self, context: int, operands: int, launches: Sequence[LaunchSpec]):
        why = unavailable()
        if why:
            raise RuntimeError(f"PreparedLaunches: {why}")
        items = [(s.function, s.grid, s.block, s.shared, s.parameters.values, s.patches) for s in launches]
        self._run = hotpath().make_kernel_launches(driver_entry_points(), int(context), int(operands), items)
        self.operands, self.count = int(operands), len(items)

    def __call__(self, stream: int, *pointers: int) -> None:
        status = self._run(stream, *pointers)
        if status:
            _raise(status)


def _raise(status: int) -> None:
    name = f"CUresult {status}"
    try:
        from cuda.bindings import driver

        err, text = driver.cuGetErrorName(driver.CUresult(status))
        if err == driver.CUresult.CUDA_SUCCESS and text:
            name = text.decode() if isinstance(text, bytes) else str(text)
    except Exception:  # noqa: BLE001, S110 - the number alone names the error
        pass
    raise CudaRuntimeError("cuLaunchKernel", status, name)
