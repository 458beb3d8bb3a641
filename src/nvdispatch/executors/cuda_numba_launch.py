"""The launches of a ``"cuda"`` executor plan's Numba kernels, run per call on the operands' device pointers: the
plan describes them once for its problem (:class:`~nvdispatch.device.kernel_steps.KernelStep`).

Where it can, :class:`StepLauncher` prepares them once: each kernel's ``CUkernel`` handle taken from Numba's
compiled overload for the step's argument types, the parameters packed as Numba's ABI lays them out
(:mod:`nvdispatch._cuda.kernel_params`) and checked against the sizes the driver reports for the kernel; a call
then queues them through ``cuLaunchKernel`` from the compiled extension (:mod:`nvdispatch._cuda.kernel_launch`),
with no Numba device arrays made and no Numba dispatch. Elsewhere (no compiled extension, a kernel Numba
launches with extras: debug, cooperative, argument extensions) Numba launches the same steps on views of the
same pointers. :attr:`StepLauncher.how` says which (the plan's ``explain()`` steps and a DEBUG record show it).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from .._cuda.kernel_launch import LaunchSpec, PreparedLaunches, dims3, unavailable
from .._cuda.kernel_params import DATA_POINTER, PackedParameters, array_parameters, pack, scalar_parameters
from .cuda_numba import NumbaStreams, on_device, raw_view

if TYPE_CHECKING:  # nvdispatch.device needs numba-cuda: imported where a plan uses it
    from ..device.kernel_steps import ArrayArg, KernelStep

_log = logging.getLogger("nvdispatch")

__all__ = ["step_parameters", "kernel_handle", "StepLauncher"]


def step_parameters(step: KernelStep) -> tuple[PackedParameters, tuple[tuple[int, int], ...]]:
    """The packed parameters of ``step`` (every array's data pointer 0) and the ``(parameter, operand)`` slots
    its arrays' pointers go to."""
    from ..device.kernel_steps import ArrayArg

    params, patches = [], []
    for arg in step.args:
        if isinstance(arg, ArrayArg):
            patches.append((len(params) + DATA_POINTER, arg.operand))
            params += array_parameters(0, arg.shape, arg.c_strides(), arg.itemsize)
        else:
            params += scalar_parameters(np.asarray(arg).dtype.name, arg)
    return pack(params), tuple(patches)


def kernel_handle(dispatcher, argtypes: tuple) -> int | str:
    """The ``CUkernel`` handle of ``dispatcher``'s kernel for ``argtypes`` in the current context (compiled
    first if it is not), or why it cannot be launched but by Numba."""
    kernel = dispatcher.compile(argtypes)
    if getattr(kernel, "extensions", None):
        return "the kernel has argument extensions"
    if getattr(kernel, "debug", False) or getattr(kernel, "cooperative", False):
        return "a debug or cooperative kernel"
    if getattr(kernel, "launch_config_sensitive", False):
        return "a kernel compiled per launch configuration"
    try:
        kernel.bind()  # loads it into the context and runs its module's setup, as a first Numba launch does
        handle = kernel._codelibrary.get_cufunc().handle
    except AttributeError as exc:  # another numba-cuda than the one this reads
        return f"no kernel handle from this numba-cuda ({exc})"
    return int(handle)


def _size_mismatch(handle: int, sizes: tuple[int, ...]) -> str | None:
    """Why the driver's parameter sizes of kernel ``handle`` differ from ``sizes``, or None (also where the
    driver cannot say: CUDA before 12.4)."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return None
    query = getattr(driver, "cuKernelGetParamInfo", None)
    if query is None:
        return None
    kernel = driver.CUkernel(handle)
    for i, size in enumerate(sizes):
        err, _offset, got = query(kernel, i)
        if err == driver.CUresult.CUDA_ERROR_NOT_SUPPORTED:
            return None
        if err != driver.CUresult.CUDA_SUCCESS:
            return f"the driver reports {i} parameters, Numba's layout has {len(sizes)}"
        if int(got) != size:
            return f"parameter {i} is {int(got)} bytes, Numba's layout says {size}"
    err, _offset, _got = query(kernel, len(sizes))
    if err == driver.CUresult.CUDA_SUCCESS:
        return f"the driver reports more than the {len(sizes)} parameters of Numba's layout"
    return None


def _prepare(steps: Sequence[KernelStep], operands: int) -> PreparedLaunches | str:
    """The prepared launches of ``steps`` in the current context, or why there are none."""
    why = unavailable()
    if why:
        return why
    from numba import cuda

    specs = []
    for step in steps:
        handle = kernel_handle(step.dispatcher, step.argument_types())
        if isinstance(handle, str):
            return handle
        packed, patches = step_parameters(step)
        mismatch = _size_mismatch(handle, packed.sizes)
        if mismatch:
            return mismatch
        specs.append(LaunchSpec(handle, dims3(step.grid), dims3(step.block), step.shared, packed, patches))
    context = int(cuda.current_context().handle)
    return PreparedLaunches(context, operands, specs)


def _view(pointer: int, arg: ArrayArg):
    return raw_view(pointer, arg.shape, arg.dtype)


class StepLauncher:
    """``launcher(stream, pointers)``: queue ``steps`` on ``stream`` (a raw handle) with the operands at
    ``pointers`` (device addresses, by the steps' operand numbers), on GPU ``device_index``."""

    def __init__(self, steps: Sequence[KernelStep], operands: int, device_index: int, several: bool, what: str):
        self.steps = tuple(steps)
        self.device_index, self._several = device_index, several
        try:
            with on_device(device_index, several):
                prepared = _prepare(self.steps, operands) if self.steps else "no launches"
        except Exception as exc:  # noqa: BLE001 - Numba launches the same steps; the reason is logged
            prepared = f"preparing the driver launch failed: {type(exc).__name__}: {exc}"
        if isinstance(prepared, str):
            self._prepared = None
            self._streams = NumbaStreams()
            self.how = f"launched by Numba ({prepared})"
        else:
            self._prepared = prepared
            self.how = "launched by cuLaunchKernel, parameters packed at plan time"
        _log.debug("%s: %d kernel launches, %s", what, len(self.steps), self.how)

    @property
    def prepared(self) -> bool:
        """Whether the launches go through the driver (else through Numba)."""
        return self._prepared is not None

    def __call__(self, stream: int, pointers: Sequence[int]) -> None:
        if self._prepared is not None:
            self._prepared(stream, *pointers)
            return
        from ..device.kernel_steps import launch_with_numba

        with on_device(self.device_index, self._several):
            launch_with_numba(self.steps, pointers, self._streams(stream), _view)
