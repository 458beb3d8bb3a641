"""JAX arrays (``jax.Array``), CPU and GPU: run as the DLPack objects they are, results back as ``jax.Array``.

JAX arrays are immutable and JAX has no executor of its own here: a CPU array runs on the NumPy executor
through its zero-copy NumPy view, a GPU one on the raw ``"cuda"`` executor through DLPack, exactly as any
DLPack producer does (so the problem's framework is ``"dlpack"``). What JAX adds is the way back: the
result is imported with ``jax.numpy.from_dlpack`` (zero-copy where JAX accepts the buffer's alignment, a
copy otherwise) and placed on the operand's device, so ``nvdispatch.matmul(ja, jb) - 1.0`` is JAX
arithmetic.

Inside ``jax.jit``, ``jax.grad`` and ``jax.vmap`` the operands are tracers (:class:`JaxTracerAdapter`): they
hold no memory, and the call is staged into the traced program by ``nvdispatch.integrations.jax_matmul`` /
``jax_fft`` instead of run.
"""

from __future__ import annotations

import sys
from typing import Any

from .base import Adapter, Device, OperandInfo
from .dlpack import DlpackAdapter

__all__ = ["JaxAdapter", "JaxTracerAdapter"]


class JaxAdapter(Adapter):
    name = "jax"
    wraps = True
    default_executors = DlpackAdapter.default_executors
    _dlpack = DlpackAdapter()

    def claims(self, cls: type) -> bool:
        jax = sys.modules.get("jax")
        return jax is not None and issubclass(cls, jax.Array)

    def info(self, name: str, x: Any) -> OperandInfo:
        return self._dlpack.info(name, x)

    def device(self, x) -> Device:
        return self._dlpack.device(x)

    def data_ptr(self, x) -> int:
        return int(x.unsafe_buffer_pointer())

    def to_numpy(self, x):
        import numpy as np

        return np.asarray(x)

    def unwrap(self, x: Any) -> Any:
        return self.info("x", x).array

    def wrap(self, result: Any, like: Any) -> Any:
        import jax

        out = jax.numpy.from_dlpack(result)
        device = next(iter(like.devices()), None) if hasattr(like, "devices") else None
        return out if device is None or device in out.devices() else jax.device_put(out, device)


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
        from ..errors import UnsupportedOperandError, describe

        raise UnsupportedOperandError(
            name,
            "a concrete array",
            f"a JAX tracer ({describe(x)}) inside jax.jit/grad/vmap",
            "only the functions nvdispatch.matmul and nvdispatch.fft.* are staged into traced programs; "
            "stateful objects, explain() and backend executors need concrete arrays",
        )
