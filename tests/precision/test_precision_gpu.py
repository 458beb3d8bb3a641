"""Precision conventions on the GPU (issue 29): Torch's TF32 switch and autocast regions, JAX's default matmul
precision and CuPy's compute type decide what cuBLASLt runs, and the values are within that precision's error
bound of a float64 reference (TF32: inputs rounded to 10 mantissa bits; bfloat16: 7 bits and a bfloat16 result),
bounds that grow with K. That TF32 really ran is seen in the error too: well above float32's, within TF32's."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
from nvdispatch import ComputeType, Epilog
from nvdispatch._epilog import EPILOGS

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
F = torch.nn.functional

TF32 = ComputeType.COMPUTE_32F_FAST_TF32
M, N, K = 256, 192, 1024


@pytest.fixture(autouse=True)
def _fresh():
    if not torch.cuda.is_available():
        pytest.skip("this Torch has no CUDA")
    saved = torch.backends.cuda.matmul.allow_tf32
    nvdispatch.plan_cache.clear()
    yield
    torch.backends.cuda.matmul.allow_tf32 = saved
    nvdispatch.plan_cache.clear()


def _operands(dtype=torch.float32, m=M, n=N, k=K, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (
        torch.randn(m, k, device="cuda", dtype=dtype, generator=g),
        torch.randn(k, n, device="cuda", dtype=dtype, generator=g),
        torch.randn(n, device="cuda", dtype=dtype, generator=g),
    )


def _f64(x) -> np.ndarray:
    return x.detach().double().cpu().numpy()


def _bound(a, b, bits: int, result_bits: int | None = None, ref=None) -> np.ndarray:
    """Elementwise error bound of a product whose inputs are rounded to ``bits`` mantissa bits and summed in
    float32 over K (``2 u_in + K u_32`` times ``|a| @ |b|``, doubled for the rounding mode), plus the rounding of
    the result to ``result_bits`` bits where it is stored narrower."""
    k = a.shape[-1]
    bound = 2 * (2.0**-bits + k * 2.0**-24) * (np.abs(_f64(a)) @ np.abs(_f64(b)))
    if result_bits is not None:
        bound = bound + 2.0**-result_bits * np.abs(ref)
    return bound + 1e-30


def _relu_bias_reference(a, b, bias):
    return np.maximum(_f64(a) @ _f64(b) + _f64(bias), 0)


# -- Torch TF32 ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("epilog", ["RELU_BIAS", "BIAS", "GELU_BIAS", None], ids=str)
def test_torch_allow_tf32_runs_float32_products_on_tf32_within_its_bound(epilog):
    a, b, bias = _operands()
    kw = {"epilog": epilog, "epilog_inputs": {"bias": bias}} if epilog else {}
    ref = (
        _f64(F.gelu(F.linear(a.double(), b.double().T, bias.double()), approximate="tanh"))
        if epilog == "GELU_BIAS"
        else None
    )
    if epilog in ("RELU_BIAS", None, "BIAS"):
        d = _f64(a) @ _f64(b)
        ref = {"RELU_BIAS": np.maximum(d + _f64(bias), 0), "BIAS": d + _f64(bias), None: d}[epilog]
    torch.backends.cuda.matmul.allow_tf32 = False
    full = nvdispatch.matmul(a, b, **kw)
    full_err = float(np.max(np.abs(_f64(full) - ref)))
    torch.backends.cuda.matmul.allow_tf32 = True
    e = nvdispatch.explain(a, b, **kw)
    got = nvdispatch.matmul(a, b, **kw)
    assert e.precision == "compute type COMPUTE_32F_FAST_TF32: Torch allow_tf32=True", str(e)
    if e.executor == "cuda":  # our cuBLASLt plan (a plain product is torch.matmul's: Torch's own TF32)
        assert any("compute type 77" in s for s in e.steps), str(e)
    err = np.abs(_f64(got) - ref)
    assert np.all(err <= 1.2 * _bound(a, b, 10)), str(e)
    assert float(err.max()) > 10 * full_err, f"TF32 did not run: error {err.max()} vs float32's {full_err}\n{e}"
    assert got.dtype == torch.float32


def test_a_tf32_setting_changed_between_two_calls_changes_the_gpu_plan():
    a, b, bias = _operands()
    kw = {"epilog": "RELU_BIAS", "epilog_inputs": {"bias": bias}}
    torch.backends.cuda.matmul.allow_tf32 = False
    nvdispatch.matmul(a, b, **kw)
    misses = nvdispatch.plan_cache.misses
    nvdispatch.matmul(a, b, **kw)
    assert nvdispatch.plan_cache.misses == misses
    torch.backends.cuda.matmul.allow_tf32 = True
    tf32 = nvdispatch.matmul(a, b, **kw)
    assert nvdispatch.plan_cache.misses == misses + 1
    torch.backends.cuda.matmul.allow_tf32 = False
    full = nvdispatch.matmul(a, b, **kw)
    assert nvdispatch.plan_cache.misses == misses + 1
    ref = _relu_bias_reference(a, b, bias)
    assert np.abs(_f64(full) - ref).max() * 10 < np.abs(_f64(tf32) - ref).max()


def test_complex64_products_follow_tf32_too():
    g = torch.Generator(device="cuda").manual_seed(1)
    a = torch.randn(64, 512, device="cuda", dtype=torch.complex64, generator=g)
    b = torch.randn(512, 48, device="cuda", dtype=torch.complex64, generator=g)
    bias = torch.randn(48, device="cuda", dtype=torch.complex64, generator=g)
    torch.backends.cuda.matmul.allow_tf32 = True
    e = nvdispatch.explain(a, b, epilog="BIAS", epilog_inputs={"bias": bias})
    got = nvdispatch.matmul(a, b, epilog="BIAS", epilog_inputs={"bias": bias})
    assert e.problem.options.compute_type is TF32
    ref = a.cpu().numpy().astype(np.complex128) @ b.cpu().numpy() + bias.cpu().numpy()
    bound = 4 * (2.0**-10 + 512 * 2.0**-24) * (np.abs(a.cpu().numpy()) @ np.abs(b.cpu().numpy())) * 2
    assert np.all(np.abs(got.cpu().numpy() - ref) <= bound), str(e)


def test_an_explicit_compute_type_wins_over_tf32():
    a, b, bias = _operands()
    torch.backends.cuda.matmul.allow_tf32 = True
    opts = {"compute_type": "COMPUTE_32F"}
    got = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}, options=opts)
    err = np.abs(_f64(got) - _relu_bias_reference(a, b, bias))
    assert np.all(err <= 4 * K * 2.0**-24 * (np.abs(_f64(a)) @ np.abs(_f64(b))) + 1e-30)


def test_on_torchs_own_ops_an_explicit_compute_type_and_a_matmuls_plan_win_over_tf32():
    # the Torch executor computes with Torch's ops, which read allow_tf32 when they run: raised for the call
    a, b, bias = _operands()
    ref = _relu_bias_reference(a, b, bias)
    fp32_bound = 4 * K * 2.0**-24 * (np.abs(_f64(a)) @ np.abs(_f64(b))) + 1e-30
    with nvdispatch.set_backend("torch"):
        torch.backends.cuda.matmul.allow_tf32 = False
        mm = nvdispatch.Matmul(a, b).plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        torch.backends.cuda.matmul.allow_tf32 = True
        opts = {"compute_type": "COMPUTE_32F"}
        got = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}, options=opts)
        kept = mm.execute()
        tf32 = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})  # the convention: TF32
    assert mm.executor == "torch"
    assert np.all(np.abs(_f64(got) - ref) <= fp32_bound) and np.all(np.abs(_f64(kept) - ref) <= fp32_bound)
    assert float(np.abs(_f64(tf32) - ref).max()) > 10 * float(np.abs(_f64(got) - ref).max())
    assert torch.backends.cuda.matmul.allow_tf32  # the caller's setting again
    mm.free()


def test_a_matmul_keeps_the_tf32_setting_of_its_plan():
    a, b, bias = _operands()
    torch.backends.cuda.matmul.allow_tf32 = True
    mm = nvdispatch.Matmul(a, b).plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    torch.backends.cuda.matmul.allow_tf32 = False
    ref = _relu_bias_reference(a, b, bias)
    full_err = float(
        np.abs(_f64(nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})) - ref).max()
    )
    kept = float(np.abs(_f64(mm.execute()) - ref).max())
    assert kept > 10 * full_err  # still TF32
    mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    assert float(np.abs(_f64(mm.execute()) - ref).max()) < 10 * full_err + 1e-6
    mm.free()


def test_autotune_keeps_tf32():
    a, b, bias = _operands()
    torch.backends.cuda.matmul.allow_tf32 = True
    mm = nvdispatch.Matmul(a, b).plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    mm.autotune(iterations=2)
    assert mm._problem.options.compute_type is TF32
    got = mm.execute()
    assert np.all(np.abs(_f64(got) - _relu_bias_reference(a, b, bias)) <= 1.2 * _bound(a, b, 10))
    mm.free()


# -- Torch autocast on CUDA ---------------------------------------------------------------------------------------------
def _torch_analog(name, a, b, bias, inputs):
    pre = F.linear(a, b.T, bias) if ("BIAS" in name and not name.startswith("D")) else torch.matmul(a, b)
    if name.startswith("DRELU"):
        return pre * inputs["relu_aux"]
    if name.startswith("DGELU"):
        return pre * inputs["gelu_aux"].to(pre.dtype)
    if "RELU" in name:
        return torch.relu(pre)
    if "GELU" in name:
        return F.gelu(pre, approximate="tanh")
    return pre


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("name", [e.name for e in EPILOGS])
def test_cuda_autocast_results_have_torchs_dtype_and_bf16_accuracy_for_every_epilog(name, dtype):
    spec = EPILOGS[Epilog[name]]
    a, b, bias = _operands(m=64, n=48, k=512)
    pre = torch.randn(64, 48, device="cuda", generator=torch.Generator(device="cuda").manual_seed(5))
    inputs = {}
    if "bias" in spec.inputs:
        inputs["bias"] = bias
    if "relu_aux" in spec.inputs:
        inputs["relu_aux"] = pre > 0
    if "gelu_aux" in spec.inputs:
        inputs["gelu_aux"] = pre
    with torch.autocast("cuda", dtype=dtype):
        e = nvdispatch.explain(a, b, epilog=name, epilog_inputs=inputs or None)
        got = nvdispatch.matmul(a, b, epilog=name, epilog_inputs=inputs or None)
        again = nvdispatch.matmul(a, b, epilog=name, epilog_inputs=inputs or None)
        want_dtype = _torch_analog(name, a, b, bias, inputs).dtype
    out, aux = got if spec.outputs else (got, {})
    out2, _ = again if spec.outputs else (again, {})
    assert out.dtype == out2.dtype == want_dtype == dtype, str(e)
    cast = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in inputs.items()}
    hand = nvdispatch.matmul(a.to(dtype), b.to(dtype), epilog=name, epilog_inputs=cast or None)
    hand_aux = hand[1] if spec.outputs else {}
    assert {k: v.dtype for k, v in aux.items()} == {k: v.dtype for k, v in hand_aux.items()}, str(e)
    # values: within the narrow dtype's bound of the float64 product of the cast operands
    ac, bc = a.to(dtype), b.to(dtype)
    d = _f64(ac) @ _f64(bc)
    if "bias" in cast and not name.startswith("D"):
        d = d + _f64(cast["bias"])
    if name.startswith("DRELU"):
        ref = np.where(_f64(inputs["relu_aux"]) > 0, d, 0)
    elif name.startswith("DGELU"):
        x = _f64(cast["gelu_aux"])
        u = np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)
        ref = d * (0.5 * (1 + np.tanh(u)) + 0.5 * x * np.sqrt(2 / np.pi) * (1 + 3 * 0.044715 * x**2) / np.cosh(u) ** 2)
    elif "RELU" in name:
        ref = np.maximum(d, 0)
    elif "GELU" in name:
        ref = _f64(F.gelu(torch.from_numpy(d), approximate="tanh"))
    else:
        ref = d
    bits = 8 if dtype == torch.bfloat16 else 11
    bound = 1.5 * _bound(ac, bc, 24, bits, ref) + 2.0**-bits * (np.abs(d) + 1)
    assert np.all(np.abs(_f64(out) - ref) <= bound), str(e)


def test_a_matmul_planned_in_a_cuda_region_keeps_it():
    a, b, bias = _operands()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        mm = nvdispatch.Matmul(a, b).plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    assert mm.execute().dtype == torch.bfloat16
    with torch.autocast("cuda", dtype=torch.float16):
        assert mm.execute().dtype == torch.bfloat16
    mm.free()


# -- CuPy ------------------------------------------------------------------------------------------------------------
def test_cupy_compute_type_tf32_is_followed():
    cupy = pytest.importorskip("cupy")
    from cupy._core import _routines_linalg as linalg

    saved = linalg.get_compute_type(np.float32)
    g = np.random.default_rng(0)
    a = cupy.asarray(g.standard_normal((M, K)).astype(np.float32))
    b = cupy.asarray(g.standard_normal((K, N)).astype(np.float32))
    bias = cupy.asarray(g.standard_normal(N).astype(np.float32))
    ref = np.maximum(a.get().astype(np.float64) @ b.get() + bias.get(), 0)
    try:
        linalg.set_compute_type(np.float32, getattr(linalg, "COMPUTE_TYPE_TF32", 7))  # what CUPY_TF32=1 makes it
        e = nvdispatch.explain(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        tf32 = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}).get()
        plain = nvdispatch.explain(a, b)
        linalg.set_compute_type(np.float32, getattr(linalg, "COMPUTE_TYPE_DEFAULT", 1))
        full = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}).get()
    finally:
        linalg.set_compute_type(np.float32, saved)
    assert e.problem.options.compute_type is TF32 and e.precision.startswith("compute type COMPUTE_32F_FAST_TF32: CuPy")
    assert plain.executor == "cupy"  # cupy.matmul applies CuPy's own compute type
    bound = 1.2 * 2 * (2.0**-10 + K * 2.0**-24) * (np.abs(a.get().astype(np.float64)) @ np.abs(b.get()))
    assert np.all(np.abs(tf32 - ref) <= bound)
    assert np.abs(tf32 - ref).max() > 10 * np.abs(full - ref).max()


# -- JAX ---------------------------------------------------------------------------------------------------------------
def test_jax_default_precision_runs_tf32_and_highest_float32():
    jax = pytest.importorskip("jax")
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("this JAX has no GPU backend")
    g = np.random.default_rng(0)
    a64, b64 = g.standard_normal((M, K)), g.standard_normal((K, N))
    a = jax.device_put(a64.astype(np.float32), gpu)
    b = jax.device_put(b64.astype(np.float32), gpu)
    ref = a64.astype(np.float32).astype(np.float64) @ b64.astype(np.float32).astype(np.float64)
    default = np.asarray(nvdispatch.matmul(a, b))
    e = nvdispatch.explain(a, b)
    with jax.default_matmul_precision("highest"):
        highest = np.asarray(nvdispatch.matmul(a, b))
        e_high = nvdispatch.explain(a, b)
    jnp_default = np.asarray(jax.numpy.dot(a, b))
    assert e.problem.options.compute_type is TF32 and "JAX default_matmul_precision unset (DEFAULT)" in e.precision
    assert e_high.problem.options.compute_type is None and "HIGHEST" in e_high.precision
    bound = 1.2 * 2 * (2.0**-10 + K * 2.0**-24) * (np.abs(a64) @ np.abs(b64))
    assert np.all(np.abs(default - ref) <= bound)
    assert np.abs(default - ref).max() > 10 * np.abs(highest - ref).max()
    # the same precision as JAX's own product at its default
    assert np.abs(default - ref).max() < 4 * np.abs(jnp_default - ref).max() + 1e-6
