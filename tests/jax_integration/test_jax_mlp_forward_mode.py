"""``jax_mlp.fused_mlp`` in forward mode and to second order: ``jax.test_util.check_grads`` (forward and reverse
mode, first and second order, against central finite differences in float64), and ``jvp``, ``jacfwd``,
``jacrev``, ``hessian``, ``linearize`` and ``linear_transpose`` against the same model in ``jax.numpy``
(``mlp_oracle.jnp_network``), under ``jax.jit`` and ``jax.vmap``; reverse mode still the fused backward GEMMs. CPU
here; ``test_jax_mlp_gpu.py`` runs forward mode on CUDA."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from nvdispatch.integrations.jax_mlp import fused_mlp

from .mlp_oracle import jnp_network, model, staged_epilogs

WIDTHS = [5, 6, 4, 3]
CASES = [("relu", "mask"), ("relu", "drelu"), ("gelu", "mask")]


def _ours(activation, relu_backward):
    return lambda x, ws, bs: fused_mlp(x, ws, bs, activation, relu_backward=relu_backward)


def _theirs(activation):
    return lambda x, ws, bs: jnp_network(x, ws, bs, activation)


def _model(seed, rows=4, dtype="float64"):
    x, ws, bs, gy = model(np.random.default_rng(seed), WIDTHS, rows, dtype)
    return jnp.asarray(x), [jnp.asarray(w) for w in ws], [jnp.asarray(b) for b in bs], jnp.asarray(gy)


def _close(got, want, tol=1e-10):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64), rtol=tol, atol=tol)


# ReLU's second derivative is zero away from its kink (no pre-activation of these models lies near it): the
# second-order checks test the chain's products of derivatives, and for GELU its curvature too
@pytest.mark.parametrize("activation,relu_backward", CASES)
def test_check_grads_forward_and_reverse_to_second_order(x64, activation, relu_backward):
    x, ws, bs, _ = _model(0)
    check_grads(jax.jit(_ours(activation, relu_backward)), (x, ws, bs), order=2, modes=("fwd", "rev"))


@pytest.mark.parametrize("activation,relu_backward", CASES)
def test_check_grads_under_vmap(x64, activation, relu_backward):
    x, ws, bs, _ = _model(1)
    f = _ours(activation, relu_backward)
    # over x alone (folded into the GEMMs' rows) and over the first weight (batched GEMMs)
    over_x = jax.jit(jax.vmap(f, in_axes=(0, None, None)))
    order = 2 if activation == "gelu" else 1  # ReLU's second order: the unbatched test above
    check_grads(over_x, (jnp.stack([x, -x, 2 * x]), ws, bs), order=order, modes=("fwd", "rev"))
    over_w = jax.jit(jax.vmap(lambda w, x, ws, bs: f(x, [w, *ws[1:]], bs), in_axes=(0, None, None, None)))
    check_grads(over_w, (jnp.stack([ws[0], 2 * ws[0]]), x, ws, bs), order=1, modes=("fwd", "rev"))


@pytest.mark.parametrize("activation,relu_backward", CASES)
def test_forward_mode_matches_the_jnp_network(x64, activation, relu_backward):
    x, ws, bs, _ = _model(2)
    ours, theirs = _ours(activation, relu_backward), _theirs(activation)
    rng = np.random.default_rng(3)
    tangents = jax.tree.map(lambda v: jnp.asarray(rng.standard_normal(v.shape)), (x, ws, bs))
    got = jax.jit(lambda p, t: jax.jvp(ours, p, t))((x, ws, bs), tangents)
    _close(got, jax.jvp(theirs, (x, ws, bs), tangents))
    # tangents of some inputs only (the others symbolic zeros): the last bias, the first weight
    only_b = jax.jit(jax.jvp, static_argnums=0)(lambda b: ours(x, ws, [*bs[:2], b]), (bs[2],), (tangents[2][2],))
    _close(only_b, jax.jvp(lambda b: theirs(x, ws, [*bs[:2], b]), (bs[2],), (tangents[2][2],)))
    only_w = jax.jit(jax.jvp, static_argnums=0)(lambda w: ours(x, [w, *ws[1:]], bs), (ws[0],), (tangents[1][0],))
    _close(only_w, jax.jvp(lambda w: theirs(x, [w, *ws[1:]], bs), (ws[0],), (tangents[1][0],)))
    # jacfwd = jacrev = the network's Jacobian
    want = jax.jit(jax.jacrev(theirs, argnums=(0, 1, 2)))(x, ws, bs)
    _close(jax.jit(jax.jacfwd(ours, argnums=(0, 1, 2)))(x, ws, bs), want)
    _close(jax.jit(jax.jacrev(ours, argnums=(0, 1, 2)))(x, ws, bs), want)


@pytest.mark.parametrize("activation,relu_backward", CASES)
def test_second_derivatives_match_the_jnp_network(x64, activation, relu_backward):
    x, ws, bs, gy = _model(4)

    def loss(f):
        return lambda x, ws, bs: jnp.sum(jnp.tanh(f(x, ws, bs)) * gy)

    ours, theirs = loss(_ours(activation, relu_backward)), loss(_theirs(activation))

    def of_middle_weight(g):
        return lambda w, x, ws, bs: g(x, [ws[0], w, ws[2]], bs)

    # hessian (jacfwd of jacrev) over x and over the middle weight (jvp of jvp and vjp of vjp: check_grads above)
    args = (ws[1], x, ws, bs)
    _close(jax.jit(jax.hessian(ours))(x, ws, bs), jax.jit(jax.hessian(theirs))(x, ws, bs))
    _close(jax.jit(jax.hessian(of_middle_weight(ours)))(*args), jax.jit(jax.hessian(of_middle_weight(theirs)))(*args))
    # a Hessian-vector product over every parameter (forward over reverse)
    rng = np.random.default_rng(5)
    v = jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape)), (ws, bs))

    def hvp(f):
        grad = jax.grad(lambda ws, bs: f(x, ws, bs), argnums=(0, 1))
        return jax.jvp(grad, (ws, bs), v)[1]

    _close(jax.jit(lambda: hvp(ours))(), jax.jit(lambda: hvp(theirs))())


@pytest.mark.parametrize("activation,relu_backward", CASES)
def test_linearize_and_its_transpose(x64, activation, relu_backward):
    x, ws, bs, gy = _model(6)
    f = functools.partial(_ours(activation, relu_backward), x)
    y, lin = jax.linearize(f, ws, bs)
    _close(y, _theirs(activation)(x, ws, bs))
    rng = np.random.default_rng(7)
    t = jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape)), (ws, bs))
    _close(lin(*t), jax.jvp(f, (ws, bs), t)[1], 1e-12)
    # the linearized chain transposes into the gradient (the fused backward)
    _close(jax.linear_transpose(lin, ws, bs)(gy), jax.vjp(f, ws, bs)[1](gy), 1e-12)


@pytest.mark.parametrize("activation,relu_backward", CASES)
def test_per_example_forward_mode(x64, activation, relu_backward):
    x, ws, bs, _ = _model(8, rows=(3, 4))
    ours, theirs = _ours(activation, relu_backward), _theirs(activation)
    tx = jnp.asarray(np.random.default_rng(9).standard_normal(x.shape))

    def cases(f):
        jvp_x = lambda x, t: jax.jvp(lambda x: f(x, ws, bs), (x,), (t,))[1]  # noqa: E731
        return {
            "vmap of jvp": jax.vmap(jvp_x)(x, tx),
            "jvp of vmap": jax.jvp(jax.vmap(lambda x: f(x, ws, bs)), (x,), (tx,))[1],
            "tangent batched alone": jax.vmap(lambda t: jvp_x(x[0], t))(tx),
            "per-example jacfwd": jax.vmap(jax.jacfwd(lambda x: f(x, ws, bs)))(x),
            "nested, weights batched": jax.vmap(
                jax.vmap(
                    lambda x, s: jax.jvp(lambda x: f(x, [s * ws[0], *ws[1:]], bs), (x,), (x,))[1], in_axes=(0, None)
                ),
                in_axes=(None, 0),
            )(x[0], jnp.asarray([1.0, -0.5])),
        }

    got, want = jax.jit(lambda: cases(ours))(), jax.jit(lambda: cases(theirs))()
    for name in want:
        _close(got[name], want[name])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_single_and_half_precision_tangents(dtype):
    x, ws, bs, _ = _model(10, rows=8, dtype=dtype)
    y, dy = jax.jit(lambda p: jax.jvp(_ours("gelu", "mask"), p, p))((x, ws, bs))
    assert y.dtype == dy.dtype == jnp.dtype(dtype)
    wide = jax.tree.map(lambda v: v.astype(jnp.float32), (x, ws, bs))
    want = jax.jvp(_theirs("gelu"), wide, wide)[1]
    tol = 1e-4 if dtype == "float32" else 5e-2
    scale = float(jnp.max(jnp.abs(want)))
    np.testing.assert_allclose(np.asarray(dy, np.float32), np.asarray(want), rtol=tol, atol=tol * scale)


@pytest.mark.parametrize("activation,relu_backward", CASES)
def test_reverse_mode_keeps_the_fused_backward(monkeypatch, activation, relu_backward):
    """The gradient is the tangent primitive transposed: none left in the program, and the backward stages the
    fused GEMMs (``BGRADB`` per layer, ``DGELU``/``DRELU`` for the activation's derivative); forward mode stages
    the forward GEMMs and keeps the primitive, whose products are staged when lowered."""
    x, ws, bs, gy = _model(11, rows=10, dtype="float32")
    f = _ours(activation, relu_backward)

    def loss(x, ws, bs):
        return jnp.sum(f(x, ws, bs) * gy)

    grad = jax.grad(loss, argnums=(0, 1, 2))
    jvp = lambda x, ws, bs: jax.jvp(f, (x, ws, bs), (x, ws, bs))  # noqa: E731
    assert "nvdispatch_mlp_tangent" not in str(jax.make_jaxpr(grad)(x, ws, bs))
    assert "nvdispatch_mlp_tangent" in str(jax.make_jaxpr(jvp)(x, ws, bs))
    hidden = {
        "relu": ("RELU_BIAS", "DEFAULT"),
        "drelu": ("RELU_AUX_BIAS", "DRELU"),
        "gelu": ("GELU_AUX_BIAS", "DGELU"),
    }["drelu" if relu_backward == "drelu" else activation]
    forward = [(hidden[0], False, False)] * 2 + [("BIAS", False, False)]
    backward = [("BGRADB", True, False), (hidden[1], False, True)] * 2 + [
        ("BGRADB", True, False),
        ("DEFAULT", False, True),
    ]
    seen = staged_epilogs(monkeypatch, grad, x, ws, bs)
    assert seen[-len(backward) :] == backward and set(seen[: -len(backward)]) == set(forward), seen
    seen = staged_epilogs(monkeypatch, jvp, x, ws, bs)
    assert set(seen) == set(forward), seen
    # lowered, forward mode adds plain products only (the tangents of the GEMMs: no backward epilog)
    seen = _lowered_epilogs(monkeypatch, jvp, x, ws, bs)
    assert seen == set(forward) | {("DEFAULT", False, False)}, seen
    # second order in reverse mode (a Hessian-vector product of the weights): still the fused backward GEMMs
    hvp = lambda ws: jax.jvp(jax.grad(lambda ws: loss(x, ws, bs)), (ws,), (ws,))[1]  # noqa: E731
    seen = staged_epilogs(monkeypatch, hvp, ws)
    assert seen.count(("BGRADB", True, False)) >= 3 and (hidden[1] == "DEFAULT" or hidden[1] in {e for e, *_ in seen})


def _lowered_epilogs(monkeypatch, fn, *args) -> set:
    """The ``(epilog, transpose_a, transpose_b)`` of the matmuls ``fn`` stages when traced and lowered."""
    from nvdispatch.integrations import jax_matmul

    seen, kernel = set(), jax_matmul.matmul_kernel
    monkeypatch.setattr(
        jax_matmul,
        "matmul_kernel",
        lambda call, ops: seen.add((call.epilog, call.transpose_a, call.transpose_b)) or kernel(call, ops),
    )
    jax.clear_caches()
    jax.jit(fn).lower(*args)
    return seen
