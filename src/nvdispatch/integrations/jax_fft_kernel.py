"""One transform of nvdispatch staged into a JAX program: the host kernel (CPU) and the device kernel (GPU).

:func:`fft_kernel` is the unnormalised transform of at most 3 axes of a C-ordered input already of the
transform's sizes and input dtype: ``c2c`` forward/inverse, ``r2c`` forward (the last transformed axis halved,
the innermost of them) or ``c2r`` inverse (``lengths[-1]`` real outputs along it). The axes are counted from the
end, so :func:`jax.vmap`'s axis in front leaves them be. ``jax_fft`` brings every public transform to these
(padding, axis order where needed, scaling, conjugation are XLA's), so that the kernel's problem is one the
``cuda`` executor's cuFFT plans take as they are (strided axes through cuFFT's advanced layout, no copy).

* CPU: the callback runs ``nvdispatch.fft`` (the eager route, plan cache included) on NumPy views of XLA's
  buffers and copies the result into XLA's output buffer.
* GPU: the ``cuda`` executor's cuFFT plan transforms XLA's input buffer into XLA's output buffer on XLA's
  stream (``CudaFFTPlan.execute`` with ``operands["out"]``): no host round trip, no result allocated.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from .._backends import BackendState, set_state
from .._detect import CPU, Device, OperandInfo
from .._fft_problem import FFTProblem, build_fft_problem
from .._memory import plain_memory
from .._plan_cache import plan_cache
from .._strides import c_strides
from .jax_buffers import PlanFinder, device_index, stage

__all__ = ["FFTCall", "fft_kernel"]

#: (kind, direction) -> the public function whose unnormalised form the kernel runs
_FUNCS = {
    ("c2c", "forward"): "fftn",
    ("c2c", "inverse"): "ifftn",
    ("r2c", "forward"): "rfftn",
    ("c2r", "inverse"): "irfftn",
}
#: the norm under which that function does not scale
_UNSCALED = {"forward": "backward", "inverse": "forward"}


@dataclasses.dataclass(frozen=True)
class FFTCall:
    """The static part of a staged transform."""

    kind: str
    direction: str
    lengths: tuple[int, ...]
    #: the transformed axes, counted from the end (stable when jax.vmap adds an axis in front); default: the
    #: last ``len(lengths)`` in order
    where: tuple[int, ...] | None = None
    #: the backend state when the call was traced (the kernels run under it)
    state: BackendState = dataclasses.field(default_factory=BackendState)

    @property
    def func(self) -> str:
        return _FUNCS[(self.kind, self.direction)]

    @property
    def norm(self) -> str:
        return _UNSCALED[self.direction]

    @property
    def negative_axes(self) -> tuple[int, ...]:
        return self.where if self.where is not None else tuple(range(-len(self.lengths), 0))

    def axes(self, ndim: int) -> tuple[int, ...]:
        return tuple(ndim + a for a in self.negative_axes)

    def problem(self, shape, dtype: str, framework: str = "jax", device: Device = CPU) -> FFTProblem:
        """The problem of this transform on a C-ordered input of ``shape`` and ``dtype``."""
        shape = tuple(int(d) for d in shape)
        info = OperandInfo(None, framework, device, dtype, shape, c_strides(shape), memory=plain_memory(device))
        return build_fft_problem(
            self.func, info, framework, device, s=self.lengths, axes=self.axes(len(shape)), norm=self.norm
        )


def fft_kernel(call: FFTCall, x):
    """The transform ``call`` of the JAX value ``x`` (see the module docstring)."""
    problem = call.problem(x.shape, str(x.dtype))
    aval = jax.ShapeDtypeStruct(problem.out_shape, problem.result_dtype)
    (out,) = jax.lax.platform_dependent(
        x,
        cpu=lambda v: stage(_host_callback(call), (aval,), v),
        cuda=lambda v: stage(_device_callback(call, str(x.dtype)), (aval,), v),
    )
    return out


def _host_callback(call: FFTCall):
    from ..fft import fftn, ifftn, irfftn, rfftn

    transform = {"fftn": fftn, "ifftn": ifftn, "rfftn": rfftn, "irfftn": irfftn}[call.func]

    def callback(ctx, outs, x):
        a = np.asarray(x)
        with set_state(call.state):
            y = transform(a, s=call.lengths, axes=call.axes(a.ndim), norm=call.norm)
        np.copyto(np.asarray(outs[0]), y)

    return callback


def _device_callback(call: FFTCall, dtype: str):
    finder = PlanFinder("fft", call.state)

    def callback(ctx, outs, x):
        dev = device_index(x)
        shape = tuple(x.shape)
        plan, _ = finder.acquire(
            (dev, shape), lambda: call.problem(shape, dtype, "dlpack", Device("cuda", dev)), "cufft"
        )
        try:
            plan.execute({"x": x, "out": outs[0]}, int(ctx.stream))
        finally:
            plan_cache.let_go(plan)

    return callback
