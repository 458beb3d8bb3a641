"""``nvdispatch.integrations.jax_mlp.fused_mlp``: values and gradients against the float64 oracle of the plain
model (``mlp_oracle``: backpropagated by hand), eagerly, under ``jax.jit``, ``jax.grad`` and ``jax.vmap``; the
GEMMs each layer stages; typed errors. CPU here; ``test_jax_mlp_gpu.py`` runs the same on CUDA."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nvdispatch.errors import InvalidArgumentError, ShapeMismatchError, UnsupportedDtypeError, UnsupportedOperandError
from nvdispatch.integrations import jax_matmul
from nvdispatch.integrations.jax_mlp import fused_mlp

from .mlp_oracle import (
    assert_close,
    chain_loss,
    check_grads,
    check_staged_gemms,
    forward,
    gradients,
    model,
    staged_epilogs,
    tolerance,
)

WIDTHS = [8, 16, 12, 4]
CASES = [("relu", "mask"), ("relu", "drelu"), ("gelu", "mask")]


def _loss(activation, relu_backward="mask"):
    return chain_loss(activation, relu_backward)


def _check_grads(got, x, ws, bs, activation, gy, tol):
    check_grads(got, x, ws, bs, activation, gy, tol, dtypes=True)


@pytest.mark.parametrize("activation,relu_backward", CASES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_values_eager_and_jit(activation, relu_backward, dtype):
    x, ws, bs, _ = model(np.random.default_rng(0), WIDTHS, 10, dtype)
    want = forward(x, ws, bs, activation)[0]
    eager = fused_mlp(x, ws, bs, activation, relu_backward=relu_backward)
    assert isinstance(eager, jax.Array) and str(eager.dtype) == dtype
    assert_close(eager, want, tolerance(dtype), "eager")
    jitted = jax.jit(lambda x, ws, bs: fused_mlp(x, ws, bs, activation, relu_backward=relu_backward))(x, ws, bs)
    assert_close(jitted, want, tolerance(dtype), "jit")


@pytest.mark.parametrize("activation,relu_backward", CASES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gradients_under_jit(activation, relu_backward, dtype):
    x, ws, bs, gy = model(np.random.default_rng(1), WIDTHS, 10, dtype)
    got = jax.jit(jax.grad(_loss(activation, relu_backward), argnums=(0, 1, 2)))(x, ws, bs, gy)
    _check_grads(got, x, ws, bs, activation, gy, tolerance(dtype))


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_gradients_eagerly_and_in_float64(x64, activation):
    x, ws, bs, gy = model(np.random.default_rng(2), WIDTHS, 7, "float64")
    got = jax.grad(_loss(activation), argnums=(0, 1, 2))(x, ws, bs, gy)
    _check_grads(got, x, ws, bs, activation, gy, tolerance("float64"))


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_leading_axes_and_a_vector_input(activation):
    x, ws, bs, gy = model(np.random.default_rng(3), WIDTHS, (2, 3), "float32")
    got = jax.jit(jax.grad(_loss(activation), argnums=(0, 1, 2)))(x, ws, bs, gy)
    _check_grads(got, x, ws, bs, activation, gy, 1e-4)
    y = fused_mlp(x[0, 0], ws, bs, activation)
    assert y.shape == (WIDTHS[-1],)
    assert_close(y, forward(x[0, 0][None], ws, bs, activation)[0][0], 1e-4)


@pytest.mark.parametrize("activation,relu_backward", CASES)
def test_vmap_over_x_values_and_grads(caplog, activation, relu_backward):
    x, ws, bs, gy = model(np.random.default_rng(4), WIDTHS, (3, 5), "float32")
    f = lambda x: fused_mlp(x, ws, bs, activation, relu_backward=relu_backward)  # noqa: E731
    with caplog.at_level(logging.DEBUG, logger="nvdispatch"):
        got = jax.jit(jax.vmap(f))(x)
    assert "vmap of 3 over x alone folded into the rows" in caplog.text
    assert_close(got, forward(x, ws, bs, activation)[0], 1e-4, "vmap")
    # grad of a vmapped model: weight gradients summed over the mapped axis
    loss = lambda x, ws, bs: jnp.sum(jax.vmap(lambda x: fused_mlp(x, ws, bs, activation,  # noqa: E731
                                                                 relu_backward=relu_backward))(x) * gy)
    _check_grads(jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(x, ws, bs), x, ws, bs, activation, gy, 1e-4)
    # vmap of grad: per-example gradients
    per = jax.jit(jax.vmap(jax.grad(_loss(activation, relu_backward), argnums=(0, 1, 2)), in_axes=(0, None, None, 0)))
    got = per(x, ws, bs, gy)
    for i in range(x.shape[0]):
        one = (got[0][i], [g[i] for g in got[1]], [g[i] for g in got[2]])
        _check_grads(one, x[i], ws, bs, activation, gy[i], 1e-4)


def test_vmap_over_a_weight_and_over_cotangents():
    x, ws, bs, gy = model(np.random.default_rng(5), WIDTHS, 6, "float32")
    stacked = np.stack([ws[1], -ws[1]])

    def loss(w1):
        return _loss("gelu")(x, [ws[0], w1, ws[2]], bs, gy)

    got = jax.jit(jax.vmap(jax.grad(loss)))(stacked)
    for i in range(2):
        want = gradients(x, [ws[0], stacked[i], ws[2]], bs, "gelu", gy)[1][1]
        assert_close(got[i], want, 1e-4, f"dw1[{i}]")
    # jacrev maps the backward over cotangents (nothing of the forward batched)
    small = lambda x: fused_mlp(x, ws, bs, "gelu")  # noqa: E731
    jac = jax.jit(jax.jacrev(small))(x[:2])
    for j in range(WIDTHS[-1]):
        onehot = np.zeros((2, WIDTHS[-1]), np.float32)
        onehot[0, j] = 1
        want = gradients(x[:2], ws, bs, "gelu", onehot)[0]
        assert_close(jac[0, j], want, 1e-4, f"jac of y[0, {j}]")


@pytest.mark.parametrize("activation,relu_backward", CASES)
def test_each_layer_stages_its_fused_gemms(monkeypatch, activation, relu_backward):
    check_staged_gemms(monkeypatch, activation, relu_backward)


def test_gradients_nobody_asked_for_stage_no_gemm(monkeypatch):
    x, ws, bs, gy = model(np.random.default_rng(10), WIDTHS, 10, "float32")
    loss = _loss("gelu")
    # the weights and biases only (a training step): no GEMM for x's gradient
    seen = staged_epilogs(monkeypatch, jax.grad(loss, argnums=(1, 2)), x, ws, bs, gy)[6:]
    assert [e for e, *_ in seen] == ["BGRADB", "DGELU", "BGRADB", "DGELU", "BGRADB"]
    # x only: no weight gradient
    seen = staged_epilogs(monkeypatch, jax.grad(loss), x, ws, bs, gy)[6:]
    assert [e for e, *_ in seen] == ["DGELU", "DGELU", "DEFAULT"]
    # the last weight only: the backward stops there
    last = lambda w: loss(x, [*ws[:2], w], bs, gy)  # noqa: E731
    seen = staged_epilogs(monkeypatch, jax.grad(last), ws[2])[6:]
    assert [e for e, *_ in seen] == ["BGRADB"]
    want = gradients(x, ws, bs, "gelu", gy)
    got = jax.jit(jax.grad(loss, argnums=(1, 2)))(x, ws, bs, gy)
    for i in range(3):
        assert_close(got[0][i], want[1][i], 1e-4, f"dw[{i}]")
        assert_close(got[1][i], want[2][i], 1e-4, f"db[{i}]")
    assert_close(jax.jit(jax.grad(last))(ws[2]), want[1][2], 1e-4, "dw[2]")
    assert_close(jax.jit(jax.grad(loss))(x, ws, bs, gy), want[0], 1e-4, "dx")
    # an output that does not reach the loss: zero gradients
    unused = jax.grad(lambda x: (jnp.sum(x), fused_mlp(x, ws, bs, "gelu")), has_aux=True)(x)[0]
    np.testing.assert_array_equal(unused, np.ones_like(x))


def test_eager_calls_reuse_the_traced_program(monkeypatch):
    x, ws, bs, _ = model(np.random.default_rng(7), [8, 8], 4, "float32")
    fused_mlp(x, ws, bs)
    seen = []
    kernel = jax_matmul.matmul_kernel
    monkeypatch.setattr(jax_matmul, "matmul_kernel", lambda *a: seen.append(a) or kernel(*a))
    fused_mlp(x + 1, ws, bs)
    assert seen == []  # same shapes and options: not traced again


def test_inputs_are_not_modified():
    x, ws, bs, _ = model(np.random.default_rng(8), WIDTHS, 5, "float32")
    before = [a.copy() for a in (x, *ws, *bs)]
    fused_mlp(x, ws, bs, "gelu")
    for a, b in zip(before, (x, *ws, *bs)):
        np.testing.assert_array_equal(a, b)


# -- errors ----------------------------------------------------------------------------------------------------------
def _small():
    x, ws, bs, _ = model(np.random.default_rng(9), [4, 6, 2], 3, "float32")
    return x, ws, bs


@pytest.mark.parametrize(
    "change,error,argument",
    [
        (lambda x, ws, bs: (x, ws, bs, {"activation": "tanh"}), InvalidArgumentError, "activation"),
        (lambda x, ws, bs: (x, ws, bs, {"activation": None}), InvalidArgumentError, "activation"),
        (lambda x, ws, bs: (x, ws, bs, {"relu_backward": True}), InvalidArgumentError, "relu_backward"),
        (lambda x, ws, bs: (x, ws[0], bs, {}), UnsupportedOperandError, "weights"),
        (lambda x, ws, bs: (x, [], [], {}), ShapeMismatchError, "weights"),
        (lambda x, ws, bs: (x, ws, bs[:1], {}), ShapeMismatchError, "biases"),
        (lambda x, ws, bs: (x, ws[::-1], bs, {}), ShapeMismatchError, "weights[0]"),
        (lambda x, ws, bs: (x, [ws[0], ws[0]], bs, {}), ShapeMismatchError, "weights[1]"),
        (lambda x, ws, bs: (x, ws, [bs[1], bs[1]], {}), ShapeMismatchError, "biases[0]"),
        (lambda x, ws, bs: (x, ws, [bs[0], bs[1].reshape(1, 2)], {}), ShapeMismatchError, "biases[1]"),
        (lambda x, ws, bs: (x, [ws[0].astype(np.float16), ws[1]], bs, {}), UnsupportedDtypeError, "weights[0]"),
        (lambda x, ws, bs: (x, ws, [bs[0], bs[1].astype(np.float16)], {}), UnsupportedDtypeError, "biases[1]"),
        (lambda x, ws, bs: (x.astype(np.int32), ws, bs, {}), UnsupportedDtypeError, "x"),
        (lambda x, ws, bs: (x.tolist(), ws, bs, {}), UnsupportedOperandError, "x"),
        (lambda x, ws, bs: (x, [ws[0].tolist(), ws[1]], bs, {}), UnsupportedOperandError, "weights[0]"),
        (lambda x, ws, bs: (np.float32(1), ws, bs, {}), ShapeMismatchError, "x"),
    ],
)
def test_errors_name_the_argument(change, error, argument):
    x, ws, bs, kw = change(*_small())
    with pytest.raises(error) as info:
        fused_mlp(x, ws, bs, **kw)
    assert info.value.argument == argument
    with pytest.raises(error):  # the same at trace time
        jax.jit(lambda x: fused_mlp(x, ws, bs, **kw))(x) if not isinstance(x, list) else fused_mlp(x, ws, bs, **kw)

