"""A JAX multi-layer perceptron whose forward *and* backward GEMMs all run nvdispatch's fused epilogs.

:func:`fused_mlp` is the JAX twin of :func:`nvdispatch.integrations.torch_mlp.fused_mlp`: linear layers
``h_i = act(h_{i-1} @ W_i + b_i)`` (the last without activation) under one ``jax.custom_vjp`` over the whole
chain. Differentiating one layer at a time (``nvdispatch.matmul`` under ``jax.grad``) fuses only half of a
layer's backward: its activation's derivative multiplies the GEMM that belongs to the next layer. The chain
owns both, so each GEMM carries its elementwise work in its epilog (which one: :mod:`.mlp_epilogs`):

* forward: ``GELU_AUX_BIAS`` (the pre-activation kept) / ``RELU_BIAS`` per hidden layer, ``BIAS`` for the last;
* backward, per layer: the weight and bias gradients from one ``BGRADB`` GEMM (``h_{i-1}^T`` read in place);
  the upstream gradient from one ``DGELU`` GEMM on the kept pre-activation, or for ReLU a plain GEMM masked by
  ``h_{i-1} > 0`` in XLA (``relu_backward="drelu"``: ``RELU_AUX_BIAS`` forward and a ``DRELU`` GEMM instead).

Every GEMM is a staged call of :mod:`.jax_matmul` (:func:`~.jax_matmul.staged_product`): the same kernels, plans,
plan cache and GPU routes as ``nvdispatch.matmul`` inside ``jax.jit``; on the CPU the host kernel runs
nvdispatch's CPU path. Eager calls run the chain as one jitted program (traced once per shapes and options).
Under :func:`jax.vmap` the forward folds a batch axis of ``x`` alone into the GEMMs' rows (the layers act
row by row); other batchings (batched weights, batched cotangents) batch each staged GEMM. Gradients are
those of the same model written with ``jnp.dot`` (GELU: the tanh approximation, as cuBLASLt's). First
derivatives only: differentiating the chain's gradient again is a typed error at trace time
(:class:`~nvdispatch.errors.UnsupportedOperandError`), and forward mode (``jax.jvp``) is not defined (a
``custom_vjp``).

Examples
--------
>>> import jax, jax.numpy as jnp
>>> from nvdispatch.integrations.jax_mlp import fused_mlp
>>> k = jax.random.split(jax.random.key(0), 3)
>>> ws = [jax.random.normal(k[0], (8, 16)) / 3, jax.random.normal(k[1], (16, 4)) / 4]
>>> bs = [jnp.zeros(16), jnp.zeros(4)]
>>> x = jax.random.normal(k[2], (32, 8))
>>> loss = lambda ws, bs: jnp.mean(fused_mlp(x, ws, bs, activation="gelu") ** 2)
>>> dws, dbs = jax.jit(jax.grad(loss, argnums=(0, 1)))(ws, bs)
>>> [g.shape for g in dws], [g.shape for g in dbs]
([(8, 16), (16, 4)], [(16,), (4,)])
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from .._backends import get_state
from .._matmul_problem import as_options, as_preferences
from .._route import log
from ..errors import ShapeMismatchError, UnsupportedDtypeError, UnsupportedOperandError, describe
from .jax_ffi import route
from .jax_matmul import staged_product
from .jax_matmul_kernel import MatmulCall
from .mlp_epilogs import WEIGHT_GRADIENT, LayerEpilogs, chain_epilogs, check_activation

__all__ = ["fused_mlp"]

_DTYPES = ("float16", "bfloat16", "float32", "float64")


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class _Wanted:
    """Which gradients a backward pass computes: ``x``'s, and each layer's weight and bias. Static (no leaves):
    it travels with the residuals as part of their structure."""

    x: bool
    layers: tuple[bool, ...]


@dataclasses.dataclass(frozen=True)
class _Chain:
    """The static part of a chain: its layers' epilogs, what every staged GEMM of it shares and, for a backward
    pass, which gradients it computes (None: all)."""

    layers: tuple[LayerEpilogs, ...]
    base: MatmulCall
    wanted: _Wanted | None = None

    def call(self, epilog: str, transpose_a: bool = False, transpose_b: bool = False) -> MatmulCall:
        return dataclasses.replace(self.base, epilog=epilog, transpose_a=transpose_a, transpose_b=transpose_b)


def fused_mlp(x, weights: Sequence, biases: Sequence, activation: str = "relu", *, relu_backward: str = "mask",
              options=None, preferences=None):
    """``x`` through linear layers ``x @ weights[i] + biases[i]``, ``activation`` after every layer but the last,
    each GEMM of the forward and backward pass one fused nvdispatch call (see the module notes).

    Parameters
    ----------
    x : jax.Array or numpy.ndarray
        ``(..., weights[0].shape[0])``, a floating dtype (float16, bfloat16, float32; float64 with
        ``jax_enable_x64``); the leading axes are the GEMMs' rows.
    weights, biases : sequences of arrays
        ``weights[i]`` of shape ``(in_i, out_i)`` with ``in_{i+1} == out_i``, ``biases[i]`` of shape ``(out_i,)``;
        every array of ``x``'s dtype.
    activation : {"relu", "gelu"}
        Between layers (GELU: the tanh approximation).
    relu_backward : {"mask", "drelu"}
        How a ReLU chain's backward applies the derivative: a plain GEMM masked by the layer's output in XLA, or
        cuBLASLt's ``DRELU`` epilog on the mask a ``RELU_AUX_BIAS`` forward keeps. Ignored for GELU.
    options, preferences : MatmulOptions / MatmulPlanPreferences or dicts, optional
        As ``nvdispatch.matmul``'s, for every GEMM of the chain.

    Returns
    -------
    jax.Array
        ``(..., weights[-1].shape[1])``, ``x``'s dtype.

    Raises
    ------
    InvalidArgumentError
        ``activation``/``relu_backward`` unknown; ``ShapeMismatchError`` (naming ``weights[i]``/``biases[i]``)
        where the shapes do not chain.
    UnsupportedOperandError, UnsupportedDtypeError
        An operand that is not a JAX/NumPy array, or not of ``x``'s floating dtype.

    Examples
    --------
    >>> import numpy as np
    >>> from nvdispatch.integrations.jax_mlp import fused_mlp
    >>> rng = np.random.default_rng(0)
    >>> w = [rng.standard_normal((4, 8), dtype=np.float32), rng.standard_normal((8, 2), dtype=np.float32)]
    >>> b = [np.zeros(8, np.float32), np.zeros(2, np.float32)]
    >>> x = rng.standard_normal((5, 4), dtype=np.float32)
    >>> y = fused_mlp(x, w, b, activation="relu")
    >>> bool(np.allclose(y, np.maximum(x @ w[0] + b[0], 0) @ w[1] + b[1], atol=1e-5))
    True
    """
    activation, relu_backward = check_activation(activation, relu_backward)
    x, weights, biases = _checked(x, weights, biases)
    gpu_route, why = route()
    base = MatmulCall(epilog="DEFAULT", options=as_options(options), preferences=as_preferences(preferences),
                      state=get_state(), gpu_route=gpu_route)
    chain = _Chain(chain_epilogs(len(weights), activation, relu_backward), base)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("fused_mlp: %d layers %s, forward %s, backward %s + %s per layer; on the GPU through the %s route: "
                  "%s", len(weights), [tuple(w.shape) for w in weights], [layer.forward for layer in chain.layers],
                  WEIGHT_GRADIENT, [layer.derivative for layer in chain.layers[:-1]], gpu_route, why)
    return _jitted(chain, x, weights, biases)


# -- validation ----------------------------------------------------------------------------------------------
def _as_jax(name: str, value):
    if isinstance(value, (jax.core.Tracer, jax.Array)):
        return value
    if isinstance(value, (np.ndarray, np.generic)):
        return jnp.asarray(value)
    raise UnsupportedOperandError(name, "a JAX array, a tracer or a NumPy array", describe(value))


def _checked(x, weights, biases):
    for name, seq in (("weights", weights), ("biases", biases)):
        if isinstance(seq, (str, bytes)) or not isinstance(seq, Sequence):
            raise UnsupportedOperandError(name, "a list or tuple of arrays", describe(seq))
    if not weights:
        raise ShapeMismatchError("weights", "at least one weight", "an empty sequence")
    if len(biases) != len(weights):
        raise ShapeMismatchError("biases", f"{len(weights)} biases, one per weight", f"{len(biases)}")
    x = _as_jax("x", x)
    dtype = str(x.dtype)
    if dtype not in _DTYPES:
        raise UnsupportedDtypeError("x", f"a floating dtype among {', '.join(_DTYPES)}", dtype)
    if x.ndim < 1:
        raise ShapeMismatchError("x", "an array of at least 1 dimension (..., features)", f"shape {tuple(x.shape)}")
    ws, bs = [], []
    width = x.shape[-1]
    for i, (w, b) in enumerate(zip(weights, biases)):
        w, b = _as_jax(f"weights[{i}]", w), _as_jax(f"biases[{i}]", b)
        for name, value in ((f"weights[{i}]", w), (f"biases[{i}]", b)):
            if str(value.dtype) != dtype:
                raise UnsupportedDtypeError(name, f"x's dtype {dtype}", str(value.dtype))
        if w.ndim != 2 or w.shape[0] != width:
            raise ShapeMismatchError(f"weights[{i}]", f"shape ({width}, out)", f"shape {tuple(w.shape)}")
        if tuple(b.shape) != (w.shape[1],):
            raise ShapeMismatchError(f"biases[{i}]", f"shape ({w.shape[1]},)", f"shape {tuple(b.shape)}")
        ws.append(w)
        bs.append(b)
        width = w.shape[1]
    return x, tuple(ws), tuple(bs)


# -- the chain -----------------------------------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnums=0)
def _jitted(chain: _Chain, x, weights, biases):
    rows = x.reshape(-1, x.shape[-1])
    y = _chain(chain, rows, weights, biases)
    return y.reshape(*x.shape[:-1], y.shape[-1])


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _chain(chain: _Chain, x, weights, biases):
    """The chain on 2-D ``x``: its output."""
    return _folded_forward(chain)(x, weights, biases)[0]


def _chain_forward(chain: _Chain, x, weights, biases):
    """The forward pass; the residuals say which gradients are wanted (``symbolic_zeros``: JAX tells which inputs
    are differentiated), so the backward stages no GEMM whose result nothing uses (``dx`` of a model's input)."""
    wanted = _Wanted(x.perturbed, tuple(w.perturbed or b.perturbed for w, b in zip(weights, biases)))
    x, weights, biases = _first_order_only((x.value, tuple(w.value for w in weights), tuple(b.value for b in biases)))
    y, saved = _folded_forward(chain)(x, weights, biases)
    return y, (weights, saved, wanted)


def _chain_backward(chain: _Chain, residuals, g):
    weights, (inputs, auxes), wanted = residuals
    if isinstance(g, SymbolicZero):  # the output's cotangent is zero: so is every gradient
        return None, (None,) * len(weights), (None,) * len(weights)
    weights, inputs, auxes, g = _first_order_only((weights, inputs, auxes, g))
    dx, dws, dbs = _batchable_backward(dataclasses.replace(chain, wanted=wanted))(weights, inputs, auxes, g)
    return dx, dws, dbs
@jax.custom_jvp
def _first_order_only(values):
    """``values`` as they are; differentiating through it (the chain's forward or backward pass differentiated
    again: a second derivative) is a typed error at trace time."""
    return values


@_first_order_only.defjvp
def _refuse_second_order(primals, tangents):
    raise UnsupportedOperandError(
        "fused_mlp", "first derivatives only (jax.grad, jax.vjp, jax.jacrev of the chain)",
        "a second derivative (the chain's gradient differentiated again)",
        "write the model with nvdispatch.matmul per layer, whose gradients are differentiable again")


_chain.defvjp(_chain_forward, _chain_backward, symbolic_zeros=True)


@functools.lru_cache(maxsize=64)
def _folded_forward(chain: _Chain):
    """:func:`_forward` of ``chain`` whose :func:`jax.vmap` folds a batch axis of ``x`` alone into its rows."""

    @jax.custom_batching.custom_vmap
    def forward(x, weights, biases):
        return _forward(chain, x, weights, biases)

    @forward.def_vmap
    def _batched(axis_size, in_batched, x, weights, biases):
        x_batched, w_batched, b_batched = in_batched
        if x_batched and not any(w_batched) and not any(b_batched):
            log.debug("fused_mlp: vmap of %d over x alone folded into the rows", axis_size)
            y, saved = forward(x.reshape(-1, x.shape[-1]), weights, biases)
            unfold = lambda v: v.reshape(axis_size, -1, *v.shape[1:])  # noqa: E731
            out = (unfold(y), jax.tree_util.tree_map(unfold, saved))
        else:  # batched weights: each staged GEMM batched (cuBLASLt's batch on the GPU)
            along = lambda flags: [0 if f else None for f in flags]  # noqa: E731
            axes = (0 if x_batched else None, along(w_batched), along(b_batched))
            out = jax.vmap(functools.partial(_forward, chain), in_axes=axes, axis_size=axis_size)(
                x, list(weights), list(biases)
            )
        return out, jax.tree_util.tree_map(lambda _: True, out)

    return forward


@functools.lru_cache(maxsize=64)
def _batchable_backward(chain: _Chain):
    """:func:`_backward` of ``chain`` whose :func:`jax.vmap` maps every row-shaped argument (layer inputs, kept
    auxiliary outputs, the cotangent) along the batch axis when any argument has one: a fused GEMM's epilog input
    is then always batched with the GEMM's operand (``DGELU``'s pre-activation with the upstream gradient)."""

    @jax.custom_batching.custom_vmap
    def backward(weights, inputs, auxes, g):
        return _backward(chain, weights, inputs, auxes, g)

    @backward.def_vmap
    def _batched(axis_size, in_batched, weights, inputs, auxes, g):
        w_batched, *_ = in_batched

        def spread(value, batched):
            return value if batched else jnp.broadcast_to(value, (axis_size, *value.shape))

        rows = jax.tree_util.tree_map(spread, (inputs, auxes, g), tuple(in_batched[1:]))
        axes = ([0 if f else None for f in w_batched], 0, 0, 0)
        log.debug("fused_mlp: backward mapped over a batch of %d (weights batched: %s)", axis_size, list(w_batched))
        out = jax.vmap(functools.partial(_backward, chain), in_axes=axes, axis_size=axis_size)(list(weights), *rows)
        return out, jax.tree_util.tree_map(lambda _: True, out)

    return backward


def _forward(chain: _Chain, x, weights, biases):
    """``(y, (inputs, auxes))``: the output, each layer's input (``x``, then the hidden outputs) and the auxiliary
    output each layer's forward keeps for the backward (None where it keeps none)."""
    h, inputs, auxes = x, [], []
    for layer, w, b in zip(chain.layers, weights, biases):
        inputs.append(h)
        outs = staged_product(chain.call(layer.forward), h, w, bias=b.reshape(1, -1))
        h = outs[0]
        auxes.append(outs[1] if layer.aux else None)
    return h, (tuple(inputs), tuple(auxes))


def _backward(chain: _Chain, weights, inputs, auxes, g):
    """Gradients of ``x``, the weights and the biases from ``g``, the output's cotangent (see the module notes)."""
    wanted = chain.wanted or _Wanted(True, (True,) * len(weights))
    dws, dbs = [None] * len(weights), [None] * len(weights)
    if not wanted.x and not any(wanted.layers):
        return None, tuple(dws), tuple(dbs)
    last = 0 if wanted.x else wanted.layers.index(True)  # the lowest layer whose backward is needed
    dz = g
    for i in reversed(range(last, len(weights))):
        w = weights[i]
        if wanted.layers[i]:
            dw, db = staged_product(chain.call(WEIGHT_GRADIENT, transpose_a=True), inputs[i], dz)
            dws[i], dbs[i] = dw.astype(w.dtype), db.reshape(w.shape[1]).astype(w.dtype)
        if i == last:  # nothing below is wanted
            dx = None
            if wanted.x:
                dx = staged_product(chain.call("DEFAULT", transpose_b=True), dz, w)[0].astype(inputs[0].dtype)
            return dx, tuple(dws), tuple(dbs)
        below = chain.layers[i - 1]  # the layer whose output ``inputs[i]`` is: its activation's derivative
        if below.derivative == "mask":
            t = staged_product(chain.call("DEFAULT", transpose_b=True), dz, w)[0]
            dz = jnp.where(inputs[i] > 0, t, jnp.zeros((), t.dtype))
        else:
            dz = staged_product(chain.call(below.backward_epilog, transpose_b=True), dz, w,
                                **{below.aux: auxes[i - 1]})[0]
    raise AssertionError("unreachable: the loop returns at its last layer")
