"""``nvdispatch.matmul`` inside ``jax.jit``, under ``jax.grad`` and ``jax.vmap``.

A call whose operands include JAX tracers reaches :func:`traced_matmul` (installed by
``nvdispatch.integrations``). It validates the call with the problem builder of the eager route, applied to the
operands' abstract values (what fails eagerly fails here, at trace time, with the same typed error), brings the
operands to one canonical form (PEP 465 promotion, every operand of the result's rank: reshapes XLA makes for
free) and stages one :func:`~.jax_matmul_kernel.matmul_kernel` — nvdispatch's executors on XLA's buffers —
inside a ``jax.custom_jvp``. Its tangent is a primitive of its own, linear in the operands' tangents: forward
mode (``jax.jvp``, ``jax.jacfwd``) evaluates it as staged products and XLA operations (the epilog's derivative);
reverse mode (``jax.grad``) transposes it into a backward pass built on nvdispatch's epilogs:

* ``RELU*`` keep their result for the backward pass (``y > 0`` is the mask: the result is kept anyway, as the
  next layer's input, where a mask would be one more buffer); ``GELU*`` run as ``GELU_AUX*``, which keep the
  pre-activation; its gradient is one elementwise XLA fusion;
* the weight and bias gradients of a linear layer are one product with the ``BGRADB`` epilog (``BGRADA`` for
  a bias along M): the bias gradient comes out of the GEMM instead of a reduction over the batch;
* the backward products read transposed operands in place (no transposed copy) and are staged calls
  themselves, so they are differentiable again; ``DRELU*``/``DGELU*``, ``BGRADA``/``BGRADB``, ``c``,
  ``alpha`` and ``beta`` have their gradients too; only the gradients of operands that have a tangent are
  staged.

``jax.linear_transpose`` traces a function with unknown operands and transposes what it staged: a call met so is
staged as its tangent in those operands (linear where the call is), which transposes into the products above.

Differences from an eager call: ``relu_aux`` is a boolean mask of the result's shape on every platform (eager
GPU calls return cuBLASLt's bit mask), and ``DRELU`` takes that mask. What cannot be staged raises at trace
time, naming the argument: ``stream`` (XLA's stream is used), FP8 operands, scales and options, traced
``alpha``/``beta``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero
from jax.interpreters import ad
from jax.interpreters import partial_eval as pe

from .._backends import get_state
from .._detect import CPU
from .._epilog import INPUTS, OUTPUTS, gelu_tanh_grad, spec_of
from .._fp8_types import FP8_DTYPES
from .._matmul_problem import MatmulProblem, as_options, as_preferences, scalar_value
from .._route import log
from ..errors import EpilogInputError, InvalidArgumentError, UnsupportedDtypeError, UnsupportedOperandError, describe
from .jax_autotune import autotune_mode
from .jax_ffi import route
from .jax_linear_primitive import linear_primitive
from .jax_matmul_kernel import MatmulCall, matmul_kernel
from .jax_matmul_shapes import abstract_problem, apply_epilog, output_avals

__all__ = ["traced_matmul", "staged_product"]

#: operands of the canonical call, in the order the staged function takes them
_OPERANDS = ("a", "b", "c", "bias", "relu_aux", "gelu_aux")
#: the operands with tangents (``relu_aux`` is a mask), and what the forward pass keeps for the derivatives
_LINEAR = ("a", "b", "c", "bias", "gelu_aux")
_RESIDUALS = (*_OPERANDS, "y", "pre")
_WIDE = ("float64", "complex128", "int64", "uint64")


def traced_matmul(
    a,
    b,
    c=None,
    *,
    alpha=1,
    beta=None,
    epilog=None,
    epilog_inputs: Mapping[str, Any] | None = None,
    options=None,
    preferences=None,
    stream=None,
    quantization_scales=None,
):
    """Stage ``nvdispatch.matmul(...)`` into the JAX program being traced; returns what ``matmul`` returns,
    as JAX values."""
    if stream is not None:
        raise InvalidArgumentError(
            "stream", "None inside jax.jit/grad/vmap (the call runs on XLA's stream)", describe(stream)
        )
    if quantization_scales is not None:
        raise InvalidArgumentError(
            "quantization_scales",
            "None inside jax.jit/grad/vmap (FP8 matmuls run eagerly only)",
            describe(quantization_scales),
        )
    spec = spec_of(epilog)
    inputs = _check_inputs(epilog_inputs)
    opts, prefs = as_options(options), as_preferences(preferences)
    for field in ("result_type", "operand_types"):
        if getattr(opts, field) is not None:
            raise InvalidArgumentError(
                f"options.{field}", "None inside jax.jit/grad/vmap (an FP8 option)", repr(getattr(opts, field))
            )
    for field in ("result_amax", "fast_accumulation"):
        if getattr(opts, field):
            raise InvalidArgumentError(f"options.{field}", "False inside jax.jit/grad/vmap (an FP8 option)", "True")
    for name, value in (("alpha", alpha), ("beta", beta)):
        if isinstance(value, jax.core.Tracer):
            raise InvalidArgumentError(
                name, "a Python or NumPy number inside jax.jit/grad/vmap", describe(value), "scale the result instead"
            )
    arrays = {"a": _as_jax("a", a), "b": _as_jax("b", b)}
    if c is not None:
        arrays["c"] = _as_jax("c", c)
    for name, value in inputs.items():
        arrays[name] = _as_jax(f"epilog_inputs[{name!r}]", value)
    for name in ("a", "b"):
        if str(arrays[name].dtype) in FP8_DTYPES:
            raise UnsupportedDtypeError(
                name, "a non-FP8 dtype inside jax.jit/grad/vmap (FP8 matmuls run eagerly only)", str(arrays[name].dtype)
            )
    problem = abstract_problem("jax", CPU, arrays, spec, opts, alpha, beta)
    _check_traceable(problem, arrays)
    gpu_route, why = route()
    call = MatmulCall(
        epilog=spec.epilog.name,
        alpha=scalar_value(alpha),
        beta=None if beta is None else scalar_value(beta),
        options=opts,
        preferences=prefs,
        state=get_state(),
        gpu_route=gpu_route,
        autotune=autotune_mode(),
    )
    log.debug("matmul: staged into a traced JAX program (%s, result %s%s); on the GPU through the %s route: %s; "
              "trace-time autotuning %r", spec.epilog.name, problem.result_dtype, list(problem.result_shape),
              gpu_route, why, call.autotune)
    canonical = _canonical(problem, arrays)
    outputs = _staged(call, *(canonical.get(name) for name in _OPERANDS))
    avals = output_avals(problem)
    y = outputs[0].reshape(problem.result_shape)
    if not spec.outputs:
        return y
    return y, {name: out.reshape(avals[name].shape) for name, out in zip(spec.outputs, outputs[1:])}


# -- validation ----------------------------------------------------------------------------------------------
def _check_inputs(epilog_inputs) -> dict[str, Any]:
    if epilog_inputs is None:
        return {}
    if not isinstance(epilog_inputs, dict):
        raise EpilogInputError("epilog_inputs", "a dict of named arrays", describe(epilog_inputs))
    for key, value in epilog_inputs.items():
        if key not in INPUTS:
            raise EpilogInputError("epilog_inputs", f"keys among {', '.join(map(repr, INPUTS))}", f"key {key!r}")
        if value is None:
            raise EpilogInputError(f"epilog_inputs[{key!r}]", "an array", "None")
    return dict(epilog_inputs)


def _as_jax(name: str, x):
    """``x`` as a JAX value: tracers and JAX arrays as they are, NumPy arrays (constants of the program) converted."""
    if isinstance(x, (jax.core.Tracer, jax.Array)):
        return x
    if isinstance(x, (np.ndarray, np.generic)):
        return jnp.asarray(x)
    raise UnsupportedOperandError(name, "a JAX array, a tracer or a NumPy array inside jax.jit/grad/vmap", describe(x))


def _check_traceable(problem: MatmulProblem, arrays: dict[str, Any]) -> None:
    if "relu_aux" in arrays and str(arrays["relu_aux"].dtype) != "bool":
        raise EpilogInputError(
            "epilog_inputs['relu_aux']",
            "the boolean mask RELU_AUX returns inside jax.jit/grad/vmap",
            f"dtype {arrays['relu_aux'].dtype}",
        )
    if problem.result_dtype in _WIDE and not jax.config.jax_enable_x64:
        raise UnsupportedDtypeError(
            "b",
            f"operands whose {problem.result_dtype} result JAX can hold (enable jax_enable_x64)",
            f"{arrays['a'].dtype} and {arrays['b'].dtype}",
        )


# -- the canonical call ---------------------------------------------------------------------------------------
def _canonical(problem: MatmulProblem, arrays: dict[str, Any]) -> dict[str, Any]:
    """The operands as the kernel takes them: ``a``, ``b`` promoted (PEP 465), ``c`` broadcast to the promoted
    result, the bias as ``(..., 1, n)`` or ``(..., m, 1)``, the mask/pre-activation as the promoted result; each
    with the promoted result's rank (leading size-1 axes added, so that the axis :func:`jax.vmap` adds in front
    of every operand lines up)."""
    rank = len(problem.promoted_shape)

    def lift(x):
        return x.reshape((1,) * (rank - x.ndim) + tuple(x.shape))

    out = {
        "a": lift(arrays["a"].reshape(1, -1) if problem.a_vector else arrays["a"]),
        "b": lift(arrays["b"].reshape(-1, 1) if problem.b_vector else arrays["b"]),
    }
    if "c" in arrays:
        out["c"] = jnp.broadcast_to(arrays["c"], problem.result_shape).reshape(problem.promoted_shape)
    for name in ("bias", "relu_aux", "gelu_aux"):
        if name in arrays:
            out[name] = lift(INPUTS[name].prepare(arrays[name], problem))
    return out


# -- the staged call and its derivatives -------------------------------------------------------------------------
@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _staged(call: MatmulCall, a, b, c, bias, relu_aux, gelu_aux):
    """``call`` on canonical operands (None where absent): ``(result, *auxiliary outputs)``."""
    operands = {k: v for k, v in zip(_OPERANDS, (a, b, c, bias, relu_aux, gelu_aux)) if v is not None}
    unknown = tuple(name for name, x in operands.items() if isinstance(x, pe.JaxprTracer) and not x.is_known())
    if unknown:
        return _linear_part(call, operands, unknown)
    return matmul_kernel(call, operands)


def _linear_part(call: MatmulCall, operands: dict[str, Any], unknown: tuple[str, ...]) -> tuple:
    """The call met while JAX partially evaluates a function with ``unknown`` operands: what JAX does only to build
    a linear function (``jax.linear_transpose``), which it then transposes. Staged as the call's tangent in the
    unknown operands (:data:`_tangent_p`, whose transpose is the other product), what it is where the call is
    linear in them; refused, naming the operand, where it is not."""
    spec = spec_of(call.epilog)
    nonlinear = spec.activation is not None and not (spec.backward and "gelu_aux" not in unknown)
    for name in unknown:
        argument = name if name in ("a", "b", "c") else f"epilog_inputs[{name!r}]"
        if name not in _LINEAR or nonlinear or {"a", "b"} <= set(unknown):
            raise InvalidArgumentError(
                argument,
                "an operand the product is linear in, inside a function JAX transposes (jax.linear_transpose)",
                f"epilog {spec.epilog.name} with {' and '.join(unknown)} unknown",
                "products of two unknowns and activations (RELU*, GELU*) are not linear: use jax.vjp",
            )
    residuals = tuple(name for name in _OPERANDS if name in operands and name not in unknown)
    return tuple(
        _tangent_p.bind(
            *(operands[name] for name in residuals),
            *(operands[name] for name in unknown),
            call=call,
            residuals=residuals,
            linear=unknown,
            outputs=("out", *spec.outputs),
        )
    )


@functools.partial(_staged.defjvp, symbolic_zeros=True)
def _staged_jvp(call: MatmulCall, primals, tangents):
    """The forward pass (:func:`_forward`) and the outputs' tangents as one :data:`_tangent_p`: forward mode
    evaluates it; reverse mode transposes it into :func:`_backward`, the fused backward products."""
    outputs, residuals = _forward(call, *primals)
    spec = spec_of(call.epilog)
    names = ("out", *spec.outputs)
    moving = tuple(
        name
        for name, x, t in zip(_OPERANDS, primals, tangents)
        if name in _LINEAR and x is not None and _inexact(x) and not isinstance(t, SymbolicZero)
    )
    floating = tuple(name for name, y in zip(names, outputs) if _inexact(y))
    got = {}
    if moving and floating:
        kept = tuple(name for name, x in zip(_RESIDUALS, residuals) if x is not None)
        values = _tangent_p.bind(
            *(x for x in residuals if x is not None),
            *(t for name, t in zip(_OPERANDS, tangents) if name in moving),
            call=call,
            residuals=kept,
            linear=moving,
            outputs=floating,
        )
        got = dict(zip(floating, values))
    out_tangents = tuple(got[name] if name in got else _zero_tangent(y) for name, y in zip(names, outputs))
    return tuple(outputs), out_tangents


def _inexact(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.inexact)


def _zero_tangent(y):
    return jnp.zeros(y.shape, y.dtype) if _inexact(y) else np.zeros(y.shape, jax.dtypes.float0)


def _forward(call: MatmulCall, a, b, c, bias, relu_aux, gelu_aux):
    """The forward pass keeping what the backward needs: the result, and for ``GELU*`` the pre-activation
    (``GELU``/``GELU_BIAS`` run as ``GELU_AUX``/``GELU_AUX_BIAS`` to get it from the same GEMM)."""
    spec = spec_of(call.epilog)
    pre = None
    if spec.activation == "gelu" and not spec.backward:
        if "gelu_aux" in spec.outputs:
            outputs = _staged(call, a, b, c, bias, relu_aux, gelu_aux)
            pre = outputs[1 + spec.outputs.index("gelu_aux")]
        else:
            keeping = dataclasses.replace(call, epilog=spec.epilog.name.replace("GELU", "GELU_AUX"))
            y, pre = _staged(keeping, a, b, c, bias, relu_aux, gelu_aux)
            outputs = (y,)
    else:
        outputs = _staged(call, a, b, c, bias, relu_aux, gelu_aux)
    return outputs, (a, b, c, bias, relu_aux, gelu_aux, outputs[0], pre)


def _backward(call: MatmulCall, res: dict[str, Any], cotangents, wanted: frozenset, result, shapes) -> dict:
    """The cotangents of the ``wanted`` operands (by name: ``a``, ``b``, ``c``, ``bias``, ``gelu_aux``; absent where
    zero) from those of the outputs (None: zero) and the forward pass's residuals ``res`` (by name, among
    :data:`_RESIDUALS`; a wanted operand may be absent, as ``y`` and ``pre`` where the epilog needs neither).
    ``result``: the shape and dtype of the result; ``shapes``: the operands' (by name)."""
    a, b, c, bias, relu_aux, gelu_aux, y, pre = (res.get(name) for name in _RESIDUALS)
    spec = spec_of(call.epilog)
    dt = result.dtype
    g = cotangents[0]
    if g is None:
        g = jnp.zeros(result.shape, dt)
    aux_ct = {name: ct for name, ct in zip(spec.outputs, cotangents[1:]) if ct is not None}
    bgrad = next((name for name in spec.outputs if OUTPUTS[name].kind == "bias_gradient"), None)
    if bgrad in aux_ct:  # the result also feeds its own sum
        summed = aux_ct[bgrad]
        g = g + (jnp.expand_dims(summed, -2) if call.options.bgrad_axis == "n" else summed).astype(dt)
    zero = jnp.zeros((), dt)
    got = {}
    # dz: the cotangent of z, the value the epilog's activation (or its derivative) is applied to
    if spec.backward and spec.activation == "relu":
        dz = jnp.where(relu_aux, g, zero)
    elif spec.backward:  # DGELU: y = z * gelu'(gelu_aux)
        dz = (g * _gelu_first(gelu_aux)).astype(dt)
        if "gelu_aux" in wanted:
            z = _staged(dataclasses.replace(call, epilog="DEFAULT"), a, b, c, None, None, None)[0]
            got["gelu_aux"] = (g * z * _gelu_second(gelu_aux)).astype(gelu_aux.dtype)
    elif spec.activation == "relu":
        dz = jnp.where(y > 0, g, zero)
    elif spec.activation == "gelu":
        dz = (g * _gelu_first(pre)).astype(dt)
        if "gelu_aux" in aux_ct:
            dz = dz + aux_ct["gelu_aux"].astype(dt)
    else:
        dz = g
    along_n = None if "bias" not in wanted else shapes["bias"][-2] == 1 and shapes["bias"][-1] == dz.shape[-1]
    got.update(_product_grads(call, a, b, dz, wanted, along_n))
    for name, axis in (("a", -1), ("b", -2)):  # an operand's sum: its cotangent added once, not per batch
        if name in got:
            got[name] = _sum_to(got[name], shapes[name])
            if f"bgrad{name}" in aux_ct:
                summed = jnp.expand_dims(aux_ct[f"bgrad{name}"], axis)
                got[name] = got[name] + jnp.broadcast_to(summed, got[name].shape).astype(got[name].dtype)
    if "c" in wanted:
        got["c"] = dz * (1 if call.beta is None else call.beta)
    return got


# -- the tangent primitive ----------------------------------------------------------------------------------------
def _tangent_abstract(*args, call: MatmulCall, residuals, linear, outputs):
    # an operand that is no residual (an unknown of a linear function, :func:`_linear_part`): its tangent's shape
    signature = tuple((name, tuple(x.shape), np.dtype(x.dtype)) for name, x in zip(residuals, args))
    signature += tuple(
        (name, tuple(x.shape), np.dtype(x.dtype))
        for name, x in zip(linear, args[len(residuals) :])
        if name not in residuals
    )
    return _output_shapes(call, signature, outputs)


@functools.lru_cache(maxsize=256)
def _output_shapes(call: MatmulCall, signature: tuple, outputs: tuple[str, ...]) -> list:
    """The shapes and dtypes of the outputs named ``outputs`` of ``call`` on operands of ``signature`` (name,
    shape, dtype): the staged call's (remembered: each differentiated call binds its tangent again)."""
    ops = {name: jax.ShapeDtypeStruct(shape, dtype) for name, shape, dtype in signature if name in _OPERANDS}
    spec = spec_of(call.epilog)
    avals = output_avals(abstract_problem("jax", CPU, ops, spec, call.options, call.alpha, call.beta, call.transpose))
    return [jax.core.ShapedArray(avals[name].shape, np.dtype(avals[name].dtype)) for name in outputs]


def _tangent_values(*args, call: MatmulCall, residuals, linear, outputs):
    """The tangents of the outputs named ``outputs`` from those of the ``linear`` operands: the product's tangent
    ``alpha (op(da) op(b) + op(a) op(db)) + beta dc`` as staged products, pushed through the epilog's XLA form
    (``jax.jvp`` of :func:`~.jax_matmul_shapes.apply_epilog`)."""
    res = dict(zip(residuals, args))
    tan = dict(zip(linear, args[len(residuals) :]))
    spec = spec_of(call.epilog)
    # an operand that is no residual (a linear function's unknown) is described, and stood in for where the epilog's
    # jvp reads a primal, by its tangent (zeros)
    known = res.keys() | tan.keys()
    ops = {name: res[name] if name in res else jnp.zeros_like(tan[name]) for name in _OPERANDS if name in known}
    problem = abstract_problem("jax", CPU, ops, spec, call.options, call.alpha, call.beta, call.transpose)
    dt = jnp.dtype(problem.result_dtype)
    plain = dataclasses.replace(call, epilog="DEFAULT", beta=None)

    def product(x, y):  # alpha op(x) op(y)
        return _staged(plain, x, y, None, None, None, None)[0].astype(dt)

    beta = 1 if call.beta is None else call.beta
    a, b = ops["a"], ops["b"]
    terms = ([product(tan["a"], b)] if "a" in tan else []) + ([product(a, tan["b"])] if "b" in tan else [])
    if "c" in tan:
        terms.append((beta * tan["c"]).astype(dt))
    dd = functools.reduce(jnp.add, terms) if terms else jnp.zeros(problem.promoted_shape, dt)
    # the epilog reads the product itself only where it is not affine in it
    if spec.activation is not None and not (spec.backward and "gelu_aux" not in tan):
        d = product(a, b)
        if "c" in ops:
            d = d + (beta * ops["c"]).astype(dt)
        d, dd = _together(d, dd)
    else:
        d = jnp.zeros_like(dd)
    fixed = {name: ops[name] for name in ("relu_aux",) if name in ops}
    moving = {name: ops[name] for name in ("bias", "gelu_aux") if name in ops}

    def epilog(d, la, lb, inputs):
        return apply_epilog(problem, d, la, lb, {**inputs, **fixed})

    la, lb = _read(a, call.transpose_a), _read(b, call.transpose_b)
    la, dla = _together(la, _read(tan["a"], call.transpose_a) if "a" in tan else jnp.zeros_like(la))
    lb, dlb = _together(lb, _read(tan["b"], call.transpose_b) if "b" in tan else jnp.zeros_like(lb))
    pairs = {name: _together(x, tan[name] if name in tan else jnp.zeros_like(x)) for name, x in moving.items()}
    moving, dmoving = {n: p[0] for n, p in pairs.items()}, {n: p[1] for n, p in pairs.items()}
    _, got = jax.jvp(epilog, (d, la, lb, moving), (dd, dla, dlb, dmoving))
    got = dict(zip(("out", *spec.outputs), got))
    want = _tangent_abstract(*args, call=call, residuals=residuals, linear=linear, outputs=outputs)
    return [jnp.broadcast_to(got[name], aval.shape).astype(aval.dtype) for name, aval in zip(outputs, want)]


def _together(x, t):
    """A primal and its tangent broadcast to one shape (under ``jax.vmap`` either may lack the batch)."""
    shape = jnp.broadcast_shapes(x.shape, t.shape)
    return jnp.broadcast_to(x, shape), jnp.broadcast_to(t, shape)


def _read(x, transposed: bool):
    return jnp.swapaxes(x, -1, -2) if transposed else x


def _tangent_transpose(cts, *args, call: MatmulCall, residuals, linear, outputs):
    """The transpose: :func:`_backward` (the fused backward products) on the residuals, for the linear operands
    JAX transposes (undefined)."""
    res = dict(zip(residuals, args))
    spec = spec_of(call.epilog)
    given = {name: None if isinstance(ct, ad.Zero) else ct for name, ct in zip(outputs, cts)}
    undefined = {name: x for name, x in zip(linear, args[len(residuals) :]) if ad.is_undefined_primal(x)}
    avals = [x.aval if ad.is_undefined_primal(x) else x for x in args]
    result = _tangent_abstract(*avals, call=call, residuals=residuals, linear=linear, outputs=("out",))[0]
    got = {}
    if any(ct is not None for ct in given.values()):
        cotangents = [given.get(n) for n in ("out", *spec.outputs)]
        shapes = {name: x.shape for name, x in zip((*residuals, *linear), avals)}
        got = _backward(call, res, cotangents, frozenset(undefined), result, shapes)
    out = [None] * len(args)
    for i, (name, x) in enumerate(zip(linear, args[len(residuals) :]), start=len(residuals)):
        if name in undefined:
            aval = x.aval
            ct = got.get(name)
            out[i] = ad.Zero(aval.to_ct_aval()) if ct is None else _sum_to(ct, aval.shape).astype(aval.dtype)
    return out


def _tangent_jvp(primals, tangents, **params):
    """Forward mode over a tangent (second derivatives): its XLA form differentiated."""
    tangents = [ad.instantiate_zeros(t) for t in tangents]
    return jax.jvp(lambda *xs: _tangent_values(*xs, **params), tuple(primals), tuple(tangents))


def _tangent_batched(args, dims, *, call: MatmulCall, residuals, linear, outputs):
    """The batch axis in front of every operand, each broadcast along it (an auxiliary output's tangent may be
    batched by a tangent alone, e.g. a sum over ``b`` whose tangent only is batched)."""
    size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
    moved = [
        jnp.broadcast_to(x, (size, *x.shape)) if d is None else jnp.moveaxis(x, d, 0) for x, d in zip(args, dims)
    ]
    outs = _tangent_p.bind(*moved, call=call, residuals=residuals, linear=linear, outputs=outputs)
    return outs, [0] * len(outs)


#: the outputs' tangents of a staged call (residuals, then the tangents of the ``linear`` operands): linear in
#: the latter; transposed by the fused backward products, evaluated (forward mode) as staged products and XLA
#: operations
_tangent_p = linear_primitive(
    "nvdispatch_matmul_tangent", _tangent_values, _tangent_abstract, _tangent_jvp, _tangent_transpose, _tangent_batched
)


def staged_product(call: MatmulCall, a, b, *, bias=None, relu_aux=None, gelu_aux=None) -> tuple:
    """``call`` (its epilog, transposes, options, backend state and GPU route) staged on operands already in
    canonical form: 2-D ``a``/``b`` as stored (read transposed where ``call`` says), ``bias`` ``(1, n)``, the
    mask/pre-activation of the result's ``(m, n)`` shape. Returns ``(result, *auxiliary outputs)``; differentiable
    (the staged call's VJP). For integrations that stage chains of products themselves (:mod:`.jax_mlp`): the
    same kernel, plans and routes as :func:`traced_matmul`'s calls, without its validation."""
    return _staged(call, a, b, None, bias, relu_aux, gelu_aux)


def _gelu_first(x):
    """The derivative of GELU's tanh approximation, computed in float32 at least (XLA fuses it)."""
    return gelu_tanh_grad(x.astype(jnp.promote_types(x.dtype, jnp.float32)), jnp)


def _gelu_second(x):
    """The second derivative of GELU's tanh approximation, elementwise (JAX differentiates the first)."""
    first = jax.grad(lambda v: gelu_tanh_grad(v, jnp))
    flat = x.reshape(-1).astype(jnp.promote_types(x.dtype, jnp.float32))
    return jax.vmap(first)(flat).reshape(x.shape)


def _mm(call: MatmulCall, x, tx: bool, y, ty: bool, epilog: str):
    """``alpha op(x) @ op(y)`` staged, ``op`` swapping the last two axes where asked (read in place), with
    ``epilog`` (``DEFAULT``, or a bias-gradient epilog for the backward pass)."""
    product = dataclasses.replace(call, epilog=epilog, beta=None, transpose_a=tx, transpose_b=ty)
    return _staged(product, x, y, None, None, None, None)


def _product_grads(call: MatmulCall, a, b, dz, wanted: frozenset, along_n: bool | None) -> dict[str, Any]:
    """The ``wanted`` gradients among ``a``'s, ``b``'s and the bias's (``along_n``: its orientation, None where it
    is not wanted) from ``dz``, the cotangent of ``alpha op(a) @ op(b) (+ bias)``: ``op(a)`` gets
    ``alpha dz op(b)^T``, ``op(b)`` gets ``alpha op(a)^T dz`` (each computed directly in the stored orientation of
    its operand, not summed over broadcast axes); the bias gradient, a sum of ``dz`` over M (over N for a bias
    along M), comes out of one of these products as its ``BGRADB``/``BGRADA`` epilog (the product staged for it
    alone where its operand's gradient is not wanted)."""
    ta, tb = call.transpose_a, call.transpose_b
    got = {}
    # b's gradient: op(a)^T dz, or its transpose dz^T op(a) where b is stored transposed
    if "b" in wanted or along_n is True:
        if not tb:
            out = _mm(call, a, not ta, dz, False, "BGRADB" if along_n else "DEFAULT")
        else:
            out = _mm(call, dz, True, a, ta, "BGRADA" if along_n else "DEFAULT")
        if "b" in wanted:
            got["b"] = out[0]
        if along_n:
            got["bias"] = out[1].reshape((*dz.shape[:-2], 1, dz.shape[-1]))
    # a's gradient: dz op(b)^T, or its transpose op(b) dz^T where a is stored transposed
    if "a" in wanted or along_n is False:
        if not ta:
            out = _mm(call, dz, False, b, not tb, "BGRADA" if along_n is False else "DEFAULT")
        else:
            out = _mm(call, b, tb, dz, True, "BGRADB" if along_n is False else "DEFAULT")
        if "a" in wanted:
            got["a"] = out[0]
        if along_n is False:
            got["bias"] = out[1].reshape((*dz.shape[:-2], dz.shape[-2], 1))
    return got


def _sum_to(x, shape):
    """``x`` summed over the axes along which ``shape`` (of the same rank) is broadcast (1 against more)."""
    axes = tuple(i for i, (have, want) in enumerate(zip(x.shape, shape)) if want == 1 and have != 1)
    return jnp.sum(x, axis=axes, keepdims=True) if axes else x
