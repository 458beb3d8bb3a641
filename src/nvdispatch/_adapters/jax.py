"""JAX arrays (``jax.Array``), CPU and GPU: handed to executors through DLPack, results back as ``jax.Array``.

JAX has no executor of its own here: a CPU array is host memory (its zero-copy NumPy view runs on the NumPy
executor), a GPU one CUDA memory (the raw ``"cuda"`` executor reads it through DLPack). What JAX adds is the
way back: the result is imported as a JAX array on the operand's device, so ``nvdispatch.matmul(ja, jb) - 1.0``
is JAX arithmetic. JAX arrays are immutable: ``out=`` cannot receive a result.

Inside ``jax.jit``, ``jax.grad`` and ``jax.vmap`` the operands are tracers (:class:`JaxTracerAdapter`): they
hold no memory, and the call is staged into the traced program by ``nvdispatch.integrations.jax_matmul`` /
``jax_fft`` instead of run.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any

import numpy as np

from .._memory import HOST
from ..errors import UnsupportedDtypeError, UnsupportedOperandError, describe
from .base import CPU, Adapter, Device, OperandInfo
from .dlpack import DLPACK_CPU, DlpackAdapter

__all__ = ["JaxAdapter", "JaxTracerAdapter"]

_HOST = frozenset({HOST})


class JaxAdapter(Adapter):
    name = "jax"
    wraps = True
    default_executors = DlpackAdapter.default_executors
    _dlpack = DlpackAdapter()

    def claims(self, cls: type) -> bool:
        jax = sys.modules.get("jax")
        return jax is not None and issubclass(cls, jax.Array)

    def info(self, name: str, x: Any) -> OperandInfo:
        if x.__dlpack_device__()[0] != DLPACK_CPU:
            return replace(self._dlpack.info(name, x), framework=self.name)
        view = np.asarray(x)  # zero-copy (read-only); cheaper than NumPy's DLPack import
        if view.dtype.isbuiltin != 1:  # bfloat16 and the other ml_dtypes: NumPy cannot compute on them

            raise UnsupportedDtypeError(
                name,
                "a dtype NumPy computes with (JAX arrays on the CPU run on NumPy's executor)",
                view.dtype.name,
                "cast it first (x.astype(jax.numpy.float32)), or run it on a GPU",
            )
        strides = tuple(s // (view.itemsize or 1) for s in view.strides)
        return OperandInfo(view, self.name, CPU, view.dtype.name, view.shape, strides, memory=_HOST)

    def view(self, x: Any) -> Any:
        return np.asarray(x) if x.__dlpack_device__()[0] == DLPACK_CPU else x

    @staticmethod
    def signature(x):
        # JAX arrays are dense and row-major: dtype, shape and device say everything a plan depends on
        return (x.dtype, x.shape, x.device)

    def device(self, x) -> Device:
        return self._dlpack.device(x)

    def data_ptr(self, x) -> int:
        return int(x.unsafe_buffer_pointer())

    def to_numpy(self, x):
        return np.asarray(x)

    def unwritable(self, x) -> str:
        return "a JAX array (JAX arrays are immutable)"

    def wrap(self, result: Any, like: Any) -> Any:
        import jax

        if isinstance(result, (np.ndarray, np.generic)):
            out = jax.numpy.asarray(result)  # a copy into JAX's memory (JAX's DLPack import costs more)
        else:
            out = jax.numpy.from_dlpack(result)  # device memory: zero-copy where JAX accepts the alignment
        device = like.device
        return out if out.device == device else jax.device_put(out, device)


class JaxTracerAdapter(Adapter):
    """JAX tracers (``jax.core.Tracer``: inside ``jax.jit``, ``jax.grad``, ``jax.vmap``): placeholders of a
    program being traced. The public functions hand calls on them to the JAX integration
    (``traced_framework``); anything that would run them now (a stateful ``Matmul``/``FFT``, ``explain``) is
    told, by :meth:`info`, that they hold no values yet."""

    name = "jax_tracer"
    wraps = True
    traced_framework = "jax"

    def claims(self, cls: type) -> bool:
        jax = sys.modules.get("jax")
        return jax is not None and issubclass(cls, jax.core.Tracer)

    def info(self, name: str, x: Any) -> OperandInfo:
        raise UnsupportedOperandError(
            name,
            "a concrete array",
            f"a JAX tracer ({describe(x)}) inside jax.jit/grad/vmap",
            "only the functions nvdispatch.matmul and nvdispatch.fft.* are staged into traced programs; "
            "stateful objects, explain() and backend executors need concrete arrays",
        )
