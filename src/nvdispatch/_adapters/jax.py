"""JAX arrays (``jax.Array``), CPU and GPU: handed to executors by their memory, results back as ``jax.Array``.

JAX has no executor of its own here: a CPU array is host memory (its zero-copy NumPy view runs on the NumPy
executor), a GPU one CUDA memory (the raw ``"cuda"`` executor reads it by its pointer once XLA has written it,
:func:`_ready_pointer`; a transform that executor does not take as it is runs as JAX's operations around its
kernel, ``integrations.jax_fft.eager_fft``). What JAX
adds is the way back: the result is imported as a JAX array on the operand's device, so
``nvdispatch.matmul(ja, jb) - 1.0`` is JAX arithmetic. JAX arrays are immutable: ``out=`` cannot receive a result.

Inside ``jax.jit``, ``jax.grad`` and ``jax.vmap`` the operands are tracers (:class:`JaxTracerAdapter`): they
hold no memory, and the call is staged into the traced program by ``nvdispatch.integrations.jax_matmul`` /
``jax_fft`` instead of run.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import replace
from typing import Any

import numpy as np

from .._cuda.arrays import DeviceView
from .._memory import HOST
from .._precision import PrecisionConvention
from .._strides import c_strides
from ..errors import UnsupportedDtypeError, UnsupportedOperandError, describe
from .base import CPU, Adapter, Device, OperandInfo
from .dlpack import DLPACK_CPU, DlpackAdapter

__all__ = ["JaxAdapter", "JaxTracerAdapter", "default_matmul_precision", "float32_compute_type"]

_TF32, _FP32 = "COMPUTE_32F_FAST_TF32", "COMPUTE_32F"
#: what XLA on an NVIDIA GPU computes a float32 (and complex64) product with, by the name of JAX's precision
#: (``jax.lax.Precision``: DEFAULT and HIGH use TF32 where the GPU has it, HIGHEST float32) or of a
#: ``jax.lax.DotAlgorithmPreset`` (the algorithm it names; the multi-pass ones computed at least as precisely)
_XLA_GPU_FLOAT32 = {
    "DEFAULT": _TF32,
    "HIGH": _TF32,
    "HIGHEST": _FP32,
    "TF32_TF32_F32": _TF32,
    "TF32_TF32_F32_X3": _FP32,
    "BF16_BF16_F32": "COMPUTE_32F_FAST_16BF",
    "BF16_BF16_BF16": "COMPUTE_32F_FAST_16BF",
    "BF16_BF16_F32_X3": _FP32,
    "BF16_BF16_F32_X6": _FP32,
    "BF16_BF16_F32_X9": _FP32,
    "F16_F16_F32": "COMPUTE_32F_FAST_16F",
    "F16_F16_F16": "COMPUTE_32F_FAST_16F",
    "F32_F32_F32": _FP32,
    "F64_F64_F64": _FP32,
}
#: the strings jax_default_matmul_precision takes for a jax.lax.Precision (JAX's own table)
_PRECISION_NAMES = {
    "default": "DEFAULT",
    "fastest": "DEFAULT",
    "bfloat16": "DEFAULT",
    "high": "HIGH",
    "tensorfloat32": "HIGH",
    "bfloat16_3x": "HIGH",
    "highest": "HIGHEST",
    "float32": "HIGHEST",
}


def default_matmul_precision():
    """JAX's default matmul precision in this thread now: ``jax_default_matmul_precision`` (the config option, or
    the ``jax.default_matmul_precision(...)`` context around the call); None where unset (DEFAULT)."""
    return sys.modules["jax"].config.jax_default_matmul_precision


def float32_compute_type(setting) -> tuple[str, str]:
    """``(compute type name, precision name)`` of a float32/complex64 product on an NVIDIA GPU at JAX precision
    ``setting`` (None, a string JAX takes, a ``jax.lax.Precision`` or ``DotAlgorithmPreset``), as XLA computes
    it: DEFAULT (unset) and HIGH on TF32 tensor cores, HIGHEST in float32, an algorithm preset as it names. A
    setting this table does not know (an FP8 preset) computes in float32, at least as precisely as asked."""
    name = "DEFAULT" if setting is None else getattr(setting, "name", setting)
    if isinstance(name, str):
        name = _PRECISION_NAMES.get(name.lower(), name)
    return _XLA_GPU_FLOAT32.get(name, _FP32), str(name)


_HOST = frozenset({HOST})
#: the jax.numpy.fft function of each transform kind, whose result dtype is JAX's rule for that kind
_FFT_OF_KIND = {"c2c": "fft", "r2c": "rfft", "c2r": "irfft"}
_REAL_OF = {"complex64": "float32", "complex128": "float64"}


@functools.cache
def _jax_fft_result(kind: str, dtype: str, x64: bool) -> str | None:
    """The dtype ``jax.numpy.fft``'s transform of ``kind`` returns for ``dtype`` input (JAX itself answers,
    abstractly: no data), or None where JAX refuses the dtype. ``x64``: JAX's ``jax_enable_x64`` (it keys the
    cache only: the answer is read under the setting active now)."""
    jax = sys.modules["jax"]
    try:
        out = jax.eval_shape(getattr(jax.numpy.fft, _FFT_OF_KIND[kind]), jax.ShapeDtypeStruct((2,), dtype))
    except (TypeError, ValueError, NotImplementedError):  # JAX refuses the dtype for this kind
        return None
    return str(out.dtype)


def _ready_pointer(x) -> int:
    """The device address of JAX GPU array ``x`` once XLA's work writing it has finished. JAX computes
    asynchronously on its own streams (a cast, a ``device_put``, a jitted call may still be queued or running when
    the call returns) and XLA's streams are not ordered with the ones nvdispatch launches on: a kernel reading
    ``x`` before that would read whatever the memory held (zeros, fresh from the allocator). The host waits
    (``block_until_ready``, at once when ``x`` is ready), so the array is also complete for every later launch."""
    x.block_until_ready()
    return int(x.unsafe_buffer_pointer())


class JaxAdapter(Adapter):
    name = "jax"
    wraps = True
    #: verified on GPUs before the cuda executor had framework-free passes, and what runs inside jax.jit too
    prepared_fft_route = "JAX's own operations bring the transform to cuFFT, as inside jax.jit"
    default_executors = DlpackAdapter.default_executors
    _dlpack = DlpackAdapter()

    def claims(self, cls: type) -> bool:
        jax = sys.modules.get("jax")
        return jax is not None and issubclass(cls, jax.Array)

    def info(self, name: str, x: Any) -> OperandInfo:
        if x.__dlpack_device__()[0] != DLPACK_CPU:
            return replace(self._dlpack.info(name, x), framework=self.name)
        view = np.asarray(x)  # zero-copy (read-only); cheaper than NumPy's DLPack import
        # float8 and the other ml_dtypes: NumPy cannot compute on them (bfloat16 the NumPy executor computes in float32)
        if view.dtype.isbuiltin != 1 and view.dtype.name != "bfloat16":
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

    # -- precision conventions ---------------------------------------------------------------------------
    @property
    def precision_key(self):
        """JAX's default matmul precision (its config option or context)."""
        return default_matmul_precision

    def precision_convention(self, device: Device) -> PrecisionConvention:
        """On NVIDIA GPUs, float32 products at the compute type XLA gives JAX's default matmul precision (TF32 for
        DEFAULT); on the CPU float32, as XLA computes float32 products there whatever the precision (``explain()``
        names the setting all the same)."""
        setting = default_matmul_precision()
        shown = "unset (DEFAULT)" if setting is None else repr(setting)
        if device.kind != "cuda":
            return PrecisionConvention(None, f"JAX default_matmul_precision {shown}: float32 on the CPU, as XLA's")
        compute, name = float32_compute_type(setting)
        return PrecisionConvention(compute, f"JAX default_matmul_precision {shown}: {name} on an NVIDIA GPU")

    def cast(self, x, dtype: str):
        return x.astype(dtype)

    def promote_types(self, x: str, y: str, argument: str) -> str:
        """``jax.numpy.promote_types``: JAX's type lattice (float16 with int32 is float16, bfloat16 with float16
        float32; NumPy would give float64 and refuse bfloat16)."""
        jnp = sys.modules["jax"].numpy
        try:
            return str(jnp.promote_types(x, y))
        except (TypeError, ValueError) as exc:
            raise UnsupportedDtypeError(argument, f"a dtype JAX promotes with {x}", y, str(exc)) from None

    def fft_promotion(self, kind: str, dtype: str, one_axis: bool = False) -> tuple[str, str] | None:
        """``jax.numpy.fft``'s rule, asked of JAX: booleans and integers computed in the floating dtype JAX gives
        them (float32, or float64 for 64-bit integers under ``jax_enable_x64``), float16 and bfloat16 in float32
        (their real-input transforms JAX refuses: None, so the problem builder names the dtype)."""
        result = _jax_fft_result(kind, dtype, bool(sys.modules["jax"].config.jax_enable_x64))
        if result is None:
            return None
        return _REAL_OF.get(result, result), result

    def data_ptr(self, x) -> int:
        return _ready_pointer(x)

    def device_view(self, x):
        """The device view executors read a GPU array by (``nvdispatch._cuda.arrays.view``), once XLA has written
        it (see :func:`_ready_pointer`): JAX's ``__cuda_array_interface__``, which the protocol read would take,
        neither waits for the array nor names the stream it is written on."""
        if x.__dlpack_device__()[0] == DLPACK_CPU:
            return None
        shape = tuple(x.shape)
        return DeviceView(_ready_pointer(x), str(x.dtype), shape, c_strides(shape), x)

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
    #: traced arrays follow JAX's rules as concrete ones do (the casts are staged)
    cast = JaxAdapter.cast
    fft_promotion = JaxAdapter.fft_promotion
    promote_types = JaxAdapter.promote_types

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
