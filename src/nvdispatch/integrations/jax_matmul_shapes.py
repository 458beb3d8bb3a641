"""What a staged matmul returns, from the problem builder the eager route uses, on abstract values.

:func:`abstract_problem` runs ``_matmul_problem.build_problem`` on the shapes and dtypes of JAX values (tracers
have no memory; XLA's buffers are C-contiguous), so a traced call is validated exactly as an eager one.
:func:`output_avals` gives the result and auxiliary outputs as the epilog table's steps make them on the promoted
result (the NumPy executor's formats: ``relu_aux`` a boolean mask of the result's shape, bias gradients summed
over M or N, operand sums over K), by running those steps abstractly (:func:`jax.eval_shape`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from .._detect import Device, OperandInfo
from .._epilog import GELU_C, GELU_K, INPUTS, OUTPUTS, EpilogSpec, apply_steps, gelu_tanh_grad
from .._matmul_problem import MatmulOptions, MatmulProblem, build_problem
from .._memory import plain_memory
from .._strides import c_strides
from ..errors import PlanStateError

__all__ = [
    "abstract_problem",
    "output_avals",
    "transposed",
    "JaxEpilogOps",
    "apply_epilog",
    "product_on_values",
    "check_orientation",
]


def transposed(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shape and strides of the view swapping the last two axes."""
    return (*shape[:-2], shape[-1], shape[-2]), (*strides[:-2], strides[-1], strides[-2])


def abstract_problem(
    framework: str,
    device: Device,
    arrays: dict[str, Any],
    spec: EpilogSpec,
    options: MatmulOptions,
    alpha: Any,
    beta: Any,
    transpose: tuple[bool, bool] = (False, False),
    views: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] | None = None,
) -> MatmulProblem:
    """The :class:`MatmulProblem` of a call on ``arrays`` (anything with ``shape`` and ``dtype``: tracers,
    :class:`jax.ShapeDtypeStruct`, XLA's buffers), read as C-contiguous; ``transpose`` says whether ``a``/``b``
    are read transposed (the last two axes swapped, in place), ``views`` gives the (shape, strides) other
    operands are read with instead."""
    infos = {}
    for name, x in arrays.items():
        shape = tuple(int(d) for d in x.shape)
        strides = c_strides(shape)
        if name in ("a", "b") and transpose[name == "b"]:
            shape, strides = transposed(shape, strides)
        if views and name in views:
            shape, strides = views[name]
        dtype = jnp.dtype(x.dtype).name
        infos[name] = OperandInfo(None, framework, device, dtype, shape, strides, memory=plain_memory(device))
    names = tuple(n for n in arrays if n in INPUTS)
    return build_problem(framework, device, infos, spec, options, alpha, beta, names)


class JaxEpilogOps:
    """The epilog step vocabulary (``_epilog.apply_steps``) on JAX values, out of place, with the semantics
    ``_epilog`` documents. It gives the outputs' shapes and dtypes (:func:`output_avals`, run abstractly) and the
    results of zero-size products (nothing to compute: no kernel is staged). Reductions of float16/bfloat16
    accumulate in float32 and round once; they return ``dtype``."""

    def __init__(self, dtype):
        self.dtype = jnp.dtype(dtype)

    @staticmethod
    def add_(d, x):
        return (d + x).astype(d.dtype)

    @staticmethod
    def relu_(d):
        return jnp.maximum(d, jnp.zeros((), d.dtype))  # keeps NaN

    @staticmethod
    def positive_mask(d):
        return d > 0

    @staticmethod
    def gelu_(d):
        wide = d.astype(jnp.promote_types(d.dtype, jnp.float32))
        return (0.5 * wide * (1.0 + jnp.tanh(GELU_K * (wide + GELU_C * wide**3)))).astype(d.dtype)

    @staticmethod
    def copy(d):
        return d

    @staticmethod
    def mask_(d, mask):
        return jnp.where(mask, d, jnp.zeros((), d.dtype))

    @staticmethod
    def mul_(d, x):
        return (d * x).astype(d.dtype)

    @staticmethod
    def gelu_grad(x):
        return gelu_tanh_grad(x.astype(jnp.promote_types(x.dtype, jnp.float32)), jnp)

    def sum(self, x, axis, keepdims):
        wide = jnp.promote_types(self.dtype, jnp.float32) if self.dtype.itemsize < 4 else self.dtype
        return jnp.sum(x, axis=axis, keepdims=keepdims, dtype=wide).astype(self.dtype)


def output_avals(problem: MatmulProblem) -> dict[str, jax.ShapeDtypeStruct]:
    """``{"out": ..., aux name: ...}``: shape and dtype of the result and each auxiliary output of ``problem``."""
    spec, dt = problem.epilog, problem.result_dtype
    pa = (1, *problem.a.shape) if problem.a_vector else tuple(problem.a.shape)
    pb = (*problem.b.shape, 1) if problem.b_vector else tuple(problem.b.shape)

    def steps(d, a, b, inputs):
        prepared = {name: INPUTS[name].prepare(x, problem) for name, x in inputs.items()}
        return apply_steps(spec, d, prepared, JaxEpilogOps(dt), a=a, b=b, bgrad_axis=problem.options.bgrad_axis)[1]

    inputs = {name: jax.ShapeDtypeStruct(sig.shape, sig.dtype) for name, sig in problem.inputs}
    d = jax.ShapeDtypeStruct(problem.promoted_shape, dt)
    aux = jax.eval_shape(steps, d, jax.ShapeDtypeStruct(pa, dt), jax.ShapeDtypeStruct(pb, dt), inputs)
    avals = {"out": jax.ShapeDtypeStruct(problem.result_shape, dt)}
    for name in spec.outputs:
        got = aux[name]
        shape = problem.result_shape if OUTPUTS[name].like_result else got.shape
        avals[name] = jax.ShapeDtypeStruct(shape, got.dtype)
    return avals


def apply_epilog(problem: MatmulProblem, d, a, b, inputs: dict) -> tuple:
    """``(result, *auxiliary outputs)``: ``problem``'s epilog applied with XLA operations to ``d``, the promoted
    product ``alpha a@b + beta c`` (``a``/``b`` as :func:`abstract_problem` reads them, the epilog inputs by name)."""
    dt = problem.result_dtype
    pa = a.reshape(1, -1) if problem.a_vector else a
    pb = b.reshape(-1, 1) if problem.b_vector else b
    prepared = {name: INPUTS[name].prepare(x, problem) for name, x in inputs.items()}
    ops, axis = JaxEpilogOps(dt), problem.options.bgrad_axis
    y, aux = apply_steps(problem.epilog, d.astype(dt), prepared, ops, a=pa, b=pb, bgrad_axis=axis)
    return (y.reshape(problem.result_shape), *(aux[name] for name in problem.epilog.outputs))


def product_on_values(problem: MatmulProblem, a, b, c, alpha, beta):
    """The promoted product ``alpha a@b + beta c`` with XLA operations (zero-size products: nothing to compute)."""
    dt = problem.result_dtype
    pa = a.reshape(1, -1) if problem.a_vector else a
    pb = b.reshape(-1, 1) if problem.b_vector else b
    d = alpha * jnp.matmul(pa.astype(dt), pb.astype(dt))
    if c is not None:
        d = d + (1 if beta is None else beta) * jnp.broadcast_to(c, problem.result_shape).reshape(d.shape)
    return d.astype(dt)


def check_orientation(plan, orientation: str) -> None:
    """Refuse a cuBLASLt plan whose orientation is not the one the program was traced with (its output layouts
    are the program's buffers)."""
    if plan.setup.orientation != orientation:
        raise PlanStateError(
            "plan",
            f"cuBLASLt's {orientation} orientation (the layouts the program was traced with)",
            f"the {plan.setup.orientation} orientation",
            "cuBLASLt has no fused kernel for this case in that orientation",
        )
