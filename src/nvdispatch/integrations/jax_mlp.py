"""A JAX multi-layer perceptron whose forward *and* backward GEMMs all run nvdispatch's fused epilogs.

:func:`fused_mlp` is the JAX twin of :func:`nvdispatch.integrations.torch_mlp.fused_mlp`: linear layers
``h_i = act(h_{i-1} @ W_i + b_i)`` (the last without activation) under one ``jax.custom_jvp`` over the whole
chain, whose tangent is one primitive linear in the inputs' tangents. Reverse mode (``jax.grad``) transposes that
primitive into the chain's backward pass. Differentiating one layer at a time (``nvdispatch.matmul`` under
``jax.grad``) fuses only half of a layer's backward: its activation's derivative multiplies the GEMM that belongs
to the next layer. The chain owns both, so each GEMM carries its elementwise work in its epilog (which one:
:mod:`.mlp_epilogs`):

* forward: ``GELU_AUX_BIAS`` (the pre-activation kept) / ``RELU_BIAS`` per hidden layer, ``BIAS`` for the last;
* backward, per layer: the weight and bias gradients from one ``BGRADB`` GEMM (``h_{i-1}^T`` read in place);
  the upstream gradient from one ``DGELU`` GEMM on the kept pre-activation, or for ReLU a plain GEMM masked by
  ``h_{i-1} > 0`` in XLA (``relu_backward="drelu"``: ``RELU_AUX_BIAS`` forward and a ``DRELU`` GEMM instead).

Forward mode (``jax.jvp``, ``jax.jacfwd``, ``jax.linearize``) evaluates the primitive: per layer the products
``dh_{i-1} W_i + h_{i-1} dW_i`` as staged GEMMs and the activation's derivative from what the forward pass kept.
Second derivatives (``jax.hessian``, a gradient differentiated again) differentiate the forward pass's kept values
through the same primitive and the backward pass through its staged GEMMs, still fused.

Every GEMM is a staged call of :mod:`.jax_matmul` (:func:`~.jax_matmul.staged_product`): the same kernels, plans,
plan cache and GPU routes as ``nvdispatch.matmul`` inside ``jax.jit``; on the CPU the host kernel runs
nvdispatch's CPU path. Eager calls run the chain as one jitted program (traced once per shapes and options).
Under :func:`jax.vmap` the forward folds a batch axis of ``x`` alone into the GEMMs' rows (the layers act
row by row); other batchings (batched weights, batched cotangents) batch each staged GEMM. Gradients are
those of the same model written with ``jnp.dot`` (GELU: the tanh approximation, as cuBLASLt's), in forward and
reverse mode, second derivatives included.

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
>>> y, dy = jax.jvp(lambda x: fused_mlp(x, ws, bs, activation="gelu"), (x,), (jnp.ones_like(x),))
>>> dy.shape
(32, 4)
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
from jax.interpreters import ad

from .._backends import get_state
from .._epilog import gelu_tanh_grad
from .._matmul_problem import as_options, as_preferences
from .._route import log
from ..errors import ShapeMismatchError, UnsupportedDtypeError, UnsupportedOperandError, describe
from .jax_ffi import route
from .jax_linear_primitive import linear_primitive
from .jax_matmul import staged_product
from .jax_matmul_kernel import MatmulCall
from .mlp_epilogs import WEIGHT_GRADIENT, LayerEpilogs, chain_epilogs, check_activation

__all__ = ["fused_mlp"]

_DTYPES = ("float16", "bfloat16", "float32", "float64")


@dataclasses.dataclass(frozen=True)
class _Wanted:
    """Which gradients a backward pass computes: ``x``'s, and each layer's weight and bias."""

    x: bool
    layers: tuple[bool, ...]


@dataclasses.dataclass(frozen=True)
class _Moving:
    """Which inputs of a chain have a tangent: ``x``, each weight, each bias."""

    x: bool
    weights: tuple[bool, ...]
    biases: tuple[bool, ...]

    @property
    def any(self) -> bool:
        return self.x or any(self.weights) or any(self.biases)

    @property
    def wanted(self) -> _Wanted:
        """The gradients a backward pass transposing these tangents computes."""
        return _Wanted(self.x, tuple(w or b for w, b in zip(self.weights, self.biases)))


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


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _chain(chain: _Chain, x, weights, biases):
    """The chain on 2-D ``x``: its output (JAX differentiates the rule below, never this)."""
    return _folded_forward(chain)(x, weights, biases)[0]


@functools.partial(_chain.defjvp, symbolic_zeros=True)
def _chain_jvp(chain: _Chain, primals, tangents):
    """The forward pass and the output's tangent as one :data:`_tangent_p`, linear in the tangents of the inputs
    that have one (``symbolic_zeros``: JAX tells which): forward mode evaluates it, reverse mode transposes it into
    :func:`_backward`, which then stages no GEMM whose result nothing uses (``dx`` of a model's input)."""
    y, kept = _kept_forward(chain)(*primals)
    moving = _moving(tangents)
    if not moving.any:
        return y, jnp.zeros(y.shape, y.dtype)
    return y, _bind_tangent(chain, moving, primals[1], kept, tangents, everything=False)[0]


def _moving(tangents) -> _Moving:
    dx, dws, dbs = tangents
    return _Moving(_given(dx), tuple(map(_given, dws)), tuple(map(_given, dbs)))


def _given(tangent) -> bool:
    return not isinstance(tangent, SymbolicZero)


def _bind_tangent(chain: _Chain, moving: _Moving, weights, kept, tangents, everything: bool) -> list:
    inputs, auxes = kept
    dx, dws, dbs = tangents
    given = [t for t in (dx, *dws, *dbs) if _given(t)]
    return _tangent_p.bind(*weights, *inputs, *(a for a in auxes if a is not None), *given,
                           chain=chain, moving=moving, everything=everything, levels=())


# -- the tangent primitive ----------------------------------------------------------------------------------------
# Operands: the residuals (each layer's weight, each layer's input, the auxiliary outputs kept), then the tangents
# ``moving`` names (``dx``, the weights', the biases'). Results: the output's tangent and, ``everything``, those of
# the hidden outputs and of the GELU pre-activations kept (what the forward pass keeps: second derivatives).
# Operands are 2-D rows or a weight/bias behind the batch axes of the vmaps ``levels`` lists (outermost first: its
# size and which operands it batches); the results have every level's.
def _residuals(args, chain: _Chain):
    """``(weights, inputs, auxes)`` from the primitive's leading operands (None: a layer keeps no auxiliary output)."""
    n = len(chain.layers)
    it = iter(args[2 * n :])
    return tuple(args[:n]), tuple(args[n : 2 * n]), tuple(next(it) if layer.aux else None for layer in chain.layers)


def _split(args, chain: _Chain, moving: _Moving):
    """``(weights, inputs, auxes, dx, dws, dbs)`` from the primitive's operands (None: absent, a zero tangent)."""
    count = _residual_count(chain)
    weights, inputs, auxes = _residuals(args[:count], chain)
    it = iter(args[count:])
    dx = next(it) if moving.x else None
    dws = tuple(next(it) if m else None for m in moving.weights)
    dbs = tuple(next(it) if m else None for m in moving.biases)
    return weights, inputs, auxes, dx, dws, dbs


def _residual_count(chain: _Chain) -> int:
    return 2 * len(chain.layers) + sum(layer.aux is not None for layer in chain.layers)


def _gelus(chain: _Chain) -> tuple[int, ...]:
    """The layers that keep their pre-activation (``gelu_aux``)."""
    return tuple(i for i, layer in enumerate(chain.layers) if layer.aux == "gelu_aux")


def _over_levels(fn, levels):
    """``fn`` of 2-D operands mapped over ``levels`` (each operand along the levels that batch it)."""
    for size, flags in reversed(levels):
        fn = jax.vmap(fn, in_axes=[0 if f else None for f in flags], axis_size=size)
    return fn


def _tangent_abstract(*args, chain: _Chain, moving: _Moving, everything: bool, levels):
    weights, inputs, auxes = _residuals(args[: _residual_count(chain)], chain)
    lead, rows, dt = tuple(size for size, _ in levels), inputs[0].shape[-2], inputs[0].dtype
    out = [jax.core.ShapedArray((*lead, rows, weights[-1].shape[-1]), dt)]
    if everything:
        out += [jax.core.ShapedArray((*lead, rows, w.shape[-1]), dt) for w in weights[:-1]]
        out += [jax.core.ShapedArray((*lead, *auxes[i].shape[-2:]), auxes[i].dtype) for i in _gelus(chain)]
    return out


def _tangent_values(*args, chain: _Chain, moving: _Moving, everything: bool, levels):
    """The tangents (:func:`_forward_tangents`, zeros where None), over ``levels``."""

    def rows(*args):
        weights, inputs, auxes, dx, dws, dbs = _split(args, chain, moving)
        dy, d_inputs, d_auxes = _forward_tangents(chain, weights, inputs, auxes, dx, dws, dbs)
        out = [(dy, inputs[0].shape[0], weights[-1].shape[1], inputs[0].dtype)]
        if everything:
            out += [(d, h.shape[0], h.shape[1], h.dtype) for d, h in zip(d_inputs[1:], inputs[1:])]
            out += [(d_auxes[i], *auxes[i].shape, auxes[i].dtype) for i in _gelus(chain)]
        return [jnp.zeros((m, n), dt) if d is None else d for d, m, n, dt in out]

    return _over_levels(rows, levels)(*args)


def _forward_tangents(chain: _Chain, weights, inputs, auxes, dx, dws, dbs):
    """``(dy, d_inputs, d_auxes)``: the tangents of the forward pass's output, layer inputs and kept auxiliary
    outputs (None: zero), layer by layer from what the forward pass kept: ``dz_i = dh_{i-1} W_i + h_{i-1} dW_i +
    db_i`` as staged products, ``dh_i = act'(z_i) dz_i`` (``act'`` from the layer's output for a ReLU mask, its mask
    for ``DRELU``, its pre-activation for GELU, whose tangent is ``dz_i``)."""
    product = chain.call("DEFAULT")
    last = len(weights) - 1
    dh, d_inputs, d_auxes = dx, [], []
    for i, (layer, w) in enumerate(zip(chain.layers, weights)):
        d_inputs.append(dh)
        terms = [staged_product(product, dh, w)[0]] if dh is not None else []
        if dws[i] is not None:
            terms.append(staged_product(product, inputs[i], dws[i])[0])
        if dbs[i] is not None:
            terms.append(jnp.broadcast_to(dbs[i], (inputs[i].shape[0], w.shape[1])))
        dz = functools.reduce(jnp.add, terms) if terms else None
        d_auxes.append(None if dz is None or layer.aux != "gelu_aux" else dz.astype(auxes[i].dtype))
        dh = dz if dz is None or i == last else _activation_tangent(layer, dz, inputs[i + 1], auxes[i])
    return dh, tuple(d_inputs), tuple(d_auxes)


def _activation_tangent(layer: LayerEpilogs, dz, h, aux):
    """``act'(z) dz`` for a hidden layer of output ``h`` that kept ``aux``."""
    zero = jnp.zeros((), dz.dtype)
    if layer.aux == "gelu_aux":
        wide = aux.astype(jnp.promote_types(aux.dtype, jnp.float32))
        return (dz * gelu_tanh_grad(wide, jnp)).astype(dz.dtype)
    return jnp.where(aux if layer.aux == "relu_aux" else h > 0, dz, zero)


def _tangent_transpose(cts, *args, chain: _Chain, moving: _Moving, everything: bool, levels):
    """The transpose: :func:`_backward` (the fused backward GEMMs) on the residuals, computing the gradients of the
    inputs that have a tangent only; summed over the levels that batch the results but not the input."""
    count = _residual_count(chain)
    linear = args[count:]
    given = tuple(not isinstance(ct, ad.Zero) for ct in cts)
    if not any(given):
        return [None] * count + [ad.Zero(x.aval.to_ct_aval()) for x in linear]
    backward = _batchable_backward(dataclasses.replace(chain, wanted=moving.wanted))
    n = len(chain.layers)
    log.debug("fused_mlp: tangent transposed into the fused backward (gradients wanted: x %s, layers %s)",
              moving.wanted.x, list(moving.wanted.layers))

    def rows(*args):
        it = iter(args[count:])
        g, *rest = [next(it) if flag else None for flag in given]
        hidden, gelu = (rest[: n - 1], rest[n - 1 :]) if everything else ([None] * (n - 1), [])
        at = dict(zip(_gelus(chain), gelu))
        extra = (tuple(hidden), tuple(at.get(i) for i in range(n)))
        dx, dws, dbs = backward(*_residuals(args[:count], chain), g, extra)
        picked = [dx] if moving.x else []
        picked += [dw for dw, m in zip(dws, moving.weights) if m]
        return picked + [db for db, m in zip(dbs, moving.biases) if m]

    batched = tuple((size, flags[:count] + (True,) * sum(given)) for size, flags in levels)
    got = _over_levels(rows, batched)(*args[:count], *(ct for ct in cts if not isinstance(ct, ad.Zero)))
    out = [None] * count
    for k, (x, g) in enumerate(zip(linear, got)):
        spare = tuple(j for j, (_, flags) in enumerate(levels) if not flags[count + k])
        out.append((jnp.sum(g, axis=spare) if spare else g).astype(x.aval.dtype))
    return out


def _tangent_jvp(primals, tangents, **params):
    """Forward mode over a tangent (second derivatives): its XLA form differentiated."""
    tangents = [ad.instantiate_zeros(t) for t in tangents]
    return jax.jvp(lambda *xs: _tangent_values(*xs, **params), tuple(primals), tuple(tangents))


def _tangent_batched(args, dims, *, chain: _Chain, moving: _Moving, everything: bool, levels):
    """One more level, its axis in front of the operands it batches."""
    size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
    moved = [x if d is None else jnp.moveaxis(x, d, 0) for x, d in zip(args, dims)]
    flags = tuple(d is not None for d in dims)
    outs = _tangent_p.bind(*moved, chain=chain, moving=moving, everything=everything, levels=((size, flags), *levels))
    return outs, [0] * len(outs)


#: the chain's tangents (residuals, then the tangents of the inputs that have one): linear in the latter;
#: transposed by the fused backward GEMMs, evaluated (forward mode) as staged products and XLA operations
_tangent_p = linear_primitive(
    "nvdispatch_mlp_tangent", _tangent_values, _tangent_abstract, _tangent_jvp, _tangent_transpose, _tangent_batched
)


# -- the forward and backward passes --------------------------------------------------------------------------------
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
def _kept_forward(chain: _Chain):
    """:func:`_folded_forward` of ``chain`` differentiable (second derivatives of the chain): JAX does not linearize
    a custom_vmap, so a custom_jvp whose primal is the folded forward (batched as its rule says, as JAX expects of
    a JVP rule) and whose tangents are those of :data:`_tangent_p`, all of them."""
    forward = _folded_forward(chain)
    differentiable = jax.custom_jvp(forward)

    @functools.partial(differentiable.defjvp, symbolic_zeros=True)
    def _jvp(primals, tangents):
        y, (inputs, auxes) = out = forward(*primals)
        moving = _moving(tangents)
        if not moving.any:
            zeros = jax.tree_util.tree_map(lambda v: _tangent_of(v, None), out)
            return out, zeros
        dy, *rest = _bind_tangent(chain, moving, primals[1], (inputs, auxes), tangents, everything=True)
        hidden, gelu = rest[: len(chain.layers) - 1], dict(zip(_gelus(chain), rest[len(chain.layers) - 1 :]))
        dx = tangents[0] if moving.x else None
        d_inputs = tuple(map(_tangent_of, inputs, (dx, *hidden)))
        d_auxes = tuple(_tangent_of(a, gelu.get(i)) for i, a in enumerate(auxes))
        return out, (dy, (d_inputs, d_auxes))

    return differentiable


@functools.lru_cache(maxsize=64)
def _batchable_backward(chain: _Chain):
    """:func:`_backward` of ``chain`` whose :func:`jax.vmap` maps every row-shaped argument (layer inputs, kept
    auxiliary outputs, the cotangents) along the batch axis when any argument has one: a fused GEMM's epilog input
    is then always batched with the GEMM's operand (``DGELU``'s pre-activation with the upstream gradient)."""

    @jax.custom_batching.custom_vmap
    def backward(weights, inputs, auxes, g, extra):
        return _backward(chain, weights, inputs, auxes, g, extra)

    @backward.def_vmap
    def _batched(axis_size, in_batched, weights, inputs, auxes, g, extra):
        w_batched, *_ = in_batched

        def spread(value, batched):
            return value if batched else jnp.broadcast_to(value, (axis_size, *value.shape))

        rows = jax.tree_util.tree_map(spread, (inputs, auxes, g, extra), tuple(in_batched[1:]))
        axes = ([0 if f else None for f in w_batched], 0, 0, 0, 0)
        log.debug("fused_mlp: backward mapped over a batch of %d (weights batched: %s)", axis_size, list(w_batched))
        out = jax.vmap(functools.partial(_backward, chain), in_axes=axes, axis_size=axis_size)(list(weights), *rows)
        return out, jax.tree_util.tree_map(lambda _: True, out)

    # differentiated (second derivatives) as the same function without the batching rule, which JAX can linearize
    # (every output depends on the cotangents, batched wherever the rule batches: the same batching)
    differentiable = jax.custom_jvp(backward)
    differentiable.defjvp(
        lambda primals, tangents: jax.jvp(functools.partial(_backward, chain), primals, tangents)
    )
    return differentiable


def _tangent_of(primal, tangent):
    """``tangent`` (None: zero) as the tangent of ``primal`` (None where ``primal`` is None)."""
    if primal is None or tangent is not None:
        return tangent
    if jnp.issubdtype(primal.dtype, jnp.inexact):
        return jnp.zeros(primal.shape, primal.dtype)
    return np.zeros(primal.shape, jax.dtypes.float0)


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


def _backward(chain: _Chain, weights, inputs, auxes, g, extra=None):
    """Gradients of ``x``, the weights and the biases from ``g``, the output's cotangent (None: zero), and ``extra``
    (None, or the cotangents of the hidden outputs and of each layer's kept pre-activation, None where zero: the
    forward pass's tangents transposed, for second derivatives). See the module notes."""
    wanted = chain.wanted or _Wanted(True, (True,) * len(weights))
    dws, dbs = [None] * len(weights), [None] * len(weights)
    if not wanted.x and not any(wanted.layers):
        return None, tuple(dws), tuple(dbs)
    hidden, at_z = extra or ((None,) * (len(weights) - 1), (None,) * len(weights))
    last = 0 if wanted.x else wanted.layers.index(True)  # the lowest layer whose backward is needed
    dz = jnp.zeros((inputs[0].shape[0], weights[-1].shape[1]), inputs[0].dtype) if g is None else g
    for i in reversed(range(last, len(weights))):
        if at_z[i] is not None:
            dz = dz + at_z[i].astype(dz.dtype)
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
            if hidden[i - 1] is not None:
                t = t + hidden[i - 1].astype(t.dtype)
            dz = jnp.where(inputs[i] > 0, t, jnp.zeros((), t.dtype))
        else:
            dz = staged_product(chain.call(below.backward_epilog, transpose_b=True), dz, w,
                                **{below.aux: auxes[i - 1]})[0]
            if hidden[i - 1] is not None:
                dz = dz + _activation_tangent(below, hidden[i - 1].astype(dz.dtype), inputs[i], auxes[i - 1])
    raise AssertionError("unreachable: the loop returns at its last layer")
