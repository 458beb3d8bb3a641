"""The FP8 reference path (Torch on the CPU) against the float64 emulation in fp8_emulation.py."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
from nvdispatch import MatmulQuantizationScales

from .fp8_emulation import FP8_MAX, assert_matches, emulate, f64

torch = pytest.importorskip("torch")

E4M3, E5M2 = "float8_e4m3fn", "float8_e5m2"


def fp8(shape, dtype=E4M3, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * scale
    limit = FP8_MAX[dtype]
    return x.clamp(-limit, limit).to(getattr(torch, dtype))


def bf16(shape, seed=1, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(torch.bfloat16)


@pytest.mark.parametrize("m,n,k", [(16, 32, 48), (17, 33, 5), (64, 16, 128), (1, 7, 3)])
@pytest.mark.parametrize("result_type", ["float8_e4m3fn", "bfloat16", "float16", "float32"])
def test_shapes_and_result_types(m, n, k, result_type):
    a, b = fp8((m, k), seed=m), fp8((k, n), seed=n)
    scales = {"a": 0.5, "b": 1.5} | ({"d": 0.25} if result_type == E4M3 else {})
    r = nvdispatch.matmul(a, b, quantization_scales=scales, options={"result_type": result_type})
    assert r.dtype == getattr(torch, result_type)
    _, _, want, abs_sum, _ = emulate(a, b, scales=scales, result_type=result_type)
    assert_matches(r, want, abs_sum, result_type, extra_scale=scales.get("d", 1.0))


@pytest.mark.parametrize("result_type", [E4M3, E5M2, "bfloat16", "float16", "float32"])
def test_e4m3_e5m2_mix_every_result_type(result_type):
    a, b = fp8((24, 40), E4M3, seed=2), fp8((40, 32), E5M2, scale=4.0, seed=3)
    scales = {"a": 2.0, "b": 0.125} | ({"d": 2.0} if result_type.startswith("float8") else {})
    r = nvdispatch.matmul(a, b, quantization_scales=scales, options={"result_type": result_type})
    _, _, want, abs_sum, _ = emulate(a, b, scales=scales, result_type=result_type)
    assert_matches(r, want, abs_sum, result_type, extra_scale=scales.get("d", 1.0))


@pytest.mark.parametrize("d_scale", [1.0, 1 / 64, 8.0, 1e4])
def test_scale_values_and_saturation(d_scale):
    a, b = fp8((32, 64), seed=4), fp8((64, 16), seed=5)
    scales = MatmulQuantizationScales(a=1.0, b=1.0, d=d_scale)
    r, aux = nvdispatch.matmul(a, b, quantization_scales=scales, options={"result_amax": True})
    t, amax, want, abs_sum, _ = emulate(a, b, scales={"d": d_scale}, result_type=E4M3)
    assert_matches(r, want, abs_sum, E4M3, extra_scale=d_scale)
    assert aux["result_amax"].dtype == torch.float32 and aux["result_amax"].shape == ()
    assert abs(float(aux["result_amax"]) - amax) <= 1e-5 * amax + 1e-6
    if d_scale == 1e4:  # most values exceed 448 after scaling: they saturate, none becomes NaN or inf
        got = f64(r)
        assert np.isfinite(got).all() and (np.abs(got) == 448).mean() > 0.5


@pytest.mark.parametrize("epilog", ["BIAS", "RELU_BIAS", "GELU_BIAS", "GELU_AUX_BIAS", "RELU", "GELU"])
@pytest.mark.parametrize("result_type", [E4M3, "bfloat16", "float32"])
def test_epilogs(epilog, result_type):
    a, b = fp8((48, 32), seed=6), fp8((32, 24), seed=7)
    bias = bf16((24,), seed=8) if "BIAS" in epilog else None
    scales = {"a": 0.75, "b": 0.5} | ({"d": 3.0} if result_type == E4M3 else {})
    kwargs = {"epilog_inputs": {"bias": bias}} if bias is not None else {}
    out = nvdispatch.matmul(
        a, b, epilog=epilog, quantization_scales=scales, options={"result_type": result_type}, **kwargs
    )
    _, _, want, abs_sum, pre = emulate(a, b, scales=scales, bias=bias, epilog=epilog, result_type=result_type)
    if epilog == "GELU_AUX_BIAS":
        out, aux = out
        assert aux["gelu_aux"].dtype == getattr(torch, result_type)  # cuBLASLt's default aux type: the result's
        lim = FP8_MAX.get(result_type, np.inf)
        assert_matches(aux["gelu_aux"], np.clip(pre, -lim, lim), abs_sum + 1, result_type)
    # GELU/RELU are 1-Lipschitz-ish: the product's accumulation error passes through at most ~1.13x
    assert_matches(out, want, abs_sum * 1.2 + 1e-3, result_type, extra_scale=scales.get("d", 1.0))


def test_c_beta_alpha_and_c_scale():
    a, b = fp8((16, 32), seed=9), fp8((32, 48), seed=10)
    c = bf16((16, 48), seed=11)
    scales = {"a": 0.5, "b": 2.0, "c": 0.25, "d": 0.5}
    r = nvdispatch.matmul(a, b, c, alpha=1.5, beta=-2.0, quantization_scales=scales, options={"result_type": E4M3})
    _, _, want, abs_sum, _ = emulate(a, b, alpha=1.5, scales=scales, c=c, beta=-2.0, result_type=E4M3)
    assert_matches(r, want, abs_sum + 1, E4M3, extra_scale=0.5)
    # c's type picks the result type when none is given (nvmath's rule)
    r = nvdispatch.matmul(a, b, c, quantization_scales={"a": 0.5})
    assert r.dtype == torch.bfloat16


def test_tensor_scales_batches_and_vectors():
    a, b = fp8((3, 16, 32), seed=12), fp8((32, 8), seed=13)
    sa, sd = torch.tensor(0.5), torch.tensor([4.0])
    r = nvdispatch.matmul(a, b, quantization_scales={"a": sa, "d": sd})
    assert r.shape == (3, 16, 8) and r.dtype == torch.float8_e4m3fn
    want = np.stack([emulate(a[i], b, scales={"a": 0.5, "d": 4.0}, result_type=E4M3)[2] for i in range(3)])
    sums = np.stack([emulate(a[i], b)[3] for i in range(3)])
    assert_matches(r, want, sums * 0.5, E4M3, extra_scale=4.0)
    v = fp8((32,), seed=14)
    r = nvdispatch.matmul(v, b, options={"result_type": "float32"})
    assert r.shape == (8,)
    np.testing.assert_allclose(f64(r), f64(v) @ f64(b), rtol=1e-6, atol=1e-5)


def test_inputs_are_not_modified_and_explain_names_the_path():
    a, b = fp8((16, 16), seed=15), fp8((16, 16), seed=16)
    bias = bf16((16,))
    a0, b0, bias0 = a.clone(), b.clone(), bias.clone()
    nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}, quantization_scales={"a": 2.0})
    assert torch.equal(a.view(torch.uint8), a0.view(torch.uint8)) and torch.equal(
        b.view(torch.uint8), b0.view(torch.uint8)
    )
    assert torch.equal(bias, bias0)
    ex = nvdispatch.explain(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}, quantization_scales={"a": 2.0})
    text = str(ex)
    assert ex.executor == "torch" and "FP8 reference path" in text and "operands are on the CPU" in text


def test_uint8_storage_with_declared_types():
    a, b = fp8((16, 32), seed=17), fp8((32, 16), seed=18)
    want = nvdispatch.matmul(a, b, options={"result_type": "float32"})
    got = nvdispatch.matmul(
        a.view(torch.uint8),
        b.view(torch.uint8),
        options={"result_type": "float32", "operand_types": {"a": E4M3, "b": E4M3}},
    )
    assert torch.equal(got, want)


def test_stateful_matmul_with_scales():
    a, b = fp8((32, 16), seed=19), fp8((16, 32), seed=20)
    bias = bf16((32,))
    with nvdispatch.Matmul(a, b, quantization_scales={"a": 1.0, "d": 2.0}, options={"result_amax": True}) as mm:
        mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        r1, aux1 = mm.execute()
        mm.reset_operands(quantization_scales={"a": 0.5, "d": 2.0})
        r2, aux2 = mm.execute()
    assert abs(float(aux2["result_amax"]) - 0.5 * float(aux1["result_amax"])) < 0.05 * float(aux1["result_amax"])
    _, _, want, abs_sum, _ = emulate(a, b, scales={"a": 0.5, "d": 2.0}, bias=bias, epilog="RELU_BIAS", result_type=E4M3)
    assert_matches(r2, want, abs_sum + 1e-3, E4M3, extra_scale=2.0)


def test_fast_accumulation_is_a_kernel_mode_the_reference_accumulates_in_float32():
    a, b = fp8((32, 64), seed=21), fp8((64, 48), seed=22)
    kw = {"quantization_scales": {"a": 0.5}, "options": {"result_type": "float32", "fast_accumulation": True}}
    got = nvdispatch.matmul(a, b, **kw)
    want = nvdispatch.matmul(a, b, quantization_scales={"a": 0.5}, options={"result_type": "float32"})
    assert torch.equal(got, want)
    text = str(nvdispatch.explain(a, b, **kw))
    assert "fast accumulation" in text and "accumulates in float32" in text


@pytest.mark.parametrize("form", ["dict", "MatmulQuantizationScales"])
def test_repeated_calls_with_new_scale_values_find_their_plan_and_use_the_new_values(form, full_paths):
    # the key holds each scale's kind (a Python number's class), never its value: every call scales by its own
    nvdispatch.plan_cache.clear()
    a, b = fp8((16, 32), seed=20), fp8((32, 8), seed=21)
    for i, (sa, sd) in enumerate([(0.5, 2.0), (1.5, 0.25), (4, 1.0), (0.5, 2.0)]):
        scales = {"a": sa, "d": sd} if form == "dict" else MatmulQuantizationScales(a=sa, d=sd)
        if i == 1:
            full_paths[0] = 0
        r = nvdispatch.matmul(a, b, quantization_scales=scales)
        _, _, want, abs_sum, _ = emulate(a, b, scales={"a": float(sa), "d": float(sd)}, result_type=E4M3)
        assert_matches(r, want, abs_sum, E4M3, extra_scale=sd)
    assert full_paths[0] == 1  # the int scale: a class of its own, planned once


def test_bad_scale_values_are_reported_every_call_and_host_scale_arrays_always_checked(full_paths):
    a, b = fp8((16, 32), seed=22), fp8((32, 8), seed=23)
    nvdispatch.matmul(a, b, quantization_scales={"a": 0.5})
    for bad in (0.0, float("inf"), float("nan")):
        for _ in range(2):
            with pytest.raises(nvdispatch.errors.InvalidArgumentError, match="quantization_scales"):
                nvdispatch.matmul(a, b, quantization_scales={"a": bad})
    # a scale array in host memory: planning reads its value, so no key stands for it
    full_paths[0] = 0
    for value in (0.5, 2.0):
        nvdispatch.matmul(a, b, quantization_scales={"a": torch.tensor(value)})
    with pytest.raises(nvdispatch.errors.InvalidArgumentError, match="quantization_scales"):
        nvdispatch.matmul(a, b, quantization_scales={"a": torch.tensor(0.0)})
    assert full_paths[0] == 3


def test_an_unknown_scale_name_is_reported_even_after_a_keyed_call():
    a, b = fp8((16, 32), seed=24), fp8((32, 8), seed=25)
    for _ in range(2):
        nvdispatch.matmul(a, b, quantization_scales={"a": 0.5})
        with pytest.raises(nvdispatch.errors.InvalidArgumentError, match="unknown key"):
            nvdispatch.matmul(a, b, quantization_scales={"a": 0.5, "x": None})


def test_scale_tensors_are_passed_as_they_are_not_copied():
    from nvdispatch._fp8 import scale_values

    sa = torch.tensor(0.5)
    assert scale_values(MatmulQuantizationScales(a=sa, d=2.0)) == {"a": sa, "d": 2.0}
    assert scale_values(MatmulQuantizationScales(a=sa))["a"] is sa
