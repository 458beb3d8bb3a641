"""The JAX integration on the GPU: the CPU tests' cases on JAX's GPU device (matmuls by the route chosen by
default: the XLA FFI handler where it is available), plus what only a GPU shows — no host transfer inside the
program, one cuBLASLt launch per fused call writing XLA's buffers, cuFFT writing XLA's output buffer, JAX's
precision setting reaching the compute type, plans found again when re-traced.

Run on the H200: ``python3 -m pytest -m gpu tests/jax_integration -q``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fft_reference import assert_close as fft_close
from fft_reference import make
from matmul_reference import assert_close, assert_relu_mask, expected

import nvdispatch
from nvdispatch import ComputeType, plan_cache

from .test_jax_fft import CASES as FFT_CASES
from .test_jax_fft import _input, _numpy
from .test_jax_matmul import (
    EPILOGS,
    ONLY_INPUT_BATCHED,
    SHAPES,
    _case,
    _check,
    _check_gradients,
    _jitted,
    check_vmap_over_inputs_only,
)

pytestmark = pytest.mark.gpu


@pytest.fixture
def launches(monkeypatch):
    """What the staged calls run: each cuBLASLt plan written into XLA's buffers (its epilog, its compute type),
    every ``cublasLtMatmul`` launch, every cuFFT plan run (whether into XLA's output buffer). Matmuls take the
    buffer-callback route here, whose launches run in Python (test_jax_gpu_ffi.py checks the FFI route)."""
    monkeypatch.setenv("NVDISPATCH_JAX_ROUTE", "callback")
    from nvdispatch._cuda.lt_launch import LtLaunch
    from nvdispatch._cuda.lt_matmul import LtMatmulPlan
    from nvdispatch.executors.cuda_fft import CudaFFTPlan

    seen = {"lt": [], "compute": [], "launches": 0, "cufft": []}
    launch, into, execute = LtLaunch.__call__, LtMatmulPlan.execute_into, CudaFFTPlan.execute

    def spy_launch(self, *args, **kwargs):
        seen["launches"] += 1
        return launch(self, *args, **kwargs)

    def spy_into(self, *args, **kwargs):
        seen["lt"].append(self.problem.epilog.epilog.name)
        seen["compute"].append(self.problem.options.compute_type)
        return into(self, *args, **kwargs)

    def spy_fft(self, operands, stream=None):
        seen["cufft"].append("out" in operands)
        return execute(self, operands, stream)

    monkeypatch.setattr(LtLaunch, "__call__", spy_launch)
    monkeypatch.setattr(LtMatmulPlan, "execute_into", spy_into)
    monkeypatch.setattr(CudaFFTPlan, "execute", spy_fft)
    return seen


# -- the CPU cases, on the GPU ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("epilog", EPILOGS)
@pytest.mark.parametrize("shapes", SHAPES, ids=["2d", "batch-a", "batch-b", "broadcast"])
def test_every_epilog(epilog, shapes):
    a, b, c, inputs = _case(epilog, *shapes)
    _check(_jitted(epilog)(a, b, c, inputs), a, b, c, inputs, epilog)


@pytest.mark.parametrize("epilog", ["BIAS", "RELU_BIAS", "RELU_AUX_BIAS", "GELU_AUX_BIAS", "DRELU_BGRAD", "DGELU_BGRAD"])
def test_along_m(epilog):
    axis = "m" if "BGRAD" in epilog else "n"
    a, b, c, inputs = _case(epilog, (2, 5, 3), (3, 4), bias_axis="m")
    _check(_jitted(epilog, bgrad_axis=axis)(a, b, c, inputs), a, b, c, inputs, epilog, bgrad_axis=axis)


@pytest.mark.parametrize("epilog", ["DEFAULT", "RELU_BIAS", "GELU_AUX_BIAS", "BGRADB", "DRELU_BGRAD"])
def test_bfloat16_and_c(epilog):
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


def test_vmap():
    rng = np.random.default_rng(1)
    a, b, bias = (rng.integers(-3, 4, s).astype(np.float32) for s in ((5, 4, 3), (3, 2), (2,)))
    f = lambda a: nvdispatch.matmul(a, b, epilog="RELU_AUX_BIAS", epilog_inputs={"bias": bias})
    y, aux = jax.jit(jax.vmap(f, in_axes=1))(a)
    for i in range(4):
        want, _ = expected(a[:, i], b, None, 1, None, "RELU_AUX_BIAS", {"bias": bias})
        assert_close(np.asarray(y[i]), want, "float32")
        assert_relu_mask(aux["relu_aux"][i], a[:, i], b, None, 1, None, "RELU_AUX_BIAS", {"bias": bias})


@pytest.mark.parametrize("epilog, batched", ONLY_INPUT_BATCHED)
def test_vmap_over_an_epilog_input_or_c_alone(epilog, batched):
    check_vmap_over_inputs_only(epilog, batched)


@pytest.mark.parametrize("func, kind, kw", FFT_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(FFT_CASES)])
def test_every_transform(func, kind, kw):
    x, dtype = _input(kind)
    got = jax.jit(lambda v: getattr(nvdispatch.fft, func)(v, **kw))(x)
    fft_close(np.asarray(got), _numpy(func, x, kw), dtype)


def test_transform_gradients_and_convolve(x64):
    x = make((4, 6), "float64", 3)
    g = jax.jit(jax.grad(lambda v: jnp.sum(jnp.abs(nvdispatch.fft.rfft(v, n=8)) ** 2)))(x)
    v = make(x.shape, "float64", 4)
    f = lambda t: float(np.sum(np.abs(np.fft.rfft(x + t * v, n=8)) ** 2))
    assert abs((f(1e-6) - f(-1e-6)) / 2e-6 - float(np.sum(np.asarray(g) * v))) <= 1e-6 * f(0)
    h = np.fft.rfft(np.r_[1.0, 1.0, 1.0, np.zeros(5)] / 3)
    got = jax.jit(lambda v: nvdispatch.fft.convolve(v, h, n=8))(x)
    fft_close(np.asarray(got), np.fft.irfft(np.fft.rfft(x, 8) * h, 8), "float64")


# -- what only the GPU shows ------------------------------------------------------------------------------------------
def _layer(x, w, bias):
    return nvdispatch.matmul(x, w, epilog="RELU_BIAS", epilog_inputs={"bias": bias})


def test_no_host_transfer_inside_the_program(_placed):
    rng = np.random.default_rng(0)
    x, w, bias = (jax.device_put(rng.standard_normal(s).astype(np.float32), _placed) for s in ((64, 32), (32, 16), (16,)))
    step = jax.jit(jax.grad(lambda w, bias: jnp.sum(_layer(x, w, bias) ** 2), argnums=(0, 1)))
    fwd = jax.jit(lambda x: nvdispatch.fft.irfft(nvdispatch.fft.rfft(x)))
    jax.block_until_ready((step(w, bias), fwd(x)))  # compiled
    with jax.transfer_guard("disallow"):
        gw, gb = step(w, bias)
        y = fwd(x)
        jax.block_until_ready((gw, gb, y))
    z = np.asarray(x, np.float64) @ np.asarray(w, np.float64) + np.asarray(bias, np.float64)
    dz = 2 * np.maximum(z, 0)
    np.testing.assert_allclose(np.asarray(gw), np.asarray(x, np.float64).T @ dz, rtol=2e-2, atol=2e-2)  # TF32
    np.testing.assert_allclose(np.asarray(gb), dz.sum(0), rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-4, atol=1e-4)


def test_each_fused_call_is_one_cublaslt_launch_into_xla_buffers(launches):
    rng = np.random.default_rng(2)
    x, w, bias = (rng.integers(-3, 4, s).astype(np.float32) for s in ((64, 32), (32, 16), (16,)))
    jax.jit(_layer)(x, w, bias).block_until_ready()
    assert launches["lt"] == ["RELU_BIAS"] and launches["launches"] == 1
    launches["lt"].clear()
    launches["launches"] = 0
    jax.jit(jax.grad(lambda w, bias: jnp.sum(_layer(x, w, bias)), argnums=(0, 1)))(w, bias)[0].block_until_ready()
    # forward; backward: the weight gradient with the bias gradient fused (BGRADB), the input gradient (DCE'd
    # by XLA where unused: x is a constant here)
    assert sorted(launches["lt"]) in (["BGRADB", "RELU_BIAS"], ["BGRADB", "DEFAULT", "RELU_BIAS"])
    assert launches["launches"] == len(launches["lt"])  # one cublasLtMatmul each
    jax.jit(lambda v: nvdispatch.fft.fft(v))(make((8, 16), "complex64")).block_until_ready()
    assert launches["cufft"] and all(launches["cufft"])  # into XLA's output buffer


def test_jax_precision_setting_chooses_the_compute_type(launches):
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((256, 512)).astype(np.float32), rng.standard_normal((512, 128)).astype(np.float32)
    want = a.astype(np.float64) @ b
    default = jax.jit(lambda a, b: nvdispatch.matmul(a, b, epilog="RELU"))(a, b)
    with jax.default_matmul_precision("highest"):
        highest = jax.jit(lambda a, b: nvdispatch.matmul(a, b, epilog="RELU"))(a, b)
    explicit = jax.jit(lambda a, b: nvdispatch.matmul(a, b, epilog="RELU", options={"compute_type": "COMPUTE_32F"}))(a, b)
    assert launches["compute"] == [ComputeType.COMPUTE_32F_FAST_TF32, ComputeType.COMPUTE_32F, ComputeType.COMPUTE_32F]
    scale = np.abs(want).max()
    assert np.abs(np.asarray(highest) - np.maximum(want, 0)).max() <= 1e-5 * scale
    assert np.abs(np.asarray(explicit) - np.maximum(want, 0)).max() <= 1e-5 * scale
    assert np.abs(np.asarray(default) - np.maximum(want, 0)).max() <= 5e-3 * scale  # TF32's bound, as jnp's


def test_retracing_finds_the_same_plans():
    rng = np.random.default_rng(4)
    x, w, bias = (rng.standard_normal(s).astype(np.float32) for s in ((64, 32), (32, 16), (16,)))
    f = lambda x, w, bias: nvdispatch.fft.rfft(_layer(x, w, bias))
    jax.jit(f)(x, w, bias).block_until_ready()
    misses = plan_cache.stats()["misses"]
    jax.clear_caches()
    jax.jit(lambda *a: f(*a))(x, w, bias).block_until_ready()
    assert plan_cache.stats()["misses"] == misses


def test_many_calls_with_changing_inputs():
    rng = np.random.default_rng(5)
    step = jax.jit(_layer)
    w, bias = rng.integers(-3, 4, (32, 16)).astype(np.float32), rng.integers(-3, 4, 16).astype(np.float32)
    for _ in range(50):
        x = rng.integers(-3, 4, (64, 32)).astype(np.float32)
        got = step(x, w, bias)
        assert_close(np.asarray(got), np.maximum(x.astype(np.float64) @ w + bias, 0), "float32")


def test_bf16_mlp_training_step_matches_a_float32_reference():
    rng = np.random.default_rng(6)
    widths = (64, 128, 128, 32)
    params = [(jnp.asarray(rng.standard_normal((i, o)) / np.sqrt(i), jnp.bfloat16), jnp.zeros(o, jnp.bfloat16))
              for i, o in zip(widths[:-1], widths[1:])]
    x = jnp.asarray(rng.standard_normal((256, widths[0])), jnp.bfloat16)

    def loss(params, layer):
        h = x
        for w, b in params:
            h = layer(h, w, b)
        return jnp.mean(h.astype(jnp.float32) ** 2)

    ours = lambda h, w, b: nvdispatch.matmul(h, w, epilog="GELU_BIAS", epilog_inputs={"bias": b})
    ref = lambda h, w, b: jax.nn.gelu((h.astype(jnp.float32) @ w.astype(jnp.float32) + b), approximate=True).astype(h.dtype)
    got = jax.jit(jax.grad(lambda p: loss(p, ours)))(params)
    want = jax.jit(jax.grad(lambda p: loss(p, ref)))(params)
    for g, r in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        g, r = np.asarray(g, np.float32), np.asarray(r, np.float32)
        assert np.abs(g - r).max() <= 5e-2 * max(np.abs(r).max(), 1e-3)
