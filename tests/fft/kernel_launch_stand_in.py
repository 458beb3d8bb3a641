"""Test helpers for prepared kernel launches on the CPU: Numba's kernel parameters computed independently (NumPy's
strides and scalar bytes laid out as Numba's kernel ABI documents: meminfo, parent, nitems, itemsize, data, shape,
strides; a complex scalar as its two parts), and a stand-in for the driver's ``cuLaunchKernel`` and context calls
that records what the compiled launcher (``_hotpath_launch.c``) hands it."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from nvdispatch._compiled import hotpath
from nvdispatch._cuda.kernel_params import SLOT
from nvdispatch.device.kernel_steps import ArrayArg, KernelStep

needs_extension = pytest.mark.skipif(
    hotpath() is None or not hasattr(hotpath(), "make_kernel_launches"), reason="the compiled extension is not built"
)


def _slot(raw: bytes) -> bytes:
    return raw + bytes(SLOT - len(raw))


def numba_abi_parameters(step: KernelStep, pointers, arrays=None) -> tuple[bytes, list[int]]:
    """Numba's parameters for ``step`` with the operands at ``pointers``: each array argument's fields read off
    a NumPy array of its shape and dtype (``arrays[operand]``, where given: a NumPy array of the operand's
    layout, whose strides are taken), each scalar's bytes off NumPy; ``(values, sizes)``, one SLOT a value."""
    values, sizes = b"", []
    for arg in step.args:
        if isinstance(arg, ArrayArg):
            a = np.empty(arg.shape, arg.dtype) if arrays is None or arg.operand not in arrays else arrays[arg.operand]
            fields = [0, 0, a.size, a.itemsize, pointers[arg.operand], *a.shape, *a.strides]
            values += b"".join(_slot(np.int64(v).tobytes()) for v in fields)
            sizes += [8] * len(fields)
        elif np.iscomplexobj(arg):
            for part in (arg.real, arg.imag):
                values += _slot(part.tobytes())
                sizes.append(part.itemsize)
        else:
            values += _slot(np.asarray(arg).tobytes())
            sizes.append(np.asarray(arg).itemsize)
    return values, sizes


def chunks(values: bytes) -> list[bytes]:
    """``values`` cut into its SLOTs."""
    return [values[i : i + SLOT] for i in range(0, len(values), SLOT)]


def received(values: bytes, sizes) -> bytes:
    """What the driver reads of packed ``values``: each parameter's first ``size`` bytes."""
    return b"".join(v[:size] for v, size in zip(chunks(values), sizes))


LAUNCH = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_void_p,
    *[ctypes.c_uint] * 7,
    ctypes.c_void_p,
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.c_void_p,
)
GET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p))
PUSH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


class FakeDriver:
    """cuLaunchKernel and the context calls, recording what they get (parameters read by the given sizes):
    ``calls`` holds ``(function, grid, block, shared, stream, parameter bytes)`` per launch."""

    def __init__(self, sizes_of: dict, current: int = 0, fail_at: int | None = None):
        self.calls, self.events, self.current = [], [], current
        self.sizes_of, self.fail_at = sizes_of, fail_at

        def launch(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
            sizes = self.sizes_of[f]
            values = b"".join(ctypes.string_at(params[i], size) for i, size in enumerate(sizes))
            self.calls.append((f, (gx, gy, gz), (bx, by, bz), shared, stream or 0, values))
            return 700 if len(self.calls) == self.fail_at else 0

        def get(out):
            out[0] = self.current
            return 0

        def push(ctx):
            self.events.append(("push", ctx))
            return 0

        def pop(out):
            self.events.append(("pop",))
            return 0

        self._fns = [LAUNCH(launch), GET(get), PUSH(push), GET(pop)]
        self.addresses = tuple(ctypes.cast(f, ctypes.c_void_p).value for f in self._fns)


def stand_in_launcher(monkeypatch, context: int = 0x5000) -> FakeDriver:
    """Make every :class:`~nvdispatch.executors.cuda_numba_launch.StepLauncher` made from here on prepare its
    launches for a :class:`FakeDriver` (returned; its ``sizes_of`` filled as kernels are prepared): the driver's
    entry points, Numba's context and each step's kernel handle (``0x1000 + n``, the ``n``-th distinct kernel)
    stood in for, the parameter sizes taken as packed."""
    from nvdispatch._cuda import kernel_launch
    from nvdispatch.executors import cuda_numba_launch

    driver = FakeDriver({}, current=context)
    handles: dict[int, int] = {}

    def handle(dispatcher, argtypes):
        return handles.setdefault(id(dispatcher), 0x1000 + len(handles))

    original = cuda_numba_launch.step_parameters

    def parameters(step):
        packed, patches = original(step)
        driver.sizes_of[handles[id(step.dispatcher)]] = packed.sizes
        return packed, patches

    monkeypatch.setattr(cuda_numba_launch, "unavailable", lambda: None)
    monkeypatch.setattr(kernel_launch, "unavailable", lambda: None)
    monkeypatch.setattr(kernel_launch, "driver_entry_points", lambda: driver.addresses)
    monkeypatch.setattr(cuda_numba_launch, "kernel_handle", handle)
    monkeypatch.setattr(cuda_numba_launch, "step_parameters", parameters)
    monkeypatch.setattr(cuda_numba_launch, "_size_mismatch", lambda handle, sizes: None)
    monkeypatch.setattr(cuda_numba_launch, "current_context", lambda: context)
    monkeypatch.setattr(KernelStep, "argument_types", lambda self: ())  # Numba's CUDA target: not needed here
    return driver
