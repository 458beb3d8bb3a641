"""JAX's matmul precision convention, for products nvdispatch stages into a JAX program on the GPU.

JAX decides the precision of a float32 product from ``jax_default_matmul_precision`` (the config option, or
the ``jax.default_matmul_precision`` context, read when the function is traced): unset, ``"default"``,
``"bfloat16"``, ``"fastest"``, ``"high"`` and ``"tensorfloat32"`` let XLA run float32 products on TF32 tensor
cores on the GPU; ``"highest"``/``"float32"`` ask for full float32. The dot-algorithm names (``"F32_F32_F32"``,
``"TF32_TF32_F32"``, ``"BF16_BF16_F32"``...) name the compute type themselves. Where the caller gives no
``compute_type``, a staged float32/complex64 product follows this convention; an explicit ``compute_type``
always wins. CPU executors compute at least as precisely as asked, so only the GPU kernel applies it.
"""

from __future__ import annotations

import jax

from .._matmul_problem import ComputeType, MatmulOptions

__all__ = ["convention_compute_type", "with_convention"]

_TF32 = ComputeType.COMPUTE_32F_FAST_TF32
_BY_NAME = {
    None: _TF32,
    "default": _TF32,
    "bfloat16": _TF32,
    "fastest": _TF32,
    "high": _TF32,
    "tensorfloat32": _TF32,
    "bfloat16_3x": _TF32,
    "highest": ComputeType.COMPUTE_32F,
    "float32": ComputeType.COMPUTE_32F,
    "F32_F32_F32": ComputeType.COMPUTE_32F,
    "TF32_TF32_F32": _TF32,
    "TF32_TF32_F32_X3": ComputeType.COMPUTE_32F,
    "BF16_BF16_F32": ComputeType.COMPUTE_32F_FAST_16BF,
    "BF16_BF16_F32_X3": _TF32,
    "BF16_BF16_F32_X6": ComputeType.COMPUTE_32F,
    "F16_F16_F32": ComputeType.COMPUTE_32F_FAST_16F,
}
#: result dtypes whose product JAX's precision setting governs
_GOVERNED = ("float32", "complex64")


def convention_compute_type(result_dtype: str) -> ComputeType | None:
    """The compute type JAX's current precision setting asks for a product with a ``result_dtype`` result on the
    GPU; None where it asks nothing of it (other dtypes) or names an algorithm cuBLASLt has no compute type for
    (the product then runs at full precision)."""
    if result_dtype not in _GOVERNED:
        return None
    setting = jax.config.jax_default_matmul_precision
    setting = getattr(setting, "name", setting)  # a jax.lax.Precision / DotAlgorithmPreset member
    if isinstance(setting, str) and setting.lower() in _BY_NAME:
        setting = setting.lower()
    return _BY_NAME.get(setting, ComputeType.COMPUTE_32F)


def with_convention(options: MatmulOptions, result_dtype: str) -> MatmulOptions:
    """``options`` with the compute type of JAX's convention where none is given."""
    import dataclasses

    if options.compute_type is not None:
        return options
    ct = convention_compute_type(result_dtype)
    return options if ct is None else dataclasses.replace(options, compute_type=ct)
