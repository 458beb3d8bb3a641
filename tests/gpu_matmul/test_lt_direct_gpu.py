"""The cuBLASLt plan's direct call (the hot path of repeated calls and of ``Matmul.execute``) gives what its
``execute`` gives, on Torch and CuPy operands; and forms it cannot take leave it unset. GPU only."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
from tests.gpu_matmul.test_gpu_matmul import to_dev
from tests.matmul.matmul_reference import epilog_reference

pytestmark = pytest.mark.gpu

CASES = [  # (a shape, b shape, transpose b?, epilog)
    ((48, 32), (32, 40), False, None),
    ((48, 32), (32, 40), False, "RELU_BIAS"),
    ((48, 32), (40, 32), True, "GELU_BIAS"),
    ((3, 48, 32), (32, 40), False, "BIAS"),
    ((33, 17), (17, 9), False, "RELU_BIAS"),  # odd sizes: leading dimensions not 16-byte multiples
]


@pytest.mark.parametrize("fw", ["torch", "cupy"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}{'T' if c[2] else ''}-{c[3]}")
def test_direct_call_matches_execute_and_the_reference(fw, case):
    pytest.importorskip(fw)
    ashape, bshape, bt, epilog = case
    rng = np.random.default_rng(3)
    a_np = rng.standard_normal(ashape).astype(np.float32)
    b_np = rng.standard_normal(bshape).astype(np.float32)
    n = bshape[0] if bt else bshape[1]
    bias_np = rng.standard_normal(n).astype(np.float32)
    a, b, bias = to_dev(a_np, fw, "float32"), to_dev(b_np, fw, "float32"), to_dev(bias_np, fw, "float32")
    if bt:
        b, b_np = b.T, b_np.T
    inputs = {"bias": bias} if epilog else None
    want, _ = epilog_reference(epilog or "DEFAULT", a_np.astype(np.float64) @ b_np, {"bias": bias_np} if epilog else {})
    with nvdispatch.set_backend("cuda", only=True):
        got = [nvdispatch.matmul(a, b, epilog=epilog, epilog_inputs=inputs) for _ in range(3)]  # plan, then direct
        mm = nvdispatch.Matmul(a, b).plan(epilog=epilog, epilog_inputs=inputs)
        got += [mm.execute(), mm.execute()]
        plan = mm._plan
        assert type(plan).__name__ == "LtMatmulPlan"
        assert plan.direct is not None or len(ashape) > 2  # 2-D operands read in place: the direct call exists
        ops = {"a": a, "b": b, "alpha": 1, "beta": None, **(inputs or {})}
        got.append(plan.execute(ops))
        if plan.direct is not None:
            got.append(plan.direct(a, b, *(inputs or {}).values()))
        mm.free()
    for r in got:
        assert type(r) is type(a)
        np.testing.assert_allclose(_host(r, fw), want, rtol=1e-4, atol=1e-4)


def test_a_misaligned_operand_takes_another_algorithm_on_the_direct_call():
    torch = pytest.importorskip("torch")
    a_full = torch.randn(65, 32, device="cuda")
    b = torch.randn(32, 40, device="cuda")
    bias = torch.randn(40, device="cuda")
    aligned, shifted = a_full[:64], a_full[1:]  # same shape and strides; the second starts 128 B in
    with nvdispatch.set_backend("cuda", only=True):
        mm = nvdispatch.Matmul(aligned, b).plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        mm.reset_operands(a=shifted)
        r = mm.execute()
        mm.free()
    torch.testing.assert_close(r, torch.relu(shifted @ b + bias), rtol=1e-4, atol=1e-4)


def test_forms_beyond_the_direct_call_leave_it_unset():
    torch = pytest.importorskip("torch")
    a = torch.randn(32, 16, device="cuda")
    b = torch.randn(16, 24, device="cuda")
    c = torch.randn(32, 24, device="cuda")
    with nvdispatch.set_backend("cuda", only=True):
        with_c = nvdispatch.Matmul(a, b, c, beta=0.5).plan()
        aux = nvdispatch.Matmul(a, b).plan(epilog="RELU_AUX")
        assert with_c._plan.direct is None and aux._plan.direct is None
        r, extra = aux.execute()
        torch.testing.assert_close(with_c.execute(), a @ b + 0.5 * c, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(r, torch.relu(a @ b), rtol=1e-4, atol=1e-4)


def _host(x, fw):
    return x.cpu().numpy() if fw == "torch" else x.get()


# -- the direct call compiled (_hotpath_lt.c) on Torch tensors ------------------------------------------------


def _torch_plan(a, b, epilog=None, bias=None):
    with nvdispatch.set_backend("cuda", only=True):
        mm = nvdispatch.Matmul(a, b).plan(epilog=epilog, epilog_inputs=None if bias is None else {"bias": bias})
    return mm, mm._plan


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("epilog", [None, "BIAS", "RELU_BIAS", "GELU_BIAS"])
@pytest.mark.parametrize("mnk", [(16, 16, 16), (33, 9, 17)])
def test_the_compiled_direct_call_gives_what_the_python_one_gives(dtype, epilog, mnk):
    torch = pytest.importorskip("torch")
    from nvdispatch._compiled import hotpath

    m, n, k = mnk
    dt = getattr(torch, dtype)
    a, b = torch.randn(m, k, device="cuda", dtype=dt), torch.randn(k, n, device="cuda", dtype=dt)
    bias = torch.randn(n, device="cuda", dtype=dt) if epilog else None
    mm, plan = _torch_plan(a, b, epilog, bias)
    if mm.strategy != "native":  # no fused cuBLASLt kernel for it (GELU in float64): no direct call either
        assert plan.direct is None
        pytest.skip(f"cuBLASLt runs {epilog} on {dtype} unfused")
    args = (a, b) if bias is None else (a, b, bias)
    if hotpath() is not None and not plan.algorithm.workspaceSize:
        assert type(plan.direct).__name__ == "builtin_function_or_method"
    got, py = plan.direct(*args), plan.python_direct(*args)
    assert got.dtype == dt and got.shape == (m, n) and got.device == a.device
    assert torch.equal(got, py), (got - py).abs().max()  # the same algorithm on the same pointers
    a64, b64 = a.double().cpu().numpy(), b.double().cpu().numpy()
    want, _ = epilog_reference(epilog or "DEFAULT", a64 @ b64, {} if bias is None else {"bias": bias.double().cpu().numpy()})
    tol = {"float16": 2e-2, "bfloat16": 8e-2, "float32": 1e-4, "float64": 1e-10}[dtype]
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got.double().cpu().numpy(), want, rtol=tol, atol=tol * scale)
    mm.free()


def test_the_compiled_direct_call_follows_bias_changes_and_misaligned_views():
    torch = pytest.importorskip("torch")
    a_full = torch.randn(17, 16, device="cuda")
    b = torch.randn(16, 24, device="cuda")
    biases = [torch.randn(24, device="cuda") for _ in range(3)]
    a = a_full[:16]
    mm, plan = _torch_plan(a, b, "RELU_BIAS", biases[0])
    for bias in [*biases, biases[0], biases[2]]:
        torch.testing.assert_close(plan.direct(a, b, bias), torch.relu(a @ b + bias), rtol=1e-4, atol=1e-4)
    shifted = a_full[1:]  # 64 bytes in: the plan asks the heuristic for that alignment (the Python direct call)
    torch.testing.assert_close(plan.direct(shifted, b, biases[1]), torch.relu(shifted @ b + biases[1]),
                               rtol=1e-4, atol=1e-4)
    mm.free()


def test_the_compiled_direct_call_from_threads_on_their_own_streams():
    torch = pytest.importorskip("torch")
    import threading

    a, b = torch.randn(16, 16, device="cuda"), torch.randn(16, 16, device="cuda")
    biases = [torch.randn(16, device="cuda") for _ in range(4)]
    mm, plan = _torch_plan(a, b, "RELU_BIAS", biases[0])
    results, errors = {}, []

    def work(i):
        try:
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                outs = [plan.direct(a, b, biases[i]) for _ in range(100)]
            s.synchronize()
            results[i] = outs
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i, outs in results.items():
        want = torch.relu(a @ b + biases[i])
        for r in outs:
            torch.testing.assert_close(r, want, rtol=1e-4, atol=1e-4)
    mm.free()


def test_an_autotuned_algorithm_makes_a_new_direct_call():
    torch = pytest.importorskip("torch")
    a, b, bias = torch.randn(64, 32, device="cuda"), torch.randn(32, 48, device="cuda"), torch.randn(48, device="cuda")
    mm, plan = _torch_plan(a, b, "RELU_BIAS", bias)
    before = plan.direct
    with nvdispatch.set_backend("cuda", only=True):
        mm.autotune(iterations=2)
    assert plan.direct is not before
    torch.testing.assert_close(plan.direct(a, b, bias), torch.relu(a @ b + bias), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(mm.execute(), torch.relu(a @ b + bias), rtol=1e-4, atol=1e-4)
    mm.free()
