"""GPU matmul on the cuda/cupy executors against the float64 NumPy reference (run on a GPU machine)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import nvdispatch
from nvdispatch import Epilog
from nvdispatch._epilog import EPILOGS
from tests.matmul.matmul_reference import epilog_reference, gelu_grad

pytestmark = pytest.mark.gpu

M, N, K, BATCH = 24, 40, 32, 3
TOL = {"float16": 2e-2, "bfloat16": 8e-2, "float32": 1e-4, "float64": 1e-10}
FRAMEWORKS = ("torch", "cupy", "numba")


def _fw(name):
    return pytest.importorskip({"numba": "numba.cuda"}.get(name, name))


def to_dev(x: np.ndarray, fw: str, dtype: str):
    if fw == "torch":
        import torch

        t = torch.from_numpy(np.ascontiguousarray(x))
        return t.to(device="cuda", dtype=getattr(torch, dtype) if dtype != "bool" else torch.bool)
    if fw == "cupy":
        import cupy

        return cupy.asarray(x.astype(dtype))
    from numba import cuda

    return cuda.to_device(np.ascontiguousarray(x.astype(dtype)))


def to_host(x) -> np.ndarray:
    mod = type(x).__module__.split(".")[0]
    if mod == "torch":
        import torch

        x = x.detach()
        return (x.float() if x.dtype == torch.bfloat16 else x).cpu().numpy()
    if mod == "cupy":
        return x.get()
    return x.copy_to_host()


def _round(x: np.ndarray, dtype: str) -> np.ndarray:
    """x as the device will see it after the cast to dtype, back in float64."""
    if dtype == "bfloat16":
        import torch

        return torch.from_numpy(x).to(torch.bfloat16).double().numpy()
    return x.astype(dtype).astype(np.float64)


def _cases():
    for ep in Epilog:
        for dtype in ("float16", "bfloat16", "float32", "float64"):
            for orient in ("n", "m") if (EPILOGS[ep].has_bias or ep.name.endswith("BGRAD")) else ("n",):
                for batched in (False, True):
                    for fw in FRAMEWORKS:
                        if dtype == "bfloat16" and fw != "torch":
                            continue
                        yield pytest.param(
                            ep, dtype, orient, batched, fw, id=f"{ep.name}-{dtype}-{orient}-{batched}-{fw}"
                        )


@pytest.mark.parametrize("epilog, dtype, orient, batched, fw", list(_cases()))
def test_every_epilog(epilog, dtype, orient, batched, fw):
    _fw(fw)
    rng = np.random.default_rng(int(epilog) * 7 + len(dtype))
    bshape = (BATCH,) if batched else ()
    a = _round(rng.uniform(-1, 1, (*bshape, M, K)), dtype)
    b = _round(rng.uniform(-1, 1, (K, N)), dtype)
    spec = EPILOGS[epilog]
    d64 = a @ b
    inputs64, inputs = {}, {}
    if spec.has_bias:
        shape = ((*bshape, 1, N) if batched else (N,)) if orient == "n" else (*bshape, M, 1)
        inputs64["bias"] = _round(rng.uniform(-1, 1, shape), dtype)
    if "relu_aux" in spec.inputs:
        inputs64["relu_aux"] = rng.random((*bshape, M, N)) > 0.4
    if "gelu_aux" in spec.inputs:
        inputs64["gelu_aux"] = _round(rng.uniform(-2, 2, (*bshape, M, N)), dtype)
    for name, x in inputs64.items():
        inputs[name] = to_dev(x, fw, "bool" if x.dtype == bool else dtype)
    options = {"bgrad_axis": orient} if epilog.name.endswith("_BGRAD") else None
    ref, ref_aux = epilog_reference(epilog.name, d64, inputs64, a=a, b=b, bgrad_axis=orient)
    ex = nvdispatch.explain(
        to_dev(a, fw, dtype), to_dev(b, fw, dtype), epilog=epilog, epilog_inputs=inputs or None, options=options
    )
    out = nvdispatch.matmul(
        to_dev(a, fw, dtype), to_dev(b, fw, dtype), epilog=epilog, epilog_inputs=inputs or None, options=options
    )
    if spec.outputs:
        out, aux = out
    assert type(out).__module__.split(".")[0] == {"numba": "numba"}.get(fw, fw)
    tol = TOL[dtype] * (4 if epilog.name.startswith("DGELU") else 1)
    scale = max(1.0, float(np.abs(ref).max()))
    np.testing.assert_allclose(to_host(out), ref, atol=tol * scale, rtol=tol, err_msg=str(ex))
    for name in spec.outputs:
        got = to_host(aux[name])
        want = ref_aux[name]
        if name == "relu_aux":
            pre = ref_aux.get("pre")  # not provided: compare where the pre-activation is clearly signed
            bits = got.astype(np.uint8)
            mask = _unpack(aux[name], bits) if bits.dtype == np.uint8 else bits.astype(bool)
            pre = ref if pre is None else pre
            clear = np.abs(_pre_activation(spec, d64, inputs64)) > 10 * tol
            np.testing.assert_array_equal(mask[clear], want[clear], err_msg=str(ex))
        else:
            tol2 = (
                tol
                * max(1.0, float(np.abs(want).max()))
                * (8 if name.endswith("bgrad") or name.startswith("bgrad") else 1)
            )
            np.testing.assert_allclose(got.reshape(want.shape), want, atol=tol2, rtol=tol, err_msg=f"{name}: {ex}")


def _pre_activation(spec, d64, inputs64):
    pre = d64.copy()
    if "bias" in inputs64:
        pre = pre + inputs64["bias"]
    return pre


def _unpack(arr, bits: np.ndarray) -> np.ndarray:
    """A relu bit mask (either orientation, from its strides) as a boolean (..., m, n) mask."""
    st = getattr(arr, "strides", None)
    if hasattr(arr, "stride") and callable(arr.stride):
        st = arr.stride()
    else:
        st = tuple(s // 1 for s in (st or bits.strides))
    if st[-1] == 1:  # row orientation: (..., m, ld/8)
        return np.unpackbits(bits, axis=-1, bitorder="little")[..., :N].astype(bool)
    t = np.swapaxes(bits, -1, -2)  # (..., n, ld/8)
    return np.swapaxes(np.unpackbits(t, axis=-1, bitorder="little")[..., :M].astype(bool), -1, -2)


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_aux_roundtrips(fw):
    _fw(fw)
    rng = np.random.default_rng(5)
    a = rng.uniform(-1, 1, (M, K)).astype(np.float32)
    b = rng.uniform(-1, 1, (K, N)).astype(np.float32)
    bias = rng.uniform(-1, 1, N).astype(np.float32)
    da, db, dbias = (to_dev(x, fw, "float32") for x in (a, b, bias))
    g = rng.uniform(-1, 1, (M, K)).astype(np.float32)
    dg = to_dev(g, fw, "float32")
    pre = a @ b + bias
    for fwd, bwd, key in (
        (Epilog.RELU_AUX_BIAS, Epilog.DRELU, "relu_aux"),
        (Epilog.GELU_AUX_BIAS, Epilog.DGELU, "gelu_aux"),
    ):
        y, aux = nvdispatch.matmul(da, db, epilog=fwd, epilog_inputs={"bias": dbias})
        grad = nvdispatch.matmul(dg, db, epilog=bwd, epilog_inputs={key: aux[key]})
        d = g @ b
        want = d * (pre > 0) if key == "relu_aux" else d * gelu_grad(pre)
        np.testing.assert_allclose(to_host(grad), want, atol=1e-3, rtol=1e-3)


def test_streams_and_no_sync():
    torch = pytest.importorskip("torch")
    cupy = pytest.importorskip("cupy")
    a = torch.randn(512, 256, device="cuda")
    b = torch.randn(256, 384, device="cuda")
    bias = torch.randn(384, device="cuda")
    want = torch.relu(a @ b + bias)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # the framework's current stream
        r1 = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    r2 = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}, stream=s)  # explicit
    r3 = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}, stream=s.cuda_stream)  # raw int
    s.synchronize()
    for r in (r1, r2, r3):
        torch.testing.assert_close(r, want, atol=1e-3, rtol=1e-3)
    ca, cb, cbias = cupy.asarray(a), cupy.asarray(b), cupy.asarray(bias)
    torch.cuda.synchronize()
    cs = cupy.cuda.Stream(non_blocking=True)
    r4 = nvdispatch.matmul(ca, cb, epilog="RELU_BIAS", epilog_inputs={"bias": cbias}, stream=cs)
    cs.synchronize()
    cupy.testing.assert_allclose(r4, cupy.asarray(want), atol=1e-3, rtol=1e-3)


def test_ten_thousand_cached_calls_memory_flat():
    torch = pytest.importorskip("torch")
    a = torch.randn(64, 32, device="cuda", dtype=torch.float16)
    b = torch.randn(32, 48, device="cuda", dtype=torch.float16)
    bias = torch.randn(48, device="cuda", dtype=torch.float16)
    for _ in range(10):
        nvdispatch.matmul(a, b, epilog="GELU_BIAS", epilog_inputs={"bias": bias})
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    hits = nvdispatch.plan_cache.stats()["hits"]
    for _ in range(10_000):
        r = nvdispatch.matmul(a, b, epilog="GELU_BIAS", epilog_inputs={"bias": bias})
    del r
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() <= before
    assert nvdispatch.plan_cache.stats()["hits"] - hits >= 10_000


def test_free_matmul_while_work_is_queued():
    torch = pytest.importorskip("torch")
    a = torch.randn(2048, 2048, device="cuda")
    b = torch.randn(2048, 2048, device="cuda")
    bias = torch.randn(2048, device="cuda")
    mm = nvdispatch.Matmul(a, b)
    mm.plan(epilog=Epilog.RELU_BIAS, epilog_inputs={"bias": bias})
    outs = [mm.execute() for _ in range(20)]
    mm.free()
    nvdispatch.plan_cache.clear()  # releases workspaces in stream order while work is queued
    gc.collect()
    torch.cuda.synchronize()
    want = torch.relu(a @ b + bias)
    torch.testing.assert_close(outs[-1], want, atol=2e-2, rtol=1e-3)


def test_seed_example_cupy():
    cupy = pytest.importorskip("cupy")
    from nvdispatch import ComputeType, Matmul

    m, n, k = 256, 128, 64
    a = cupy.random.rand(m, k, dtype=cupy.float32)
    b = cupy.random.rand(k, n, dtype=cupy.float32)
    bias = cupy.random.rand(1, n, dtype=cupy.float32)
    mm = Matmul(a, b, options={"compute_type": ComputeType.COMPUTE_32F_FAST_16F})
    mm.plan(epilog=Epilog.RELU_BIAS, epilog_inputs={"bias": bias})
    r = mm.execute()
    cupy.cuda.get_current_stream().synchronize()
    assert isinstance(r, cupy.ndarray)
    want = np.maximum(a.get().astype(np.float64) @ b.get() + bias.get(), 0)
    np.testing.assert_allclose(r.get(), want, rtol=2e-3, atol=2e-2)
    mm.free()


def test_cupy_plain_products_run_cupy_matmul_and_autotune_weighs_cublaslt():
    """A plain CuPy product is CuPy's own matmul (cuBLAS: same kernels, less host overhead); a compute type asked
    for, set_backend("cuda") or an epilog keep cuBLASLt; autotune times both and stateless calls follow it."""
    cupy = pytest.importorskip("cupy")
    rng = np.random.default_rng(3)
    a_h, b_h = rng.standard_normal((96, 64)).astype(np.float32), rng.standard_normal((64, 80)).astype(np.float32)
    a, b = cupy.asarray(a_h), cupy.asarray(b_h)
    ex = nvdispatch.explain(a, b)
    assert (ex.executor, ex.strategy) == ("cupy", "plain"), str(ex)
    for _ in range(3):  # the first call plans, the next ones take the direct call
        r = nvdispatch.matmul(a, b)
        assert isinstance(r, cupy.ndarray)
        np.testing.assert_allclose(r.get(), a_h @ b_h, rtol=1e-4, atol=1e-4)
    v = nvdispatch.matmul(a, cupy.asarray(b_h[:, 0]))  # PEP 465 promotion, as cupy.matmul does it
    np.testing.assert_allclose(v.get(), a_h @ b_h[:, 0], rtol=1e-4, atol=1e-4)
    half = nvdispatch.matmul(a.astype(cupy.float16), b)  # a cast first: no direct call
    assert half.dtype == cupy.float32
    tf32 = {"compute_type": "COMPUTE_32F_FAST_TF32"}
    assert nvdispatch.explain(a, b, options=tf32).executor == "cuda"
    with nvdispatch.set_backend("cuda"):
        assert nvdispatch.explain(a, b).executor == "cuda"
    bias = cupy.asarray(rng.standard_normal(80).astype(np.float32))
    assert nvdispatch.explain(a, b, epilog="BIAS", epilog_inputs={"bias": bias}).strategy == "native"
    mm = nvdispatch.Matmul(a, b)
    mm.plan()
    timings = mm.autotune(iterations=2)
    assert set(timings) == {"plain", "native"}
    np.testing.assert_allclose(nvdispatch.matmul(a, b).get(), a_h @ b_h, rtol=1e-4, atol=1e-4)
    assert nvdispatch.explain(a, b).strategy == mm.strategy  # stateless calls take autotune's choice
    mm.free()


def test_autotune_save_load(tmp_path):
    torch = pytest.importorskip("torch")
    a = torch.randn(1024, 512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(512, 768, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(768, device="cuda", dtype=torch.bfloat16)
    mm = nvdispatch.Matmul(a, b)
    mm.plan(epilog="GELU_BIAS", epilog_inputs={"bias": bias})
    timings = mm.autotune(iterations=3)
    assert "native" in timings and mm.strategy == "native"
    path = tmp_path / "tunings.json"
    assert nvdispatch.plan_cache.save(path) >= 1
    tuned = mm._plan.tuning()
    nvdispatch.plan_cache.clear()
    nvdispatch.plan_cache.load(path)
    mm2 = nvdispatch.Matmul(a, b)
    mm2.plan(epilog="GELU_BIAS", epilog_inputs={"bias": bias})
    assert mm2._plan.tuning()["data"] == tuned["data"]
    torch.testing.assert_close(mm2.execute(), mm.execute())


@pytest.mark.parametrize(
    "dtype, epilog", [("bfloat16", "GELU_BIAS"), ("float16", "RELU_BIAS"), ("tf32", "GELU_AUX_BIAS"), ("float32", None)]
)
def test_every_autotune_candidate_computes_the_planned_result(dtype, epilog):
    """Each configuration autotune may choose (heuristic answers, split-K and the neighbourhood's tile, cluster,
    swizzle, stages and custom-option variants) gives the heuristic's result, to rounding."""
    torch = pytest.importorskip("torch")
    from nvdispatch._cuda import lt_autotune

    dt = torch.float32 if dtype == "tf32" else getattr(torch, dtype)
    opts = {"compute_type": "COMPUTE_32F_FAST_TF32"} if dtype == "tf32" else None
    gen = torch.Generator(device="cuda").manual_seed(7)
    a = torch.randn(384, 320, device="cuda", dtype=dt, generator=gen)
    b = torch.randn(320, 448, device="cuda", dtype=dt, generator=gen)
    bias = torch.randn(448, device="cuda", dtype=dt, generator=gen)
    kw = {} if epilog is None else {"epilog": epilog, "epilog_inputs": {"bias": bias}}
    with nvdispatch.set_backend("cuda", only=True):
        mm = nvdispatch.Matmul(a, b, options=opts)
        mm.plan(preferences={"strategy": "native"}, **kw)
    plan, ops = mm._plan, mm._operands()
    cands = lt_autotune.candidates(plan.core, plan.handle)
    assert any(" cluster " in label or " tile " in label for label, _ in cands), [label for label, _ in cands]
    want = plan.execute(ops)
    want = want if epilog != "GELU_AUX_BIAS" else want[0]
    tol = 4e-2 if dtype in ("bfloat16", "float16") else 2e-2 if dtype == "tf32" else 1e-4
    scale = want.abs().max().item()
    original = plan.algorithm
    try:
        for label, result in cands[:: max(1, len(cands) // 48)]:  # ~48 of them, spread over every kind
            plan.algorithm = result
            got = plan.execute(ops)
            got = got if epilog != "GELU_AUX_BIAS" else got[0]
            assert (got.float() - want.float()).abs().max().item() <= tol * scale, label
    finally:
        plan.algorithm = original  # the plan is cached: later tests get the heuristic's choice
        mm.free()


def test_explain_says_native_and_single_launch():
    torch = pytest.importorskip("torch")
    a = torch.randn(512, 256, device="cuda")
    b = torch.randn(256, 384, device="cuda")
    ex = nvdispatch.explain(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": torch.randn(384, device="cuda")})
    assert ex.executor == "cuda" and ex.strategy == "native", str(ex)
    assert any("cublasLtMatmul" in s for s in ex.steps)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "pure-python"])
@pytest.mark.parametrize("epilog", ["BIAS", "RELU_BIAS", "GELU_BIAS"])
def test_host_bound_torch_bias_epilogs(epilog, compiled, monkeypatch):
    """Small fused bias epilogs of Torch tensors: our cuBLASLt plan where its direct call is compiled (less host
    time than Torch's _addmm_activation), Torch's fused entry where it is not."""
    torch = pytest.importorskip("torch")
    from nvdispatch._adapters import call_key_classes
    from nvdispatch._compiled import hotpath
    from nvdispatch.executors import cuda_matmul

    if compiled and hotpath() is None:
        pytest.skip("the extension is not built here")
    if not compiled:
        monkeypatch.setattr(cuda_matmul, "hotpath", lambda: None)
    nvdispatch.plan_cache.clear()
    call_key_classes.clear()
    a = torch.randn(16, 16, device="cuda")
    b = torch.randn(16, 16, device="cuda")
    bias = torch.randn(16, device="cuda")
    ex = nvdispatch.explain(a, b, epilog=epilog, epilog_inputs={"bias": bias})
    if compiled:
        assert ex.executor == "cuda" and ex.strategy == "native", str(ex)
    else:
        assert ex.executor == "torch" and ex.strategy == "framework_fused", str(ex)
        assert any(name == "cuda" and "host-bound" in why for name, why in ex.declined), str(ex)
    want = a @ b + bias
    want = {"BIAS": want, "RELU_BIAS": torch.relu(want)}.get(epilog, torch.nn.functional.gelu(want, approximate="tanh"))
    for _ in range(3):  # the first call plans, the next ones take the hot path's direct call
        torch.testing.assert_close(nvdispatch.matmul(a, b, epilog=epilog, epilog_inputs={"bias": bias}), want)
    nvdispatch.plan_cache.clear()
    with nvdispatch.set_backend("cuda"):  # asked for by name: cuBLASLt runs it
        ex = nvdispatch.explain(a, b, epilog=epilog, epilog_inputs={"bias": bias})
        assert ex.executor == "cuda" and ex.strategy == "native", str(ex)
        torch.testing.assert_close(nvdispatch.matmul(a, b, epilog=epilog, epilog_inputs={"bias": bias}), want)
    nvdispatch.plan_cache.clear()  # later tests plan these forms afresh, as the default selection picks them
    call_key_classes.clear()


def test_cai_object_result_kind_and_alpha_beta_c():
    cupy = pytest.importorskip("cupy")
    from nvdispatch._cuda.arrays import CudaArray

    class Raw:  # a foreign object with only __cuda_array_interface__
        def __init__(self, arr):
            self._a = arr
            self.__cuda_array_interface__ = arr.__cuda_array_interface__

    a = cupy.random.rand(3, 40, 24)
    b = cupy.random.rand(24, 16)
    c = cupy.random.rand(16)
    r = nvdispatch.matmul(Raw(a), Raw(b), Raw(c), alpha=0.5, beta=2.0)
    assert isinstance(r, CudaArray)
    want = 0.5 * (a.get() @ b.get()) + 2.0 * c.get()
    np.testing.assert_allclose(r.copy_to_host(), want, rtol=1e-10)


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_complex_and_tf32_options(dtype):
    cupy = pytest.importorskip("cupy")
    a = (cupy.random.rand(33, 20) + 1j * cupy.random.rand(33, 20)).astype(dtype)
    b = (cupy.random.rand(20, 17) + 1j * cupy.random.rand(20, 17)).astype(dtype)
    r = nvdispatch.matmul(a, b, alpha=1 + 1j)
    np.testing.assert_allclose(r.get(), (1 + 1j) * (a.get() @ b.get()), rtol=1e-4)
    x = cupy.random.rand(64, 64, dtype=cupy.float32)
    r = nvdispatch.matmul(x, x, options={"compute_type": nvdispatch.ComputeType.COMPUTE_32F_FAST_TF32})
    np.testing.assert_allclose(r.get(), x.get() @ x.get(), rtol=5e-3)


@pytest.mark.parametrize("epilog", ["RELU_BIAS", "GELU_BIAS", "RELU_AUX_BIAS", "GELU_AUX_BIAS"])
@pytest.mark.parametrize("orient", ["n", "m"])
@pytest.mark.parametrize("fw", ["torch", "cupy"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_unfused_strategy_adds_the_bias_in_the_gemm_and_matches_native(epilog, orient, fw, dtype):
    """Strategy "inplace" (what autotune times against "native"): cuBLASLt's BIAS epilogue, then the
    activation; a GELU pre-activation is the GEMM's result itself where Torch writes the activation anew."""
    _fw(fw)
    rng = np.random.default_rng(7)
    a = _round(rng.uniform(-1, 1, (BATCH, M, K)), dtype)
    b = _round(rng.uniform(-1, 1, (K, N)), dtype)
    bias = _round(rng.uniform(-1, 1, (BATCH, 1, N) if orient == "n" else (BATCH, M, 1)), dtype)
    args = [to_dev(x, fw, dtype) for x in (a, b, bias)]
    a0 = [to_host(x).copy() for x in args]
    kw = {"epilog": epilog, "epilog_inputs": {"bias": args[2]}}
    with nvdispatch.set_backend("cuda"):
        ex = nvdispatch.explain(args[0], args[1], **kw, preferences={"strategy": "inplace"})
        got = nvdispatch.matmul(args[0], args[1], **kw, preferences={"strategy": "inplace"})
        native = nvdispatch.matmul(args[0], args[1], **kw)
    in_gemm = any("epilogue BIAS" in s for s in ex.steps)
    assert ex.strategy == "inplace" and in_gemm != any(s.startswith("add_bias") for s in ex.steps), str(ex)
    assert in_gemm or orient == "m", str(ex)  # a bias along N always rides in cuBLASLt's BIAS epilogue
    if epilog == "GELU_AUX_BIAS" and fw == "torch":
        assert any("no copy" in s for s in ex.steps), str(ex)
    ref, ref_aux = epilog_reference(epilog, a @ b, {"bias": bias})
    tol = TOL[dtype]
    got_out, got_aux = got if isinstance(got, tuple) else (got, {})
    nat_out, nat_aux = native if isinstance(native, tuple) else (native, {})
    np.testing.assert_allclose(to_host(got_out), ref, atol=tol * 4, rtol=tol, err_msg=str(ex))
    np.testing.assert_allclose(to_host(got_out), to_host(nat_out), atol=tol * 4, rtol=tol, err_msg=str(ex))
    if "gelu_aux" in got_aux:
        np.testing.assert_allclose(to_host(got_aux["gelu_aux"]), ref_aux["gelu_aux"], atol=tol * 4, rtol=tol)
        assert to_host(got_aux["gelu_aux"]).shape == to_host(nat_aux["gelu_aux"]).shape
    if "relu_aux" in got_aux:
        clear = np.abs(_pre_activation(EPILOGS[Epilog[epilog]], a @ b, {"bias": bias})) > 10 * tol
        mask = _unpack(got_aux["relu_aux"], to_host(got_aux["relu_aux"]).astype(np.uint8))
        np.testing.assert_array_equal(mask[clear], ref_aux["relu_aux"][clear], err_msg=str(ex))
    for x, x0 in zip(args, a0):
        np.testing.assert_array_equal(to_host(x), x0)  # inputs unchanged


def test_autotune_times_both_strategies_and_tunes_the_unfused_gemm():
    torch = pytest.importorskip("torch")
    a = torch.randn(512, 256, device="cuda")
    b = torch.randn(256, 384, device="cuda")
    bias = torch.randn(384, device="cuda")
    kw = {"epilog": "GELU_AUX_BIAS", "epilog_inputs": {"bias": bias}}
    with nvdispatch.set_backend("cuda"):
        mm = nvdispatch.Matmul(a, b)
        mm.plan(**kw)
        timings = mm.autotune(iterations=2)
        assert set(timings) == {"native", "inplace"} and mm.strategy in timings
        forced = nvdispatch.Matmul(a, b)
        forced.plan(**kw, preferences={"strategy": "inplace"})  # the cached plan the autotune timed
        assert forced.strategy == "inplace" and forced._plan.tuning()["env"]["gpu"]  # its GEMM was tuned
        out, aux = forced.execute()
    pre = a @ b + bias
    torch.testing.assert_close(out, torch.nn.functional.gelu(pre, approximate="tanh"), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(aux["gelu_aux"], pre, rtol=1e-4, atol=1e-4)
