"""Torch's float32 matmul precision on the CPU (issue 29): ``torch.set_float32_matmul_precision("medium")`` (and
``torch.backends.mkldnn.matmul.fp32_precision = "bf16"``) makes Torch's own CPU matmul compute float32 products in
bfloat16 where the CPU has bfloat16 arithmetic. nvdispatch's Torch executor computes with Torch's ops, so:

* a stateless call follows the setting in force when it is made, and ``explain()`` names it;
* an explicit ``compute_type`` wins over it (the product is as precise as asked, Torch's setting unchanged after);
* a ``Matmul`` keeps the precision of its ``plan()`` (``Matmul.explain()`` says so);
* the setting is raised for such a call only, also when calls overlap in several threads.

Values against a float64 NumPy oracle: within float32's bound where float32 was asked, bfloat16's where the setting
asks for it (those assertions need a CPU with bfloat16 arithmetic: AVX512-BF16/AMX)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import nvdispatch

torch = pytest.importorskip("torch")

#: the relative error (to the result's largest magnitude) of a float32 product of these sizes, and a bound that
#: a bfloat16 one (8-bit mantissa, ~4e-3 per operand) always exceeds here and always stays within
F32_BOUND, BF16_BOUND = 1e-5, 3e-2
M, K, N = 32, 256, 16


def _bf16_cpu() -> bool:
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


@pytest.fixture
def precision():
    """``torch.set_float32_matmul_precision``, restored after the test (the legacy API only, as users set it)."""
    saved = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(saved)


def _operands(seed=0):
    g = torch.Generator().manual_seed(seed)
    a, b, bias = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g), torch.randn(N, generator=g)
    return a, b, bias


def _oracle(a, b, bias, epilog):
    """float64 NumPy: ``a @ b`` (+ bias, then the activation)."""
    y = a.numpy().astype(np.float64) @ b.numpy().astype(np.float64)
    if epilog is None:
        return y
    y = y + bias.numpy().astype(np.float64)
    if epilog == "RELU_BIAS":
        return np.maximum(y, 0)
    if epilog == "GELU_BIAS":
        return 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y**3)))
    return y


def _rel_err(got, want) -> float:
    return float(np.abs(got.detach().numpy().astype(np.float64) - want).max() / np.abs(want).max())


def _call(a, b, bias, epilog, **kw):
    inputs = {"bias": bias} if epilog is not None else None
    return nvdispatch.matmul(a, b, epilog=epilog, epilog_inputs=inputs, **kw)


@pytest.mark.parametrize("epilog", [None, "BIAS", "RELU_BIAS", "GELU_BIAS"])
@pytest.mark.parametrize("compute_type", ["COMPUTE_32F", "COMPUTE_32F_PEDANTIC", "COMPUTE_32F_FAST_TF32"])
def test_an_explicit_compute_type_wins_over_torchs_cpu_bfloat16_setting(matmul_front, precision, epilog, compute_type):
    a, b, bias = _operands()
    want = _oracle(a, b, bias, epilog)
    precision("medium")
    got = _call(a, b, bias, epilog, options={"compute_type": compute_type})
    again = _call(a, b, bias, epilog, options={"compute_type": compute_type})  # the cached call too
    assert got.dtype == again.dtype == torch.float32
    assert _rel_err(got, want) < F32_BOUND and _rel_err(again, want) < F32_BOUND
    # Torch's setting is the caller's again, and Torch's own getters still answer
    assert torch.get_float32_matmul_precision() == "medium"
    assert torch.backends.mkldnn.matmul.fp32_precision == "bf16"
    e = nvdispatch.explain(a, b, epilog=epilog, epilog_inputs={"bias": bias} if epilog else None,
                           options={"compute_type": compute_type})  # fmt: skip
    assert e.precision == f"compute type {compute_type}: options.compute_type"
    assert any(s.startswith(f"options.compute_type {compute_type}: Torch's own matmul") for s in e.steps)
    if _bf16_cpu():  # the oracle tells the two apart: Torch's own product at this setting is bfloat16's
        assert F32_BOUND < _rel_err(torch.matmul(a, b), _oracle(a, b, bias, None)) < BF16_BOUND


def test_a_stateless_call_follows_torchs_cpu_setting_changed_between_calls(matmul_front, precision):
    a, b, bias = _operands(1)
    want = _oracle(a, b, bias, "RELU_BIAS")
    seen = []
    for setting in ("highest", "medium", "high", "medium", "highest"):
        precision(setting)
        got = _call(a, b, bias, "RELU_BIAS")
        note = nvdispatch.explain(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}).precision
        seen.append((setting, note))
        bf16 = setting == "medium" and _bf16_cpu()
        err = _rel_err(got, want)
        assert err < (BF16_BOUND if bf16 else F32_BOUND)
        if bf16:
            assert err > F32_BOUND  # computed as Torch's own matmul computes it now
    reduced = "COMPUTE_32F_FAST_16BF" if _bf16_cpu() else "COMPUTE_32F"
    assert seen[0][1] == "compute type COMPUTE_32F: Torch CPU matmul fp32_precision='ieee'"
    assert seen[1][1].startswith(f"compute type {reduced}: Torch CPU matmul fp32_precision='bf16'")
    assert seen[2][1] == "compute type COMPUTE_32F: Torch CPU matmul fp32_precision='tf32' (float32 on the CPU)"
    assert seen[3] == seen[1] and seen[4] == seen[0]


def test_torchs_cpu_setting_governs_float32_products_only(precision):
    a = torch.randn(8, 16, dtype=torch.complex64)
    b = torch.randn(16, 4, dtype=torch.complex64)
    precision("medium")
    e = nvdispatch.explain(a, b)
    assert e.precision == "compute type COMPUTE_32F: the complex64 default (no precision convention applies)"
    want = a.numpy().astype(np.complex128) @ b.numpy().astype(np.complex128)
    got = nvdispatch.matmul(a, b).numpy()
    assert np.abs(got - want).max() / np.abs(want).max() < F32_BOUND


@pytest.mark.parametrize("planned, executed", [("highest", "medium"), ("high", "medium")])
def test_a_matmul_keeps_the_float32_precision_of_its_plan(matmul_front, precision, planned, executed):
    a, b, bias = _operands(2)
    want = _oracle(a, b, bias, "GELU_BIAS")
    precision(planned)
    mm = nvdispatch.Matmul(a, b).plan(epilog="GELU_BIAS", epilog_inputs={"bias": bias})
    precision(executed)
    for _ in range(2):
        assert _rel_err(mm.execute(), want) < F32_BOUND
    assert torch.get_float32_matmul_precision() == executed  # the caller's setting, after each execute
    note = mm.explain().precision
    assert note.startswith("compute type COMPUTE_32F: Torch CPU matmul fp32_precision=")
    assert note.endswith("; kept from plan()")
    # plan() again follows the setting in force now
    mm.plan(epilog="GELU_BIAS", epilog_inputs={"bias": bias})
    if _bf16_cpu():
        assert mm.explain().precision.startswith("compute type COMPUTE_32F_FAST_16BF")
        assert F32_BOUND < _rel_err(mm.execute(), want) < BF16_BOUND


def test_a_matmul_planned_in_a_region_explains_the_region_and_keeps_it():
    a, b, bias = _operands(3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mm = nvdispatch.Matmul(a, b).plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    e = mm.explain()
    assert e.precision == (
        "compute type COMPUTE_32F, result bfloat16: Torch autocast('cpu', bfloat16): a, b, bias cast to bfloat16; "
        "kept from plan()"
    )
    assert mm.execute().dtype == torch.bfloat16 == torch.nn.functional.linear(a, b.T, bias).to(torch.bfloat16).dtype


def test_matmul_explain_needs_a_plan():
    mm = nvdispatch.Matmul(np.ones((2, 3)), np.ones((3, 2)))
    with pytest.raises(nvdispatch.errors.PlanStateError, match="call plan"):
        mm.explain()


def _cuda_tf32() -> bool:
    return torch.backends.cuda.matmul.fp32_precision == "tf32"


def test_the_setting_is_raised_for_overlapping_calls_and_given_back_after_the_last(precision):
    from nvdispatch._adapters.torch_precision import at_least

    precision("high")  # CUDA's matmul at TF32: the setting is Torch's, a GPU is not needed to read it
    assert _cuda_tf32()
    inside, ready, go = [], threading.Barrier(3), threading.Event()

    def call(compute_type):
        with at_least("cuda", compute_type):
            ready.wait()
            go.wait()
            inside.append(_cuda_tf32())

    threads = [threading.Thread(target=call, args=(ct,)) for ct in ("COMPUTE_32F", "COMPUTE_32F_PEDANTIC")]
    for t in threads:
        t.start()
    ready.wait()
    assert not _cuda_tf32()  # raised while either runs
    go.set()
    for t in threads:
        t.join()
    assert inside == [False, False]
    assert _cuda_tf32() and torch.get_float32_matmul_precision() == "high"  # given back, getters answer
    with at_least("cuda", "COMPUTE_32F_FAST_TF32"):  # asks no more than Torch gives: left alone
        assert _cuda_tf32()
    precision("highest")
    with at_least("cuda", "COMPUTE_32F_FAST_TF32"):  # never lowered
        assert not _cuda_tf32()


def test_the_torch_29_api_set_on_top_of_the_legacy_one_is_raised_too():
    # a process of its own: mixing the two APIs leaves Torch's legacy getters refusing; what nvdispatch reads and
    # raises is each backend's own setting
    code = textwrap.dedent(
        """
        import numpy as np, torch, nvdispatch
        from nvdispatch._adapters.torch_precision import at_least
        torch.set_float32_matmul_precision("highest")
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        seen = [torch.backends.cuda.matmul.fp32_precision]
        with at_least("cuda", "COMPUTE_32F"):
            seen.append(torch.backends.cuda.matmul.fp32_precision)
        seen.append(torch.backends.cuda.matmul.fp32_precision)
        torch.backends.mkldnn.matmul.fp32_precision = "bf16"
        g = torch.Generator().manual_seed(0)
        a, b = torch.randn(32, 256, generator=g), torch.randn(256, 16, generator=g)
        want = a.double().numpy() @ b.double().numpy()
        got = nvdispatch.matmul(a, b, options={"compute_type": "COMPUTE_32F"}).double().numpy()
        seen.append(float(np.abs(got - want).max() / np.abs(want).max()) < 1e-5)
        seen.append(torch.backends.mkldnn.matmul.fp32_precision)
        print(seen)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == str(["tf32", "ieee", "tf32", True, "bf16"])
