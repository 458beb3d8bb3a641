"""JAX's matmul precision convention, for products nvdispatch stages into a JAX program on the GPU.

The convention is the JAX adapter's (:mod:`nvdispatch._adapters.jax`, one table for eager and staged calls
alike): ``jax_default_matmul_precision`` (the config option, or the ``jax.default_matmul_precision`` context,
read here when the function is traced) gives a float32/complex64 product the compute type XLA gives it on an
NVIDIA GPU: TF32 for DEFAULT (unset) and HIGH, float32 for HIGHEST, what a ``jax.lax.DotAlgorithmPreset`` names.
Where the caller gives no ``compute_type``, a staged product follows it; an explicit ``compute_type`` always wins.
CPU executors compute at least as precisely as asked, so only the GPU kernel applies it.
"""

from __future__ import annotations

import dataclasses

from .._adapters.jax import default_matmul_precision, float32_compute_type
from .._matmul_problem import ComputeType, MatmulOptions
from .._precision import GOVERNED_BY_FLOAT32

__all__ = ["convention_compute_type", "with_convention"]


def convention_compute_type(result_dtype: str) -> ComputeType | None:
    """The compute type JAX's current precision setting asks for a product with a ``result_dtype`` result on the
    GPU; None where it asks nothing of it (other dtypes than float32 and complex64)."""
    if result_dtype not in GOVERNED_BY_FLOAT32:
        return None
    name, _ = float32_compute_type(default_matmul_precision())
    return ComputeType[name]


def with_convention(options: MatmulOptions, result_dtype: str) -> MatmulOptions:
    """``options`` with the compute type of JAX's convention where none is given."""
    if options.compute_type is not None:
        return options
    ct = convention_compute_type(result_dtype)
    return options if ct is None else dataclasses.replace(options, compute_type=ct)
