"""The XLA FFI route on the GPU (src/nvdispatch/_hotpath_ffi.c, nvdispatch/integrations/jax_ffi.py): every
epilog inside ``jax.jit``, under ``jax.grad`` and ``jax.vmap``, with the route forced to ``ffi`` (an error where
it is not available), against the float64 NumPy oracle; that the compiled program calls the handler and no
Python launch runs; autotuning reaches the staged calls; the two routes agree on an MLP training step.

Run on the H200: ``python3 -m pytest -m gpu tests/jax_integration/test_jax_gpu_ffi.py -q``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from matmul_reference import assert_close, assert_relu_mask, expected

import nvdispatch
from nvdispatch.integrations import jax_ffi

from .test_jax_matmul import EPILOGS, SHAPES, _case, _check, _check_gradients, _jitted

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True, params=["ffi", "ffi-graphs"])
def ffi_route(monkeypatch, request):
    """Every call staged in these tests takes the FFI route (outside, then inside XLA's command buffers); no
    Python launch runs while they run."""
    from nvdispatch._cuda.lt_launch import LtLaunch
    from nvdispatch._cuda.lt_matmul import LtMatmulPlan

    monkeypatch.setenv("NVDISPATCH_JAX_ROUTE", request.param)
    assert jax_ffi.route()[0] == request.param
    seen = {"python_launches": 0}
    launch = LtLaunch.__call__

    def spy_launch(self, *args, **kwargs):
        seen["python_launches"] += 1
        return launch(self, *args, **kwargs)

    def spy_into(self, *args, **kwargs):
        raise AssertionError("a buffer callback ran: the program did not take the FFI route")

    monkeypatch.setattr(LtLaunch, "__call__", spy_launch)
    monkeypatch.setattr(LtMatmulPlan, "execute_into", spy_into)
    yield seen


@pytest.mark.parametrize("epilog", EPILOGS)
@pytest.mark.parametrize("shapes", SHAPES, ids=["2d", "batch-a", "batch-b", "broadcast"])
def test_every_epilog(epilog, shapes, ffi_route):
    a, b, c, inputs = _case(epilog, *shapes)
    _check(_jitted(epilog)(a, b, c, inputs), a, b, c, inputs, epilog)
    assert ffi_route["python_launches"] == 0


@pytest.mark.parametrize("epilog", ["BIAS", "RELU_BIAS", "RELU_AUX_BIAS", "GELU_AUX_BIAS", "DRELU_BGRAD", "DGELU_BGRAD"])
def test_along_m(epilog):
    axis = "m" if "BGRAD" in epilog else "n"
    a, b, c, inputs = _case(epilog, (2, 5, 3), (3, 4), bias_axis="m")
    _check(_jitted(epilog, bgrad_axis=axis)(a, b, c, inputs), a, b, c, inputs, epilog, bgrad_axis=axis)


@pytest.mark.parametrize("epilog", ["DEFAULT", "RELU_BIAS", "GELU_AUX_BIAS", "BGRADB", "DRELU_BGRAD"])
def test_bfloat16_c_alpha_beta(epilog):
    a, b, c, inputs = _case(epilog, (5, 3), (3, 4))
    to_bf16 = {k: (jnp.asarray(v, jnp.bfloat16) if v.dtype != bool else v) for k, v in inputs.items()}
    _check(_jitted(epilog)(jnp.asarray(a, jnp.bfloat16), jnp.asarray(b, jnp.bfloat16), None, to_bf16),
           a, b, None, inputs, epilog, dtype="bfloat16")
    a, b, c, inputs = _case(epilog, (2, 5, 3), (3, 4), c_shape=(5, 4))
    _check(_jitted(epilog, alpha=2.0, beta=-1.0)(a, b, c, inputs), a, b, c, inputs, epilog, alpha=2.0, beta=-1.0)


@pytest.mark.parametrize("epilog", ["RELU_BIAS", "GELU_BIAS", "GELU_AUX_BIAS", "DRELU_BGRAD", "DGELU", "BGRADA", "BGRADB"])
def test_gradients(x64, epilog):
    _check_gradients(epilog, (5, 3), (3, 4))
    _check_gradients(epilog, (1, 5, 3), (2, 3, 4), bias_axis="m", bgrad_axis="m")


@pytest.mark.parametrize("epilog", ["RELU_AUX_BIAS", "GELU_AUX_BIAS"])
def test_vmap_stages_the_batched_call(epilog):
    rng = np.random.default_rng(1)
    a, b, bias = (rng.integers(-3, 4, s).astype(np.float32) for s in ((5, 4, 3), (3, 2), (2,)))
    f = lambda a: nvdispatch.matmul(a, b, epilog=epilog, epilog_inputs={"bias": bias})
    y, aux = jax.jit(jax.vmap(f, in_axes=1))(a)
    for i in range(4):
        want, want_aux = expected(a[:, i], b, None, 1, None, epilog, {"bias": bias})
        assert_close(np.asarray(y[i]), want, "float32")
        if epilog == "RELU_AUX_BIAS":
            assert_relu_mask(aux["relu_aux"][i], a[:, i], b, None, 1, None, epilog, {"bias": bias})
        else:
            assert_close(np.asarray(aux["gelu_aux"][i]), want_aux["gelu_aux"], "float32")
    # vmap of grad of a layer, the batch axis on the weights
    w = rng.standard_normal((3, 3, 2)).astype(np.float32)
    x = rng.standard_normal((6, 3)).astype(np.float32)
    grads = jax.jit(jax.vmap(jax.grad(lambda w: jnp.sum(nvdispatch.matmul(x, w, epilog="RELU")))))(w)
    for i in range(3):
        z = x.astype(np.float64) @ w[i]
        np.testing.assert_allclose(np.asarray(grads[i]), x.T.astype(np.float64) @ (z > 0), rtol=2e-2, atol=2e-2)


def _layer(x, w, bias):
    return nvdispatch.matmul(x, w, epilog="RELU_BIAS", epilog_inputs={"bias": bias})


def test_the_program_calls_the_handler(_placed):
    rng = np.random.default_rng(2)
    x, w, bias = (jax.device_put(rng.standard_normal(s).astype(np.float32), _placed) for s in ((64, 32), (32, 16), (16,)))
    step = jax.jit(jax.grad(lambda w, bias: jnp.sum(_layer(x, w, bias) ** 2), argnums=(0, 1)))
    hlo = step.lower(w, bias).as_text()
    target = jax_ffi.TARGET_GRAPHS if jax_ffi.route()[0] == "ffi-graphs" else jax_ffi.TARGET
    assert f"@{target}(" in hlo or f'"{target}"' in hlo, hlo[:3000]
    assert "callback" not in hlo.lower()
    jax.block_until_ready(step(w, bias))
    with jax.transfer_guard("disallow"):
        gw, gb = jax.block_until_ready(step(w, bias))
    z = np.asarray(x, np.float64) @ np.asarray(w, np.float64) + np.asarray(bias, np.float64)
    dz = 2 * np.maximum(z, 0)
    want_w, want_b = np.asarray(x, np.float64).T @ dz, dz.sum(0)
    # TF32 products: errors relative to the largest value (a small entry of a large gradient has no tighter bound)
    np.testing.assert_allclose(np.asarray(gw), want_w, rtol=2e-2, atol=1e-2 * np.abs(want_w).max())
    np.testing.assert_allclose(np.asarray(gb), want_b, rtol=2e-2, atol=1e-2 * np.abs(want_b).max())


def test_retracing_finds_the_same_plan_entries():
    rng = np.random.default_rng(4)
    x, w, bias = (rng.standard_normal(s).astype(np.float32) for s in ((64, 32), (32, 16), (16,)))
    jax.jit(_layer)(x, w, bias).block_until_ready()
    plans = len(jax_ffi.staged_plans())
    jax.clear_caches()
    jax.jit(lambda *a: _layer(*a))(x, w, bias).block_until_ready()
    assert len(jax_ffi.staged_plans()) == plans


def test_many_calls_with_changing_inputs_and_unaligned_buffers():
    rng = np.random.default_rng(5)
    w, bias = rng.integers(-3, 4, (32, 16)).astype(np.float32), rng.integers(-3, 4, 16).astype(np.float32)
    # slices of one buffer inside the program: operands at offsets XLA chooses (not all 256-byte aligned)
    step = jax.jit(lambda x: [_layer(x[i : i + 64], w, bias) for i in (0, 1, 3)])
    for _ in range(20):
        x = rng.integers(-3, 4, (67, 32)).astype(np.float32)
        for i, got in zip((0, 1, 3), step(x)):
            assert_close(np.asarray(got), np.maximum(x[i : i + 64].astype(np.float64) @ w + bias, 0), "float32")


def test_autotuning_a_staged_plan_reaches_the_program():
    import torch

    rng = np.random.default_rng(7)
    x, w, bias = (rng.standard_normal(s).astype(np.float32) for s in ((256, 128), (128, 64), (64,)))
    f = jax.jit(_layer)
    before = np.asarray(f(x, w, bias))
    plan = jax_ffi.staged_plans()[-1]
    p = plan.problem
    dev = torch.device("cuda", plan.device_index)
    operands = {"a": torch.randn(p.a.shape, device=dev), "b": torch.randn(p.b.shape, device=dev)}
    operands.update({name: torch.randn(sig.shape, device=dev) for name, sig in p.inputs})
    plan.autotune(operands, iterations=2)
    after = np.asarray(f(x, w, bias))
    want = np.maximum(x.astype(np.float64) @ w + bias, 0)
    scale = np.abs(want).max()
    assert np.abs(after - want).max() <= 5e-3 * scale and np.abs(before - want).max() <= 5e-3 * scale


def test_both_routes_agree_on_a_bf16_mlp_training_step(monkeypatch):
    rng = np.random.default_rng(6)
    widths = (64, 128, 128, 32)
    params = [(jnp.asarray(rng.standard_normal((i, o)) / np.sqrt(i), jnp.bfloat16), jnp.zeros(o, jnp.bfloat16))
              for i, o in zip(widths[:-1], widths[1:])]
    x = jnp.asarray(rng.standard_normal((256, widths[0])), jnp.bfloat16)

    def loss(params):
        h = x
        for i, (w, b) in enumerate(params):
            h = nvdispatch.matmul(h, w, epilog="BIAS" if i == len(params) - 1 else "GELU_BIAS",
                                  epilog_inputs={"bias": b})
        return jnp.mean(h.astype(jnp.float32) ** 2)

    got = {}
    first = jax_ffi.route()[0]
    for name in (first, "callback"):
        monkeypatch.setenv("NVDISPATCH_JAX_ROUTE", name)
        if name == "callback":
            from nvdispatch._cuda.lt_matmul import LtMatmulPlan

            monkeypatch.undo()  # the callback route launches from Python: lift the spies
            monkeypatch.setenv("NVDISPATCH_JAX_ROUTE", name)
            assert LtMatmulPlan.execute_into.__name__ == "execute_into"
        got[name] = jax.jit(jax.value_and_grad(loss))(params)
    (v1, g1), (v2, g2) = got[first], got["callback"]
    assert abs(float(v1) - float(v2)) <= 1e-2 * abs(float(v2))
    for a, b in zip(jax.tree_util.tree_leaves(g1), jax.tree_util.tree_leaves(g2)):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.abs(a - b).max() <= 3e-2 * max(np.abs(b).max(), 1e-6)
