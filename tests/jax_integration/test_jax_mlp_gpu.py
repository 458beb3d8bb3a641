"""``jax_mlp.fused_mlp`` on the GPU: values and gradients against the float64 oracle under ``jax.jit``/``grad``/
``vmap``, and the compiled program: every GEMM of the training step one staged nvdispatch call (XLA runs none
of its own), each backward layer two of them, the GELU derivative inside the ``DGELU`` epilog.

Run on the H200: ``python3 -m pytest -m gpu tests/jax_integration/test_jax_mlp_gpu.py -q``.
"""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest

from nvdispatch.integrations import jax_ffi
from nvdispatch.integrations.jax_mlp import fused_mlp

from .mlp_oracle import (
    assert_close,
    chain_loss,
    check_grads,
    check_staged_gemms,
    forward,
    gradients,
    jnp_network,
    model,
)

pytestmark = pytest.mark.gpu

WIDTHS = [64, 128, 96, 32]
CASES = [("relu", "mask"), ("relu", "drelu"), ("gelu", "mask")]
#: TF32 products for float32 (JAX's default precision on the GPU); bfloat16 rounds every layer's output
TOL = {"float32": 2e-2, "bfloat16": 4e-2, "float16": 1e-2}


def _loss(activation, relu_backward="mask"):
    return chain_loss(activation, relu_backward)


def _check_grads(got, x, ws, bs, activation, gy, tol):
    check_grads(got, x, ws, bs, activation, gy, tol, dtypes=False)


# float16 with GELU only: a ReLU mask of float16 activations may differ from the oracle's where a pre-activation
# rounds across zero, which moves a whole row of the input gradient
@pytest.mark.parametrize("activation,relu_backward,dtype",
                         [(*case, dtype) for case in CASES for dtype in ("bfloat16", "float32")]
                         + [("gelu", "mask", "float16")])
def test_values_and_gradients_on_the_gpu(_placed, activation, relu_backward, dtype):
    if activation == "relu" and dtype == "float32":
        # TF32 moves pre-activations near zero across it, flipping ReLU masks against the float64 oracle (a whole
        # row of dx per flip); at float32 precision (followed by nvdispatch as by XLA) the masks agree
        with jax.default_matmul_precision("float32"):
            return _values_and_gradients(activation, relu_backward, dtype, _placed, 1e-3)
    _values_and_gradients(activation, relu_backward, dtype, _placed, TOL[dtype])


def _values_and_gradients(activation, relu_backward, dtype, _placed, tol):
    x, ws, bs, gy = model(np.random.default_rng(0), WIDTHS, 256, dtype)
    y = jax.jit(lambda x, ws, bs: fused_mlp(x, ws, bs, activation, relu_backward=relu_backward))(x, ws, bs)
    assert y.devices() == {_placed}
    assert_close(y, forward(x, ws, bs, activation)[0], tol, "y")
    assert_close(fused_mlp(x, ws, bs, activation, relu_backward=relu_backward), forward(x, ws, bs, activation)[0],
                 tol, "eager y")
    got = jax.jit(jax.grad(_loss(activation, relu_backward), argnums=(0, 1, 2)))(x, ws, bs, gy)
    _check_grads(got, x, ws, bs, activation, gy, tol)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_vmap_on_the_gpu(activation):
    x, ws, bs, gy = model(np.random.default_rng(1), WIDTHS, (3, 64), "bfloat16")
    got = jax.jit(jax.vmap(lambda x: fused_mlp(x, ws, bs, activation)))(x)
    assert_close(got, forward(x, ws, bs, activation)[0], TOL["bfloat16"], "vmap")
    per = jax.jit(jax.vmap(jax.grad(_loss(activation), argnums=(0, 1, 2)), in_axes=(0, None, None, 0)))(x, ws, bs, gy)
    for i in range(x.shape[0]):
        one = (per[0][i], [g[i] for g in per[1]], [g[i] for g in per[2]])
        _check_grads(one, x[i], ws, bs, activation, gy[i], TOL["bfloat16"])
    stacked = np.stack([ws[1], -ws[1]])
    dw1 = jax.jit(jax.vmap(jax.grad(lambda w1: _loss(activation)(x[0], [ws[0], w1, ws[2]], bs, gy[0]))))(stacked)
    for i in range(2):
        want = gradients(x[0], [ws[0], stacked[i], ws[2]], bs, activation, gy[0])[1][1]
        assert_close(dw1[i], want, TOL["bfloat16"], f"dw1[{i}]")


@pytest.mark.parametrize("activation,relu_backward", CASES)
def test_each_layer_stages_its_fused_gemms_on_the_gpu(monkeypatch, activation, relu_backward):
    check_staged_gemms(monkeypatch, activation, relu_backward)


@pytest.mark.parametrize("activation,relu_backward", CASES)
def test_every_gemm_of_the_step_is_one_staged_call(_placed, activation, relu_backward):
    host = model(np.random.default_rng(2), [128, 256, 256, 128], 512, "bfloat16")
    x, ws, bs, gy = jax.device_put(host, _placed)
    step = jax.jit(jax.grad(_loss(activation, relu_backward), argnums=(0, 1, 2)))
    hlo = step.lower(x, ws, bs, gy).compile().as_text()
    target = jax_ffi.TARGET_GRAPHS if jax_ffi.route()[0] == "ffi-graphs" else jax_ffi.TARGET
    layers = len(ws)
    # forward: one per layer but the last (the loss is linear in the output: nothing reads the last layer's result,
    # XLA drops its call); backward: BGRADB + the upstream gradient's GEMM per layer (dx's for the first)
    assert len(re.findall(rf'custom_call_target="{target}"', hlo)) == 3 * layers - 1, hlo[:4000]
    assert "cublas" not in hlo.lower() and "callback" not in hlo.lower()
    if activation == "gelu":  # GELU and its derivative live in the epilogs: no tanh left to XLA
        assert "tanh" not in hlo
    _check_grads(step(x, ws, bs, gy), *host[:3], activation, host[3], TOL["bfloat16"])
    # a training step (the parameters' gradients only): no GEMM for x's
    hlo = jax.jit(jax.grad(_loss(activation, relu_backward), argnums=(1, 2))).lower(x, ws, bs, gy).compile().as_text()
    assert len(re.findall(rf'custom_call_target="{target}"', hlo)) == 3 * layers - 2


@pytest.mark.parametrize("activation,relu_backward", CASES)
def test_forward_mode_and_second_derivatives_on_the_gpu(_placed, activation, relu_backward):
    """``jvp`` and a Hessian-vector product (forward over the fused backward) against the ``jnp`` network, in float32
    at full precision (no TF32: ReLU masks agree with the oracle's); every GEMM staged on nvdispatch's route."""
    x, ws, bs, gy = jax.device_put(model(np.random.default_rng(3), WIDTHS, 128, "float32"), _placed)
    ours = lambda x, ws, bs: fused_mlp(x, ws, bs, activation, relu_backward=relu_backward)  # noqa: E731
    theirs = lambda x, ws, bs: jnp_network(x, ws, bs, activation)  # noqa: E731
    with jax.default_matmul_precision("float32"):
        y, dy = jax.jit(lambda p: jax.jvp(ours, p, p))((x, ws, bs))
        want_y, want_dy = jax.jvp(theirs, (x, ws, bs), (x, ws, bs))
        assert y.devices() == {_placed}
        assert_close(y, np.asarray(want_y, np.float64), 1e-4, "y")
        assert_close(dy, np.asarray(want_dy, np.float64), 1e-4, "dy")

        def hvp(f):
            grad = jax.grad(lambda ws: jax.numpy.sum(f(x, ws, bs) * gy))
            return jax.jvp(grad, (ws,), (ws,))[1]

        got, want = jax.jit(lambda: hvp(ours))(), hvp(theirs)
        for i in range(len(ws)):
            assert_close(got[i], np.asarray(want[i], np.float64), 1e-3, f"hvp[{i}]")
        program = jax.jit(lambda p: jax.jvp(ours, p, p)).lower((x, ws, bs)).compile().as_text()
    target = jax_ffi.TARGET_GRAPHS if jax_ffi.route()[0] == "ffi-graphs" else jax_ffi.TARGET
    if jax_ffi.route()[0] != "callback":
        assert "cublas" not in program.lower() and re.search(rf'custom_call_target="{target}"', program)
