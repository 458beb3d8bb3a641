"""FP8 on the GPU: the cuBLASLt path against the float64 emulation, the CPU reference path and
torch._scaled_mm; device scales, amax, CuPy bytes; autotuning that persists across processes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import nvdispatch

from .fp8_emulation import ACC_FP8_FAST, ACC_FP8_TENSOR_CORES, FP8_MAX, emulate, f64
from .fp8_emulation import assert_matches as _assert_matches

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
E4M3, E5M2 = "float8_e4m3fn", "float8_e5m2"


def assert_matches(*args, **kwargs):
    """The emulation check with the accumulation allowance of FP8 tensor cores."""
    return _assert_matches(*args, acc_eps=ACC_FP8_TENSOR_CORES, **kwargs)


def lt_can(m, n, k, result_type) -> bool:
    """Whether cuBLASLt runs the shape (measured on the H200: FP8 results need the extent along the bias, N
    here, a multiple of 16; for 33x17 its heuristic offered no kernel at all, so odd N are counted out; any K
    runs, zero-padded to a multiple of 16); other shapes take the reference path."""
    return n % 2 == 0 and (not result_type.startswith("float8") or n % 16 == 0)


def fp8(shape, dtype=E4M3, scale=1.0, seed=0, device="cuda"):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * scale).clamp(-FP8_MAX[dtype], FP8_MAX[dtype])
    return x.to(getattr(torch, dtype)).to(device)


def bf16(shape, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(torch.bfloat16).to("cuda")


def fp8_capable() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


needs_fp8 = pytest.mark.skipif(not fp8_capable(), reason="needs compute capability 8.9+")


def run_both(a, b, **kw):
    """(cuBLASLt result, CPU reference result, explanation) of one call."""
    got = nvdispatch.matmul(a, b, **kw)
    ex = nvdispatch.explain(a, b, **kw)
    cpu = {k: v for k, v in kw.items()}
    if "epilog_inputs" in kw:
        cpu["epilog_inputs"] = {k: v.cpu() for k, v in kw["epilog_inputs"].items()}
    if kw.get("quantization_scales"):  # None (no scales) passes through as it is
        cpu["quantization_scales"] = {
            k: (v.cpu() if hasattr(v, "cpu") else v) for k, v in kw["quantization_scales"].items()
        }
    ref = nvdispatch.matmul(a.cpu(), b.cpu(), **cpu)
    return got, ref, ex


@needs_fp8
@pytest.mark.parametrize("m,n,k", [(64, 48, 32), (40, 24, 48), (33, 17, 20), (64, 48, 40), (128, 256, 512)])
@pytest.mark.parametrize("result_type", [E4M3, "bfloat16", "float16", "float32"])
@pytest.mark.parametrize("b_layout", ["row", "col"])
def test_cublaslt_vs_emulation_and_reference(m, n, k, result_type, b_layout):
    a = fp8((m, k), seed=m)
    b = fp8((k, n), seed=n) if b_layout == "row" else fp8((n, k), seed=n).t()
    scales = {"a": 0.5, "b": 2.0} | ({"d": 0.25} if result_type == E4M3 else {})
    got, ref, ex = run_both(a, b, quantization_scales=scales, options={"result_type": result_type})
    if lt_can(m, n, k, result_type):
        assert ex.executor == "cuda" and any("cublasLtMatmul FP8" in s for s in ex.steps), str(ex)
    else:  # the reference path on the GPU, and explain() says why
        assert ex.executor == "torch" and "no FP8 kernel" in str(ex), str(ex)
    assert got.dtype == getattr(torch, result_type) and got.device.type == "cuda"
    _, _, want, abs_sum, _ = emulate(a, b, scales=scales, result_type=result_type)
    assert_matches(got, want, abs_sum, result_type, extra_scale=scales.get("d", 1.0))
    assert_matches(got, f64(ref), abs_sum + np.abs(f64(ref)) * 0, result_type, extra_scale=2.0)


@needs_fp8
@pytest.mark.parametrize("result_type", [E4M3, E5M2, "bfloat16", "float32"])
def test_mixed_formats(result_type):
    a, b = fp8((32, 64), E5M2, seed=1), fp8((64, 48), E4M3, seed=2)
    scales = {"d": 2.0} if result_type.startswith("float8") else {}
    got, _, ex = run_both(a, b, quantization_scales=scales or None, options={"result_type": result_type})
    assert ex.executor == "cuda", str(ex)
    _, _, want, abs_sum, _ = emulate(a, b, scales=scales, result_type=result_type)
    assert_matches(got, want, abs_sum, result_type, extra_scale=2.0)


@needs_fp8
@pytest.mark.parametrize("epilog", ["BIAS", "RELU_BIAS", "GELU_BIAS", "GELU_AUX_BIAS", "RELU", "GELU"])
@pytest.mark.parametrize("result_type", [E4M3, "bfloat16"])
def test_fused_epilogs_device_scales_and_amax(epilog, result_type):
    a, b = fp8((64, 96), seed=3), fp8((96, 80), seed=4)
    bias = bf16((80,), seed=5)
    scales = {"a": torch.tensor([0.5], device="cuda"), "b": 1.5}
    opts = {"result_type": result_type}
    if result_type == E4M3:
        scales["d"] = torch.tensor(2.0, device="cuda")
        opts["result_amax"] = True
    kw = {"epilog": epilog, "quantization_scales": scales, "options": opts}
    if "BIAS" in epilog:
        kw["epilog_inputs"] = {"bias": bias}
    ex = nvdispatch.explain(a, b, **kw)
    if ex.executor != "cuda":  # cuBLASLt's heuristic may lack a kernel: then the reference path must say why
        assert any("not cuBLASLt" in s for s in ex.steps), str(ex)
    out = nvdispatch.matmul(a, b, **kw)
    t, amax, want, abs_sum, pre = emulate(
        a,
        b,
        scales={"a": 0.5, "b": 1.5, "d": 2.0},
        bias=bias if "BIAS" in epilog else None,
        epilog=epilog,
        result_type=result_type,
    )
    aux = {}
    if isinstance(out, tuple):
        out, aux = out
    assert_matches(out, want, abs_sum * 1.2 + 1e-2, result_type, extra_scale=2.0)
    if result_type == E4M3:
        assert abs(float(aux["result_amax"]) - amax) <= 2e-3 * amax + 1e-3, (float(aux["result_amax"]), amax)
    if "AUX" in epilog:
        lim = FP8_MAX.get(result_type, np.inf)
        assert_matches(aux["gelu_aux"], np.clip(pre, -lim, lim), abs_sum + 1e-2, result_type)


@needs_fp8
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
def test_against_torch_scaled_mm(out_dtype):
    m, n, k = 256, 512, 128
    a, bt = fp8((m, k), seed=6), fp8((n, k), seed=7)
    b = bt.t()  # column-major, as _scaled_mm wants
    sa, sb = torch.tensor(0.5, device="cuda"), torch.tensor(0.25, device="cuda")
    bias = bf16((n,), seed=8)
    dt = getattr(torch, out_dtype)
    theirs = torch._scaled_mm(
        a, b, scale_a=sa, scale_b=sb, bias=bias if out_dtype == "bfloat16" else None, out_dtype=dt
    )
    kw = {"quantization_scales": {"a": sa, "b": sb}, "options": {"result_type": out_dtype}}
    if out_dtype == "bfloat16":
        kw |= {"epilog": "BIAS", "epilog_inputs": {"bias": bias}}
    ours = nvdispatch.matmul(a, b, **kw)
    _, _, want, abs_sum, _ = emulate(a, b, scales={"a": 0.5, "b": 0.25}, bias=kw.get("epilog_inputs", {}).get("bias"))
    assert_matches(ours, want, abs_sum, out_dtype)
    assert_matches(theirs, want, abs_sum, out_dtype)
    np.testing.assert_allclose(f64(ours), f64(theirs), rtol=2**-7, atol=1e-2)


@needs_fp8
def test_c_beta_batches_vectors_and_reference_fallback():
    a, b = fp8((3, 32, 64), seed=9), fp8((64, 48), seed=10)
    c = bf16((32, 48), seed=11)
    kw = {"alpha": 0.5, "beta": 2.0, "quantization_scales": {"c": 0.5}}
    got = nvdispatch.matmul(a, b, c, **kw)
    assert got.shape == (3, 32, 48) and got.dtype == torch.bfloat16
    with nvdispatch.set_backend("torch"):  # the reference path on the GPU
        ref = nvdispatch.matmul(a, b, c, **kw)
        ex = nvdispatch.explain(a, b, c, **kw)
    assert ex.executor == "torch" and "FP8 reference path" in str(ex)
    sums = np.abs(f64(a)) @ np.abs(f64(b)) * 0.5 + 1.0
    assert_matches(got, f64(ref), sums, "bfloat16", extra_scale=2.0)
    v = fp8((64,), seed=12)
    r = nvdispatch.matmul(v, b, options={"result_type": "float32"})
    # FP8 tensor cores accumulate with fewer bits than fp32 (measured on the H200: 2e-3 off where |v|@|b| ~ 40)
    assert_matches(r, f64(v) @ f64(b), np.abs(f64(v)) @ np.abs(f64(b)), "float32")


@needs_fp8
def test_cupy_bytes_with_declared_types():
    cupy = pytest.importorskip("cupy")
    a, b = fp8((32, 64), seed=13), fp8((64, 48), seed=14)
    want = nvdispatch.matmul(a, b, options={"result_type": "float16"})
    ca = cupy.asarray(a.view(torch.uint8))
    cb = cupy.asarray(b.view(torch.uint8))
    got = nvdispatch.matmul(ca, cb, options={"result_type": "float16", "operand_types": {"a": E4M3, "b": E4M3}})
    assert isinstance(got, cupy.ndarray) and got.dtype == np.float16
    np.testing.assert_allclose(cupy.asnumpy(got), want.cpu().numpy(), rtol=2**-10, atol=1e-3)


@needs_fp8
def test_fp8_autotune_persists_across_processes(tmp_path):
    a, b = fp8((1024, 512), seed=15), fp8((768, 512), seed=16).t()
    bias = bf16((768,), seed=17)
    kw = {"epilog": "RELU_BIAS", "epilog_inputs": {"bias": bias}}
    mm = nvdispatch.Matmul(a, b, options={"result_type": "bfloat16"})
    mm.plan(**kw)
    before = mm.execute()
    timings = mm.autotune(iterations=3)
    tuned = mm._plan.tuning()
    assert "native" in timings and tuned["env"]["gpu"] and len(tuned["data"]) == 8
    torch.testing.assert_close(mm.execute(), before, rtol=2**-7, atol=1e-2)
    path = tmp_path / "tunings.json"
    assert nvdispatch.plan_cache.save(path) >= 1
    saved = json.loads(path.read_text())["tunings"]
    assert any(
        row["kind"] == "cublaslt-algo" and row["key"][0] == "cublaslt-algo" and tuned["env"]["gpu"] in row["key"][1]
        for row in saved
    )
    script = textwrap.dedent(
        f"""
        import torch, nvdispatch
        from nvdispatch.linalg import _prepare
        from nvdispatch._route import get_plan
        nvdispatch.plan_cache.load({str(path)!r})
        g = torch.Generator().manual_seed(0)
        a = torch.zeros(1024, 512, device="cuda").to(torch.float8_e4m3fn)
        b = torch.zeros(768, 512, device="cuda").to(torch.float8_e4m3fn).t()
        bias = torch.zeros(768, device="cuda", dtype=torch.bfloat16)
        kw = dict(epilog="RELU_BIAS", epilog_inputs={{"bias": bias}}, options={{"result_type": "bfloat16"}})
        nvdispatch.matmul(a, b, **kw)  # a stateless call
        prep = _prepare(a, b, None, 1, None, kw["epilog"], kw["epilog_inputs"], kw["options"], None)
        p, sel, strategy = prep.problem, prep.selection, prep.strategy
        t = get_plan(sel.executor, "matmul", p, strategy).tuning()
        print(t["data"] if t else None)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == str(tuned["data"])


def test_bf16_autotune_times_variants_and_records_them():
    a = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1024, 1536, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(1536, device="cuda", dtype=torch.bfloat16)
    mm = nvdispatch.Matmul(a, b)
    mm.plan(epilog="GELU_BIAS", epilog_inputs={"bias": bias})
    plan = mm._plan
    from nvdispatch._cuda import lt_autotune

    labels = [label for label, _ in lt_autotune.candidates(plan.core, plan.handle)]
    assert labels and labels[0] == "heuristic #0" and len(set(labels)) == len(labels)
    assert any(" cluster " in label or " tile " in label for label in labels)  # the neighbourhood is searched
    times = plan.autotune(mm._operands(), 3)
    assert [label for label, _ in times] == labels
    choice = plan.tuning()
    assert dict(times)[choice["label"]] == choice["seconds"] <= dict(times)["heuristic #0"]
    r = nvdispatch.matmul(a, b, epilog="GELU_BIAS", epilog_inputs={"bias": bias})  # the stateless call: tuned
    torch.testing.assert_close(r, mm.execute())


@needs_fp8
@pytest.mark.parametrize("result_type", [E4M3, "bfloat16", "float32"])
def test_fast_accumulation_on_cublaslt_vs_emulation_and_scaled_mm(result_type):
    m, n, k = 256, 512, 1024
    a, bt = fp8((m, k), seed=23), fp8((n, k), seed=24)
    b = bt.t()
    bias = bf16((n,), seed=25)
    scales = {"a": 0.5, "b": 0.25} | ({"d": 0.5} if result_type == E4M3 else {})
    opts = {"result_type": result_type, "fast_accumulation": True}
    kw = {"quantization_scales": scales, "options": opts, "epilog": "RELU_BIAS", "epilog_inputs": {"bias": bias}}
    if result_type == "float32":
        kw.pop("epilog"), kw.pop("epilog_inputs")
    ex = nvdispatch.explain(a, b, **kw)
    assert ex.executor == "cuda" and "fast accumulation" in str(ex), str(ex)
    got = nvdispatch.matmul(a, b, **kw)
    _, _, want, abs_sum, _ = emulate(
        a, b, scales=scales, bias=bias if "epilog" in kw else None, epilog=kw.get("epilog", "DEFAULT"),
        result_type=result_type,
    )  # fmt: skip
    _assert_matches(got, want, abs_sum, result_type, extra_scale=scales.get("d", 1.0), acc_eps=ACC_FP8_FAST)
    if result_type == "bfloat16":  # torch's fast-accumulation kernel: the same mode
        sa, sb = torch.tensor(0.5, device="cuda"), torch.tensor(0.25, device="cuda")
        theirs = torch.relu(
            torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, bias=bias, out_dtype=torch.bfloat16, use_fast_accum=True)
        )
        np.testing.assert_allclose(f64(got), f64(theirs), rtol=2**-6, atol=5e-2)


@needs_fp8
def test_repeated_stateless_calls_scale_by_each_calls_own_device_and_host_scales():
    # the call key holds the scales' kinds and signatures, never their values: a training loop's delayed
    # scaling changes them every step, and every step must use its own
    a, b = fp8((64, 96), seed=30), fp8((96, 80), seed=31)
    bias = bf16((80,), seed=32)
    for sa, sb, sd in [(0.5, 1.5, 2.0), (2.0, 0.25, 0.5), (1.0, 1.0, 4.0), (0.5, 1.5, 2.0)]:
        scales = {"a": torch.tensor([sa], device="cuda"), "b": sb, "d": torch.tensor(sd, device="cuda")}
        kw = {"epilog": "RELU_BIAS", "epilog_inputs": {"bias": bias}, "quantization_scales": scales}
        out, aux = nvdispatch.matmul(a, b, options={"result_amax": True}, **kw)
        _, amax, want, abs_sum, _ = emulate(
            a, b, scales={"a": sa, "b": sb, "d": sd}, bias=bias, epilog="RELU_BIAS", result_type=E4M3
        )
        assert_matches(out, want, abs_sum * 1.2 + 1e-2, E4M3, extra_scale=sd)
        assert abs(float(aux["result_amax"]) - amax) <= 2e-3 * amax + 1e-3


def _plan_of(a, b, **kw):
    """The cached FP8 plan a stateless call with these arguments runs."""
    mm = nvdispatch.Matmul(a, b, quantization_scales=kw.pop("quantization_scales", None), options=kw.pop("options"))
    mm.plan(**kw)
    return mm, mm._plan


@needs_fp8
@pytest.mark.parametrize("bias_along", ["n", "m"])
@pytest.mark.parametrize("result_type", [E4M3, "bfloat16"])
@pytest.mark.parametrize("b_layout", ["row", "col"])
@pytest.mark.parametrize("batch", [(), (3,)])
def test_both_operand_orders_of_the_shared_launch_vs_emulation(bias_along, result_type, b_layout, batch):
    # the row orientation (bias along N) hands cuBLASLt b as its A; the col one (bias along M) a: the order is
    # the plan's, fixed when it is made, and both go through the one launch sequence of the regular plans
    m, n, k = 48, 64, 96
    a = fp8((*batch, m, k), seed=40)
    b = fp8((k, n), seed=41) if b_layout == "row" else fp8((n, k), seed=41).t()
    bias = bf16((n,) if bias_along == "n" else (m, 1), seed=42)
    scales = {"a": torch.tensor([0.5], device="cuda"), "b": 1.5} | ({"d": 2.0} if result_type == E4M3 else {})
    kw = {"epilog": "RELU_BIAS", "epilog_inputs": {"bias": bias}, "quantization_scales": scales}
    opts = {"result_type": result_type}
    ex = nvdispatch.explain(a, b, options=opts, **kw)
    assert ex.executor == "cuda", str(ex)
    form = "D^T = B^T A^T" if bias_along == "n" else "D = A B"
    assert any(form in s for s in ex.steps), str(ex)
    mm, plan = _plan_of(a, b, options=opts, **kw)
    assert plan.launch.a_first == (bias_along == "m")
    for got in (nvdispatch.matmul(a, b, options=opts, **kw), mm.execute()):
        _, _, want, abs_sum, _ = emulate(
            a, b, scales={"a": 0.5, "b": 1.5, "d": 2.0}, bias=bias, epilog="RELU_BIAS", result_type=result_type
        )
        assert got.shape == (*batch, m, n) and got.dtype == getattr(torch, result_type)
        assert_matches(got, want, abs_sum * 1.2 + 1e-2, result_type, extra_scale=2.0)
    mm.free()


@needs_fp8
@pytest.mark.parametrize("offset", [16, 32])
def test_fp8_operands_aligned_to_16_bytes_only_take_the_heuristics_answer_for_their_alignment(offset):
    # a view starting 16 or 32 bytes into its buffer: the launch asks the heuristic again for that alignment
    m, n, k = 64, 48, 64
    base = fp8((m, k + 64), seed=43)
    a = base[:, offset : offset + k]  # rows k + 64 bytes apart (a multiple of 16): read in place
    b = fp8((n, k), seed=44).t()
    assert a.data_ptr() % 256 == offset % 256
    opts = {"result_type": "bfloat16"}
    got = nvdispatch.matmul(a, b, options=opts)
    ex = nvdispatch.explain(a, b, options=opts)
    assert ex.executor == "cuda" and not any("copy a" in s for s in ex.steps), str(ex)
    _, _, want, abs_sum, _ = emulate(a, b, result_type="bfloat16")
    assert_matches(got, want, abs_sum, "bfloat16")
    aligned = nvdispatch.matmul(a.contiguous(), b, options=opts)  # the plan's own algorithm
    assert_matches(aligned, want, abs_sum, "bfloat16")


@needs_fp8
def test_fp8_on_a_side_stream_and_the_default_stream_agree():
    a, b = fp8((128, 256), seed=45), fp8((96, 256), seed=46).t()
    bias = bf16((96,), seed=47)
    kw = {"epilog": "RELU_BIAS", "epilog_inputs": {"bias": bias}, "options": {"result_type": "bfloat16"}}
    want = nvdispatch.matmul(a, b, **kw)
    mm = nvdispatch.Matmul(a, b, options=kw["options"])
    mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = mm.execute(stream=side)
    side.synchronize()
    torch.testing.assert_close(got, want)
    mm.free()


@needs_fp8
@pytest.mark.parametrize("result_type", [E4M3, "bfloat16"])
def test_cupy_fp8_with_padded_k_and_a_python_d_scale(result_type):
    # CuPy's helpers: zeroed operand buffers (K = 40 padded to 48), results stored as the bits of types CuPy
    # lacks, a Python-number d scale kept in a device buffer
    cupy = pytest.importorskip("cupy")
    a, b = fp8((32, 40), seed=48), fp8((40, 64), seed=49)
    scales = {"b": 0.5} | ({"d": 4.0} if result_type == E4M3 else {})
    opts = {"result_type": result_type}
    want = nvdispatch.matmul(a, b, quantization_scales=scales, options=opts)
    ca, cb = cupy.asarray(a.view(torch.uint8)), cupy.asarray(b.view(torch.uint8))
    got = nvdispatch.matmul(
        ca, cb, quantization_scales=scales, options={**opts, "operand_types": {"a": E4M3, "b": E4M3}}
    )
    assert isinstance(got, cupy.ndarray) and got.dtype == (np.uint8 if result_type == E4M3 else np.uint16)
    bits = torch.from_dlpack(got).view(getattr(torch, result_type))
    _, _, d, abs_sum, _ = emulate(a, b, scales=scales, result_type=result_type)
    assert_matches(bits, d, abs_sum, result_type, extra_scale=scales.get("d", 1.0))
    assert_matches(want, d, abs_sum, result_type, extra_scale=scales.get("d", 1.0))


@needs_fp8
@pytest.mark.parametrize("fast", [False, True])
def test_every_fp8_autotune_candidate_computes_the_planned_result(fast):
    # the heuristic's answers for the bias-only form with device scales (torch._scaled_mm's) are candidates
    # where this plan's descriptor accepts them: each must still apply the ReLU and the host scales
    from nvdispatch._cuda import lt_autotune

    a, b = fp8((256, 512), seed=50), fp8((384, 512), seed=51).t()
    bias = bf16((384,), seed=52)
    scales = {"a": 0.5, "b": 2.0}
    mm = nvdispatch.Matmul(
        a, b, quantization_scales=scales, options={"result_type": "bfloat16", "fast_accumulation": fast}
    )
    mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    plan = mm._plan
    cands = lt_autotune.candidates(plan.core, plan.handle)
    related = [c for c in cands if " of the " in c[0]]
    sample = related + cands[:: max(1, len(cands) // 24)]
    _, _, want, abs_sum, _ = emulate(a, b, scales=scales, bias=bias, epilog="RELU_BIAS", result_type="bfloat16")
    acc = ACC_FP8_FAST if fast else ACC_FP8_TENSOR_CORES
    original = plan.algorithm
    try:
        for label, r in sample:
            plan.algorithm = r
            try:
                _assert_matches(mm.execute(), want, abs_sum, "bfloat16", acc_eps=acc)
            except AssertionError as exc:
                raise AssertionError(f"{label}: {exc}") from None
    finally:
        plan.algorithm = original  # the plan is cached: later tests get the heuristic's choice
        mm.free()
