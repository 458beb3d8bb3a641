"""Each framework's precision convention decides a matmul's compute type and dtypes where the caller gives no
``compute_type`` (issue 29): Torch's TF32 switches and autocast regions, JAX's default matmul precision, CuPy's
compute type (``CUPY_TF32``). CPU tests: the conventions the adapters read under each setting, the problems and
plans they lead to, autocast results against Torch's own ops and the float64 oracle, the call key following a
changed setting (stateless calls at once, a stateful ``Matmul`` at its next ``plan()``), and explain()."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

import nvdispatch
from nvdispatch import ComputeType, Epilog, plan_cache
from nvdispatch._adapters import CPU, Device, adapter_named, call_key_classes
from nvdispatch._adapters.cupy import CupyAdapter
from nvdispatch._adapters.jax import JaxAdapter, float32_compute_type
from nvdispatch._adapters.torch import TorchAdapter
from nvdispatch._autocast_plan import AutocastPlan
from nvdispatch._detect import OperandInfo
from nvdispatch._epilog import EPILOGS, spec_of
from nvdispatch._matmul_problem import MatmulOptions, build_problem
from nvdispatch._precision import PrecisionConvention, autocast_targets
from tests.matmul.matmul_reference import assert_close, expected
from tests.precision.autocast_regions import autocast_region

torch = pytest.importorskip("torch")
F = torch.nn.functional

CUDA = Device("cuda", 0)
TF32 = ComputeType.COMPUTE_32F_FAST_TF32


@pytest.fixture
def tf32_setting():
    """Torch's TF32 switch, restored after the test (set through the legacy API only: mixing it with the new
    ``fp32_precision`` API puts Torch in a state its own getters refuse)."""
    saved = torch.backends.cuda.matmul.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32 = saved
    torch.set_float32_matmul_precision("high" if saved else "highest")


class _OnCuda:
    """A stand-in for a CUDA tensor where the Torch adapter's per-device reading asks (``is_cuda``)."""

    is_cuda = True


@pytest.fixture
def cpu_follows_tf32(monkeypatch):
    """Torch's CPU convention made the CUDA one (TF32 included), and the call keys of CPU tensors the reading of
    a CUDA tensor's settings (``precision_key_of``: the TF32 switch), so that the route's part of the TF32
    convention (key -> problem -> plan) runs on the CPU: the Torch executor computes with Torch's own ops either
    way."""
    cuda_convention = TorchAdapter.precision_convention
    reading = TorchAdapter().precision_key_of

    def convention(self, device):
        return cuda_convention(self, CUDA if device.kind == "cpu" else device)

    monkeypatch.setattr(TorchAdapter, "precision_convention", convention)
    monkeypatch.setattr(TorchAdapter, "precision_key_of", property(lambda self: lambda x: reading(_OnCuda)))
    call_key_classes.clear()  # the classes' keys are read from the adapter again (and again after the test)
    yield
    monkeypatch.undo()
    call_key_classes.clear()


def _operands(m=6, k=5, n=4, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(m, k, generator=g, dtype=dtype),
        torch.randn(k, n, generator=g, dtype=dtype),
        torch.randn(n, generator=g, dtype=dtype),
    )


def _infos(dtype="float32", device=CUDA, m=6, k=5, n=4, framework="torch"):
    return {
        "a": OperandInfo(None, framework, device, dtype, (m, k), (k, 1)),
        "b": OperandInfo(None, framework, device, dtype, (k, n), (n, 1)),
    }


# -- the autocast rule -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "dtypes, cast",
    [
        ({"a": "float32", "b": "float32"}, {"a": "bfloat16", "b": "bfloat16"}),
        ({"a": "bfloat16", "b": "float32", "bias": "float32"}, {"b": "bfloat16", "bias": "bfloat16"}),
        ({"a": "float16", "b": "float32", "c": "float32"}, {"a": "bfloat16", "b": "bfloat16", "c": "bfloat16"}),
        ({"a": "float32", "b": "float32", "relu_aux": "bool"}, {"a": "bfloat16", "b": "bfloat16"}),
        (
            {"a": "float32", "b": "float32", "gelu_aux": "float32"},
            {"a": "bfloat16", "b": "bfloat16", "gelu_aux": "bfloat16"},
        ),
        ({"a": "bfloat16", "b": "bfloat16"}, {}),
        ({"a": "float64", "b": "float64"}, None),
        ({"a": "float32", "b": "float64"}, None),
        ({"a": "complex64", "b": "complex64"}, None),
        ({"a": "int32", "b": "int32"}, None),
        ({"a": "float8_e4m3fn", "b": "float8_e4m3fn", "bias": "float32"}, None),
    ],
)
def test_the_autocast_rule_casts_floating_operands_below_float64_where_both_factors_are(dtypes, cast):
    assert autocast_targets("bfloat16", dtypes) == cast
    assert autocast_targets(None, dtypes) is None


# -- Torch: the convention the adapter reads --------------------------------------------------------------------
@pytest.mark.parametrize(
    "set_it, tf32",
    [
        (lambda: setattr(torch.backends.cuda.matmul, "allow_tf32", True), True),
        (lambda: setattr(torch.backends.cuda.matmul, "allow_tf32", False), False),
        (lambda: torch.set_float32_matmul_precision("high"), True),
        (lambda: torch.set_float32_matmul_precision("medium"), True),
        (lambda: torch.set_float32_matmul_precision("highest"), False),
    ],
    ids=["allow_tf32", "no_tf32", "high", "medium", "highest"],
)
def test_torch_tf32_settings_choose_float32_products_compute_type_on_cuda(tf32_setting, set_it, tf32):
    set_it()
    conv = TorchAdapter().precision_convention(CUDA)
    assert conv.float32 == ("COMPUTE_32F_FAST_TF32" if tf32 else None)
    assert conv.reason == f"Torch allow_tf32={tf32}"
    assert conv.autocast is None
    assert conv.for_result("float32") == conv.for_result("complex64") == (conv.float32, conv.reason)
    assert conv.for_result("float16") == conv.for_result("float64") == (None, None)
    cpu = TorchAdapter().precision_convention(CPU)  # the CPU's own setting (oneDNN's), bfloat16 at "medium" only
    setting = torch.backends.mkldnn.matmul.fp32_precision
    setting = "ieee" if setting == "none" else setting  # unset: inherited, Torch's default
    assert cpu.reason.startswith(f"Torch CPU matmul fp32_precision={setting!r}")
    assert cpu.float32 == ("COMPUTE_32F_FAST_16BF" if setting == "bf16" and _cpu_bf16() else None)
    assert cpu.for_result("complex64") == (None, None)  # Torch's CPU complex64 products stay float32


def _cpu_bf16() -> bool:
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def test_torch_new_precision_api_and_its_mix_with_the_legacy_one_are_read_as_torch_reads_them():
    # a process of its own: once the two APIs were mixed, Torch's own getters refuse to answer in it
    code = textwrap.dedent(
        """
        import torch
        from nvdispatch._adapters import Device
        from nvdispatch._adapters.torch import TorchAdapter, tf32_allowed
        key = TorchAdapter().precision_key
        cuda = Device("cuda", 0)
        seen = []
        torch.backends.cuda.matmul.fp32_precision = "tf32"   # the new API alone: the legacy getter raises
        seen.append((tf32_allowed(), key(), TorchAdapter().precision_convention(cuda).float32))
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        seen.append((tf32_allowed(), key(), TorchAdapter().precision_convention(cuda).float32))
        torch.backends.cuda.matmul.fp32_precision = "none"    # inherited from the generic setting
        torch.backends.fp32_precision = "tf32"
        seen.append((tf32_allowed(), key(), TorchAdapter().precision_convention(cuda).float32))
        torch.backends.mkldnn.matmul.fp32_precision = "bf16"  # the CPU's: the key follows it
        cpu = TorchAdapter().precision_convention(Device("cpu", None))
        seen.append((tf32_allowed(), key(), cpu.float32, cpu.reason))
        print(seen)
        print(bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    *_, seen, bf16 = out.strip().splitlines()
    cpu = (
        ("COMPUTE_32F_FAST_16BF", "Torch CPU matmul fp32_precision='bf16'")
        if bf16 == "True"
        else (None, "Torch CPU matmul fp32_precision='bf16' (float32: this CPU has no bfloat16 arithmetic)")
    )
    assert seen == str(
        [
            (True, (True, "none"), "COMPUTE_32F_FAST_TF32"),
            (False, (False, "none"), None),
            (True, (True, "tf32"), "COMPUTE_32F_FAST_TF32"),
            (True, (True, "bf16"), *cpu),
        ]
    )


@pytest.mark.parametrize(
    "device_type, dtype", [("cpu", torch.bfloat16), ("cpu", torch.float16), ("cuda", torch.float16)]
)
def test_torch_autocast_regions_are_reported_per_device_type(device_type, dtype):
    name = str(dtype).removeprefix("torch.")
    with autocast_region(device_type, dtype):
        conv = TorchAdapter().precision_convention(Device(device_type, 0 if device_type == "cuda" else None))
        other = TorchAdapter().precision_convention(CUDA if device_type == "cpu" else CPU)
    assert conv.autocast == name and conv.autocast_reason == f"Torch autocast({device_type!r}, {name})"
    assert other.autocast is None  # a region on one device type says nothing of the other
    assert TorchAdapter().precision_convention(CPU).autocast is None  # outside the region


def test_torch_precision_key_holds_tf32_and_the_active_regions(tf32_setting):
    key = TorchAdapter().precision_key
    torch.backends.cuda.matmul.allow_tf32 = False
    outside = key()
    torch.backends.cuda.matmul.allow_tf32 = True
    assert key() != outside
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = key()
        with torch.autocast("cpu", dtype=torch.float16):
            assert key() not in (bf16, outside)
    with autocast_region("cuda", torch.bfloat16):
        assert key() not in (bf16, outside)
    assert hash(bf16) is not None


def test_torch_precision_key_of_reads_the_settings_of_the_operands_device_alone(tf32_setting, monkeypatch):
    import nvdispatch._adapters.torch as torch_adapter

    compiled = TorchAdapter().precision_key_of
    monkeypatch.setattr(torch_adapter, "hotpath", lambda: None)
    python = torch_adapter._make_precision_key_of()  # the reading of a pure-Python install
    monkeypatch.undo()
    x = torch.ones(2, 2)
    seen = []
    for allowed in (False, True):
        torch.backends.cuda.matmul.allow_tf32 = allowed
        for key in (compiled, python):
            seen.append((key(x), key(_OnCuda())))
    (cpu_off, cuda_off), (cpu_off_py, cuda_off_py), (cpu_on, cuda_on), (cpu_on_py, cuda_on_py) = seen
    assert cpu_off == cpu_on == cpu_off_py == cpu_on_py  # a CPU product does not depend on the CUDA TF32 switch
    assert cuda_off == cuda_off_py == (False,) and cuda_on == cuda_on_py == (True,)
    assert compiled(x) is compiled(x)  # the same tuple while the settings stay the same
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = compiled(x), compiled(_OnCuda())
        assert inside == (python(x), python(_OnCuda()))
    assert inside[0] != cpu_on and inside[1] != cuda_on and torch.bfloat16 in inside[0]


def test_a_torch_cpu_call_is_not_planned_again_when_the_cuda_tf32_switch_changes(matmul_front, tf32_setting):
    a, b, bias = _operands(seed=3)

    def call():
        return nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})

    torch.backends.cuda.matmul.allow_tf32 = False
    call()
    assert _misses_of(call) == 0
    torch.backends.cuda.matmul.allow_tf32 = True
    assert _misses_of(call) == 0  # the same key: the CPU's own settings did not change
    np.testing.assert_allclose(
        call().numpy(), np.maximum(a.double().numpy() @ b.double().numpy() + bias.double().numpy(), 0), rtol=1e-5,
        atol=1e-6,
    )  # fmt: skip


# -- Torch: problems ---------------------------------------------------------------------------------------------
def test_a_convention_sets_the_compute_type_of_float32_and_complex64_products_only():
    conv = PrecisionConvention("COMPUTE_32F_FAST_TF32", "Torch allow_tf32=True")
    spec = spec_of(None)
    for dtype in ("float32", "complex64"):
        p = build_problem("torch", CUDA, _infos(dtype), spec, MatmulOptions(), 1, None, convention=conv)
        assert p.options.compute_type is TF32 and p.precision == "Torch allow_tf32=True"
        assert p.explicit_compute_type is None
        assert p.precision_note == "compute type COMPUTE_32F_FAST_TF32: Torch allow_tf32=True"
    for dtype in ("float16", "bfloat16", "float64"):
        p = build_problem("torch", CUDA, _infos(dtype), spec, MatmulOptions(), 1, None, convention=conv)
        assert p.options.compute_type is None and p.precision is None
    # a convention asking for the dtype's own compute type leaves the options (and the plan's tuning key) as they were
    none = PrecisionConvention(None, "Torch allow_tf32=False")
    p = build_problem("torch", CUDA, _infos(), spec, MatmulOptions(), 1, None, convention=none)
    plain = build_problem("torch", CUDA, _infos(), spec, MatmulOptions(), 1, None)
    assert p.options == plain.options and repr(p) == repr(plain) and p != plain
    assert p.precision_note == "compute type COMPUTE_32F: Torch allow_tf32=False"


def test_an_explicit_compute_type_wins_over_the_convention():
    conv = PrecisionConvention("COMPUTE_32F_FAST_TF32", "Torch allow_tf32=True")
    opts = MatmulOptions(compute_type="COMPUTE_32F")
    p = build_problem("torch", CUDA, _infos(), spec_of(None), opts, 1, None, convention=conv)
    assert p.options.compute_type is ComputeType.COMPUTE_32F and p.explicit_compute_type is ComputeType.COMPUTE_32F
    assert p.precision is None and p.precision_note == "compute type COMPUTE_32F: options.compute_type"


@pytest.mark.usefixtures("cpu_follows_tf32")
def test_explain_says_which_convention_chose_the_compute_type(tf32_setting):
    a, b, bias = _operands()
    torch.backends.cuda.matmul.allow_tf32 = True
    e = nvdispatch.explain(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    assert e.precision == "compute type COMPUTE_32F_FAST_TF32: Torch allow_tf32=True"
    assert "precision: compute type COMPUTE_32F_FAST_TF32: Torch allow_tf32=True" in str(e)
    assert not any("not applied" in s for s in e.steps)  # Torch's own ops follow Torch's own convention
    e = nvdispatch.explain(a, b, options={"compute_type": "COMPUTE_32F_FAST_16F"})
    assert e.precision == "compute type COMPUTE_32F_FAST_16F: options.compute_type"
    torch.backends.cuda.matmul.allow_tf32 = False
    assert nvdispatch.explain(a, b).precision == "compute type COMPUTE_32F: Torch allow_tf32=False"
    e = nvdispatch.explain(np.ones((3, 2), np.float32), np.ones((2, 3), np.float32))
    assert e.precision == "compute type COMPUTE_32F: the float32 default (no precision convention applies)"


# -- Torch: a changed setting changes the plan ------------------------------------------------------------------
def _misses_of(call):
    before = plan_cache.misses
    call()
    return plan_cache.misses - before


@pytest.mark.usefixtures("cpu_follows_tf32")
def test_a_tf32_setting_changed_between_two_calls_changes_the_plan(matmul_front, tf32_setting):
    a, b, bias = _operands()

    def call():
        return nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})

    torch.backends.cuda.matmul.allow_tf32 = False
    assert _misses_of(call) == 1
    assert _misses_of(call) == _misses_of(call) == 0  # repeated: the cached call (the memo on Torch tensors)
    torch.backends.cuda.matmul.allow_tf32 = True
    assert _misses_of(call) == 1  # another key, another problem (TF32), another plan
    assert _misses_of(call) == 0
    assert (
        nvdispatch.explain(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}).problem.options.compute_type is TF32
    )
    torch.backends.cuda.matmul.allow_tf32 = False
    assert _misses_of(call) == 0  # the first plan, still cached, under the first key
    assert (
        nvdispatch.explain(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}).problem.options.compute_type is None
    )
    np.testing.assert_allclose(
        call().numpy(),
        np.maximum(a.double().numpy() @ b.double().numpy() + bias.double().numpy(), 0),
        rtol=1e-5,
        atol=1e-6,
    )
    # the long key (c and beta, options...) holds the setting as the short one does
    c = torch.ones(6, 4)
    torch.backends.cuda.matmul.allow_tf32 = True
    assert _misses_of(lambda: nvdispatch.matmul(a, b, c, beta=0.5)) == 1
    torch.backends.cuda.matmul.allow_tf32 = False
    assert _misses_of(lambda: nvdispatch.matmul(a, b, c, beta=0.5)) == 1


@pytest.mark.usefixtures("cpu_follows_tf32")
@pytest.mark.parametrize("grad", [False, True], ids=["no-grad", "grad"])
def test_a_tf32_setting_changed_between_two_calls_of_a_compiled_graph_changes_the_plan(matmul_front, tf32_setting, grad):
    # a graph traced once (fullgraph) reads the setting when its operators run, as an eager call does: never the
    # plan of the setting current when it was traced
    a, b, bias = (x.requires_grad_(grad) for x in _operands())
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b, bias: nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}),
                             backend="aot_eager", fullgraph=True)  # fmt: skip
    want = np.maximum(a.detach().double().numpy() @ b.detach().double().numpy() + bias.detach().double().numpy(), 0)
    misses = []
    for setting in ("highest", "high", "highest", "high"):
        torch.set_float32_matmul_precision(setting)
        before = plan_cache.misses
        got = compiled(a, b, bias)
        misses.append(plan_cache.misses - before)
        np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-5, atol=1e-6)
    assert misses == [1, 1, 0, 0]  # one plan per setting, each found again when the setting comes back
    compute_types = {plan.problem.options.compute_type for plan in plan_cache.plans() if hasattr(plan, "problem")}
    assert compute_types == {None, TF32}
    torch._dynamo.reset()


def test_an_autocast_region_entered_between_two_calls_changes_the_plan_and_the_dtype(matmul_front):
    a, b, bias = _operands()

    def call():
        return nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})

    assert _misses_of(call) == 1 and call().dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _misses_of(call) == 2  # the cast problem's plan, and the region's (it casts, then runs that one)
        for _ in range(3):  # repeated calls in the region: the cached call casts too
            assert _misses_of(lambda: call().dtype == torch.bfloat16 or pytest.fail("not bfloat16")) == 0
        with torch.autocast("cpu", dtype=torch.float16):
            assert call().dtype == torch.float16
        with torch.autocast("cpu", enabled=False):
            assert call().dtype == torch.float32
    assert _misses_of(call) == 0 and call().dtype == torch.float32


def test_the_cached_call_in_a_region_runs_the_cast_problems_plan_behind_a_cast(matmul_front):
    a, b, bias = _operands()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        e = nvdispatch.explain(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    wrappers = [entry.plan for entry in plan_cache._users.values() if isinstance(entry.plan, AutocastPlan)]
    assert len(wrappers) == 1 and wrappers[0].plan.problem == e.problem
    assert wrappers[0].steps[0] == "autocast: a, b, bias cast to bfloat16 first"
    inner = wrappers[0].plan
    plan_cache.clear()  # the wrapper is released, and lets go of the plan it held
    assert not any(entry.plan is inner for entry in plan_cache._users.values())


# -- Torch autocast: dtypes as Torch's own ops, values as the oracle ----------------------------------------------
def _inputs_for(spec, a, b, bias, mask_like):
    inputs = {}
    if "bias" in spec.inputs:
        inputs["bias"] = bias
    if "relu_aux" in spec.inputs:
        inputs["relu_aux"] = mask_like > 0
    if "gelu_aux" in spec.inputs:
        inputs["gelu_aux"] = mask_like.clone()
    return inputs


def _torch_analog(name, a, b, bias, inputs):
    """The call Torch users write for the epilog, whose dtype under autocast is the one to follow."""
    if "BIAS" in name and not name.startswith("D"):
        pre = F.linear(a, b.T, bias)
    else:
        pre = torch.matmul(a, b)
    if name.startswith("DRELU"):
        return pre * inputs["relu_aux"]
    if name.startswith("DGELU"):  # the pre-activation as the forward layer returned it in the region
        return pre * inputs["gelu_aux"].to(pre.dtype)
    if "RELU" in name:
        return torch.relu(pre)
    if "GELU" in name:
        return F.gelu(pre, approximate="tanh")
    return pre


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("name", [e.name for e in EPILOGS])
def test_autocast_results_have_torchs_dtype_and_the_cast_operands_values_for_every_epilog(matmul_front, name, dtype):
    spec = EPILOGS[Epilog[name]]
    a, b, bias = _operands()
    mask_like = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))
    inputs = _inputs_for(spec, a, b, bias, mask_like)
    with torch.autocast("cpu", dtype=dtype):
        got = nvdispatch.matmul(a, b, epilog=name, epilog_inputs=inputs or None)
        again = nvdispatch.matmul(a, b, epilog=name, epilog_inputs=inputs or None)  # the cached call
        torch_dtype = _torch_analog(name, a, b, bias, inputs).dtype
    out, aux = got if spec.outputs else (got, {})
    out2, aux2 = again if spec.outputs else (again, {})
    assert out.dtype == out2.dtype == torch_dtype == dtype
    # the epilog defines its aux outputs for the cast problem: as a call on operands cast by hand computes them
    cast = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in inputs.items()}
    by_hand = nvdispatch.matmul(a.to(dtype), b.to(dtype), epilog=name, epilog_inputs=cast or None)
    _, hand_aux = by_hand if spec.outputs else (by_hand, {})
    assert {k: v.dtype for k, v in aux.items()} == {k: v.dtype for k, v in aux2.items()}
    assert {k: v.dtype for k, v in aux.items()} == {k: v.dtype for k, v in hand_aux.items()}
    # values: the float64 oracle of the cast operands
    want, want_aux = expected(a.to(dtype), b.to(dtype), None, 1, None, Epilog[name], cast)
    assert_close(out, want, str(dtype)[6:], name, scale=2.0)
    for k, v in aux.items():
        assert_close(v, want_aux[k], str(dtype)[6:] if v.is_floating_point() else "bool", k, scale=4.0)


@pytest.mark.parametrize("shape_c", [(6, 4), (4,)])
def test_autocast_casts_c_as_torch_addmm_does(matmul_front, shape_c):
    a, b, _ = _operands()
    c = torch.randn(*shape_c, generator=torch.Generator().manual_seed(2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = nvdispatch.matmul(a, b, c, alpha=0.5, beta=2.0)
        want_dtype = torch.addmm(c, a, b, alpha=0.5, beta=2.0).dtype
    assert got.dtype == want_dtype == torch.bfloat16
    want, _ = expected(a.bfloat16(), b.bfloat16(), c.bfloat16(), 0.5, 2.0, None, {})
    assert_close(got, want, "bfloat16", scale=2.0)


def test_autocast_leaves_float64_integer_and_complex_products_alone(matmul_front):
    a, b, bias = _operands(dtype=torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}).dtype == torch.float64
        assert torch.matmul(a, b).dtype == torch.float64  # Torch's own rule
        ints = torch.arange(6).reshape(2, 3)
        assert nvdispatch.matmul(ints, ints.T).dtype == torch.int64
        cplx = torch.ones(2, 2, dtype=torch.complex64)
        assert nvdispatch.matmul(cplx, cplx).dtype == torch.complex64
        e = nvdispatch.explain(a, b)
    assert (
        e.problem.autocast is None
        and e.precision == "compute type COMPUTE_64F: the float64 default (no precision convention applies)"
    )


def test_an_explicit_compute_type_wins_over_an_autocastautocast_region(matmul_front):
    a, b, bias = _operands()
    opts = {"compute_type": "COMPUTE_32F"}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for _ in range(2):
            got = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}, options=opts)
            plain = nvdispatch.matmul(a, b, options=opts)
            assert got.dtype == plain.dtype == torch.float32
        e = nvdispatch.explain(a, b, options=opts)
    assert e.problem.autocast is None and "outside any autocast region (options.compute_type was given)" in e.steps
    want = np.maximum(a.double().numpy() @ b.double().numpy() + bias.double().numpy(), 0)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)  # float32, not bfloat16, accuracy


def test_explain_says_the_region_cast_the_operands():
    a, b, bias = _operands()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        e = nvdispatch.explain(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        already = nvdispatch.explain(a.bfloat16(), b.bfloat16())
    assert (
        e.precision
        == "compute type COMPUTE_32F, result bfloat16: Torch autocast('cpu', bfloat16): a, b, bias cast to bfloat16"
    )
    assert e.problem.result_dtype == "bfloat16" and e.problem.autocast == ("a", "b", "bias")
    assert already.precision.endswith("Torch autocast('cpu', bfloat16): operands already in bfloat16")


def test_autograd_flows_through_the_cast_back_to_float32_leaves(matmul_front):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 4, generator=g, requires_grad=True)
    w = torch.randn(4, 3, generator=g, requires_grad=True)
    bias = torch.randn(3, generator=g, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = nvdispatch.matmul(x, w, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        want = torch.relu(F.linear(x, w.T, bias))
    assert y.dtype == want.dtype == torch.bfloat16
    y.float().sum().backward()
    got = [t.grad.clone() for t in (x, w, bias)]
    for t in (x, w, bias):
        t.grad = None
    want.float().sum().backward()
    for mine, theirs in zip(got, (x.grad, w.grad, bias.grad)):
        assert mine.dtype == theirs.dtype == torch.float32
        torch.testing.assert_close(mine, theirs, rtol=2e-2, atol=2e-2)


# -- Torch: the stateful Matmul keeps the precision of its plan() ----------------------------------------------------
def test_a_matmul_keeps_the_region_it_was_planned_in_until_plan_is_called_again(matmul_front):
    a, b, bias = _operands()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mm = nvdispatch.Matmul(a, b).plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        assert mm.execute().dtype == torch.bfloat16
    assert mm.execute().dtype == torch.bfloat16  # outside the region: the plan's precision, not the setting's
    want, _ = expected(a.bfloat16(), b.bfloat16(), None, 1, None, Epilog.RELU_BIAS, {"bias": bias.bfloat16()})
    assert_close(mm.execute(), want, "bfloat16", scale=2.0)
    # new operands (as given: float32) are taken, cast by the plan's region
    a2, b2, bias2 = _operands(seed=7)
    mm.reset_operands(a2, b2, epilog_inputs={"bias": bias2})
    want2, _ = expected(a2.bfloat16(), b2.bfloat16(), None, 1, None, Epilog.RELU_BIAS, {"bias": bias2.bfloat16()})
    assert_close(mm.execute(), want2, "bfloat16", scale=2.0)
    mm.reset_operands(a2.T.contiguous().T)  # other strides: re-planned, in the plan's region still
    assert mm.execute().dtype == torch.bfloat16
    assert mm.autotune(iterations=1) and mm.execute().dtype == torch.bfloat16
    mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias2})  # plan() again: the settings of now
    assert mm.execute().dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert mm.execute().dtype == torch.float32
    mm.free()


@pytest.mark.usefixtures("cpu_follows_tf32")
def test_a_matmul_keeps_the_tf32_setting_of_its_plan(matmul_front, tf32_setting):
    a, b, _ = _operands()
    torch.backends.cuda.matmul.allow_tf32 = True
    mm = nvdispatch.Matmul(a, b).plan()
    torch.backends.cuda.matmul.allow_tf32 = False
    mm.reset_operands(a.T.contiguous().T)  # a re-plan keeps the convention plan() followed
    assert mm._problem.options.compute_type is TF32 and mm._problem.precision == "Torch allow_tf32=True"
    mm.plan()
    assert mm._problem.options.compute_type is None and mm._problem.precision == "Torch allow_tf32=False"
    mm.free()


# -- Torch programs: torch.compile and the operators' autocast kernel --------------------------------------------------
def test_under_torch_compile_a_region_is_followed_as_eagerly():
    a, b, bias = _operands()

    def layer(x, w, bias):
        return nvdispatch.matmul(x, w, epilog="RELU_BIAS", epilog_inputs={"bias": bias}) * 2

    compiled = torch.compile(layer, backend="eager")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = compiled(a, b, bias)
        want = torch.relu(F.linear(a, b.T, bias)) * 2
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    torch._dynamo.reset()


def _operator_call(a, b, bias):
    from nvdispatch.integrations import torch_ops

    return torch_ops.matmul_op(a, b, None, bias, *[None] * 6, 1, None, "RELU_BIAS", "", "", "")[0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_the_matmul_operator_follows_the_region_eager_and_compiled_fullgraph(dtype):
    a, b, bias = _operands()
    with torch.autocast("cpu", dtype=dtype):
        eager = _operator_call(a, b, bias)
        compiled = torch.compile(_operator_call, backend="aot_eager", fullgraph=True)(a, b, bias)
        want = torch.relu(F.linear(a, b.T, bias))
    assert eager.dtype == compiled.dtype == want.dtype == dtype
    torch.testing.assert_close(eager, want, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(compiled, want, rtol=2e-2, atol=2e-2)
    a64, b64, bias64 = _operands(dtype=torch.float64)
    with torch.autocast("cpu", dtype=dtype):
        assert _operator_call(a64, b64, bias64).dtype == torch.float64  # the rule leaves float64 products alone
    assert _operator_call(a, b, bias).dtype == torch.float32  # outside a region
    torch._dynamo.reset()


def _every_epilog(a, b, bias, mask_like):
    out = {}
    for spec in EPILOGS.values():
        name = spec.epilog.name
        out[name] = nvdispatch.matmul(a, b, epilog=name, epilog_inputs=_inputs_for(spec, a, b, bias, mask_like) or None)
    return out


def test_a_compiled_graph_follows_the_region_for_every_epilog_as_torchs_own_ops_do():
    # compiled with fullgraph outside a region, then called inside one: Dynamo's guard on the autocast state traces
    # it again, and every epilog's result (and aux outputs) has the dtype of Torch's own op in the region, with the
    # values of the operands cast to it
    a, b, bias = _operands()
    mask_like = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    compiled = torch.compile(_every_epilog, backend="aot_eager", fullgraph=True)
    outside = compiled(a, b, bias, mask_like)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = compiled(a, b, bias, mask_like)
        eager = _every_epilog(a, b, bias, mask_like)
    for spec in EPILOGS.values():
        name = spec.epilog.name
        inputs = _inputs_for(spec, a, b, bias, mask_like)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch_dtype = _torch_analog(name, a, b, bias, inputs).dtype
        got, aux = inside[name] if spec.outputs else (inside[name], {})
        want_eager, eager_aux = eager[name] if spec.outputs else (eager[name], {})
        assert got.dtype == want_eager.dtype == torch_dtype == torch.bfloat16, name
        assert {k: v.dtype for k, v in aux.items()} == {k: v.dtype for k, v in eager_aux.items()}, name
        assert (outside[name][0] if spec.outputs else outside[name]).dtype == torch.float32, name
        cast = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in inputs.items()}
        want, want_aux = expected(a.bfloat16(), b.bfloat16(), None, 1, None, Epilog[name], cast)
        assert_close(got, want, "bfloat16", name, scale=2.0)
        for k, v in aux.items():
            assert_close(v, want_aux[k], "bfloat16" if v.is_floating_point() else "bool", f"{name} {k}", scale=4.0)
    torch._dynamo.reset()


def test_a_recorded_call_in_a_region_computes_in_its_dtype_and_its_gradients_reach_the_float32_leaves():
    a, b, bias = (x.requires_grad_() for x in _operands())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        want = torch.relu(F.linear(a, b.T, bias))
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    got.float().sum().backward()
    grads = [x.grad.clone() for x in (a, b, bias)]
    for x in (a, b, bias):
        x.grad = None
    want.float().sum().backward()
    for g, x in zip(grads, (a, b, bias)):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, x.grad, rtol=3e-2, atol=3e-2)


# -- JAX -------------------------------------------------------------------------------------------------------------
jax = pytest.importorskip("jax")


@pytest.fixture
def jax_precision():
    saved = jax.config.jax_default_matmul_precision
    yield
    jax.config.update("jax_default_matmul_precision", saved)


@pytest.mark.parametrize(
    "setting, compute",
    [
        (None, "COMPUTE_32F_FAST_TF32"),
        ("default", "COMPUTE_32F_FAST_TF32"),
        ("bfloat16", "COMPUTE_32F_FAST_TF32"),
        ("high", "COMPUTE_32F_FAST_TF32"),
        ("tensorfloat32", "COMPUTE_32F_FAST_TF32"),
        ("highest", "COMPUTE_32F"),
        ("float32", "COMPUTE_32F"),
        ("TF32_TF32_F32", "COMPUTE_32F_FAST_TF32"),
        ("BF16_BF16_F32", "COMPUTE_32F_FAST_16BF"),
        ("F16_F16_F32", "COMPUTE_32F_FAST_16F"),
        ("F32_F32_F32", "COMPUTE_32F"),
        ("BF16_BF16_F32_X6", "COMPUTE_32F"),
    ],
)
def test_jax_default_matmul_precision_config_chooses_the_gpu_compute_type(jax_precision, setting, compute):
    jax.config.update("jax_default_matmul_precision", setting)
    conv = JaxAdapter().precision_convention(CUDA)
    assert conv.float32 == compute and conv.autocast is None
    assert conv.reason.startswith("JAX default_matmul_precision") and conv.reason.endswith("on an NVIDIA GPU")
    cpu = JaxAdapter().precision_convention(CPU)  # XLA computes float32 in float32 on the CPU: named all the same
    assert cpu.float32 is None and cpu.reason.endswith(": float32 on the CPU, as XLA's")
    p = build_problem(
        "dlpack", CUDA, _infos(framework="dlpack"), spec_of(None), MatmulOptions(), 1, None, convention=conv
    )
    assert p.precision_note == f"compute type {compute}: {conv.reason}"


def test_jax_default_matmul_precision_context_is_honoured_and_changes_the_key(jax_precision):
    key = JaxAdapter().precision_key
    assert JaxAdapter().precision_convention(CUDA).float32 == "COMPUTE_32F_FAST_TF32"
    outside = key()
    with jax.default_matmul_precision("float32"):
        assert JaxAdapter().precision_convention(CUDA).float32 == "COMPUTE_32F"
        assert key() != outside
        with jax.default_matmul_precision("tensorfloat32"):
            assert JaxAdapter().precision_convention(CUDA).float32 == "COMPUTE_32F_FAST_TF32"
    assert key() == outside


def test_every_jax_precision_and_algorithm_preset_has_a_compute_type():
    names = {c.name for c in ComputeType}
    for value in (*jax.lax.Precision, *jax.lax.DotAlgorithmPreset):
        compute, _ = float32_compute_type(value)
        assert compute in names
    assert float32_compute_type(jax.lax.Precision.HIGHEST)[0] == "COMPUTE_32F"
    assert float32_compute_type(jax.lax.DotAlgorithmPreset.DEFAULT)[0] == "COMPUTE_32F_FAST_TF32"


def test_jax_cpu_products_are_unchanged_by_the_precision_setting(jax_precision):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((8, 16)).astype(np.float32), rng.standard_normal((16, 4)).astype(np.float32)
    with jax.default_matmul_precision("bfloat16"):
        got = nvdispatch.matmul(jax.numpy.asarray(a), jax.numpy.asarray(b))
        e = nvdispatch.explain(jax.numpy.asarray(a), jax.numpy.asarray(b))
    np.testing.assert_allclose(np.asarray(got), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    assert (
        e.precision == "compute type COMPUTE_32F: JAX default_matmul_precision 'bfloat16': float32 on the CPU, as XLA's"
    )


# -- CuPy (a stand-in module: CuPy's own reading of CUPY_TF32, as its _routines_linalg does it) --------------------------
def _fake_cupy(monkeypatch, with_reader=True):
    """A ``cupy`` package with ``_core._routines_linalg.get_compute_type`` doing what CuPy's does: the compute type
    of a dtype is decided at the first product of that dtype (``CUPY_TF32`` read from the environment then) and
    kept; ``set_compute_type`` changes it."""
    import os

    cupy = types.ModuleType("cupy")
    cupy.ndarray = type("ndarray", (), {})
    core = types.ModuleType("cupy._core")
    linalg_mod = types.ModuleType("cupy._core._routines_linalg")
    decided = {}

    def get_compute_type(dtype):
        index = np.dtype(dtype).char
        if index not in decided:
            decided[index] = 7 if index in "fF" and int(os.getenv("CUPY_TF32", "0")) > 0 else 1
        return decided[index]

    def set_compute_type(dtype, compute_type):
        decided[np.dtype(dtype).char] = compute_type

    names = {1: "COMPUTE_TYPE_DEFAULT", 2: "COMPUTE_TYPE_PEDANTIC", 7: "COMPUTE_TYPE_TF32"}
    if with_reader:
        linalg_mod.get_compute_type = get_compute_type
        linalg_mod.set_compute_type = set_compute_type
        linalg_mod.compute_type_to_str = names.get
    core._routines_linalg = linalg_mod
    cupy._core = core
    for name, mod in (("cupy", cupy), ("cupy._core", core), ("cupy._core._routines_linalg", linalg_mod)):
        monkeypatch.setitem(sys.modules, name, mod)
    return linalg_mod


def test_cupy_tf32_is_read_as_cupy_reads_it(monkeypatch):
    linalg_mod = _fake_cupy(monkeypatch)
    monkeypatch.setenv("CUPY_TF32", "1")
    adapter = CupyAdapter()
    conv = adapter.precision_convention(CUDA)
    assert conv.float32 == "COMPUTE_32F_FAST_TF32"
    assert conv.reason == "CuPy compute type COMPUTE_TYPE_TF32 (CUPY_TF32 '1')"
    monkeypatch.setenv("CUPY_TF32", "0")  # CuPy decided at its first float32 product: it keeps TF32, so do we
    assert adapter.precision_convention(CUDA).float32 == "COMPUTE_32F_FAST_TF32"
    key = adapter.precision_key()
    linalg_mod.set_compute_type(np.float32, 2)  # cupy's set_compute_type: pedantic float32
    assert adapter.precision_key() != key
    assert adapter.precision_convention(CUDA).float32 == "COMPUTE_32F_PEDANTIC"
    linalg_mod.set_compute_type(np.float32, 1)
    conv = adapter.precision_convention(CUDA)
    assert conv.float32 is None and conv.for_result("float32") == (None, conv.reason)


def test_cupy_without_the_compute_type_reader_reads_the_environment_per_call(monkeypatch):
    _fake_cupy(monkeypatch, with_reader=False)
    adapter = CupyAdapter()
    monkeypatch.delenv("CUPY_TF32", raising=False)
    assert adapter.precision_convention(CUDA).float32 is None
    monkeypatch.setenv("CUPY_TF32", "1")
    assert adapter.precision_convention(CUDA).float32 == "COMPUTE_32F_FAST_TF32"


def test_a_cupy_convention_keeps_plain_products_on_cupy_matmul_where_an_explicit_one_does_not():
    from nvdispatch.executors.cupy_matmul import plain_product

    conv = PrecisionConvention("COMPUTE_32F_FAST_TF32", "CuPy compute type COMPUTE_TYPE_TF32 (CUPY_TF32 '1')")
    spec = spec_of(None)
    by_convention = build_problem(
        "cupy", CUDA, _infos(framework="cupy"), spec, MatmulOptions(), 1, None, convention=conv
    )
    explicit = build_problem("cupy", CUDA, _infos(framework="cupy"), spec, MatmulOptions(compute_type=TF32), 1, None)
    assert by_convention.options.compute_type is explicit.options.compute_type is TF32
    assert plain_product(by_convention) and not plain_product(explicit)  # cupy.matmul applies CuPy's own


# -- frameworks without a convention ---------------------------------------------------------------------------------------
def test_numpy_and_raw_cuda_arrays_have_no_convention():
    assert adapter_named("numpy").precision_key is None
    assert adapter_named("numpy").precision_convention(CPU) is None
    assert adapter_named("cuda_array_interface").precision_convention(CUDA) is None


# -- the plan a call key leads to in a region ------------------------------------------------------------------------------
class _Plan:
    strategy = "native"
    steps = ("the product",)
    needs_release = True

    def __init__(self, log):
        self.log = log
        self.problem = types.SimpleNamespace(epilog=spec_of("RELU_BIAS"))
        self.released = False

    def execute(self, operands, stream=None):
        self.log.append(("execute", tuple(sorted(operands.items())), stream))
        return "out"

    def direct(self, a, b, bias):
        self.log.append(("direct", a, b, bias))
        return "out"

    def release(self):
        self.released = True


def test_an_autocast_plan_casts_on_the_calls_stream_and_holds_its_plan_until_released():
    log = []
    inner = _Plan(log)

    @contextlib.contextmanager
    def on_stream(stream):
        log.append(("enter", stream))
        yield
        log.append(("exit", stream))

    cast = lambda x, dtype: f"{x}:{dtype}"
    wrapper = AutocastPlan(inner, plan_cache.hold(inner), ("a", "bias"), "bfloat16", cast, on_stream)
    assert wrapper.steps == ("autocast: a, bias cast to bfloat16 first", "the product")
    assert wrapper.execute({"a": "A", "b": "B", "bias": "V", "alpha": 1}, "S") == "out"
    assert log == [
        ("enter", "S"),
        ("exit", "S"),
        ("execute", (("a", "A:bfloat16"), ("alpha", 1), ("b", "B"), ("bias", "V:bfloat16")), "S"),
    ]
    log.clear()
    wrapper.direct("A", "B", "V")  # the route's direct call: a, b, then the epilog's input
    assert log == [("direct", "A:bfloat16", "B", "V:bfloat16")]
    wrapper.execute({"a": "A"})  # the current stream: no context
    assert log[-1][0] == "execute" and not any(e[0] == "enter" for e in log)
    # the wrapper holds its plan: retired from the cache meanwhile, it is released only with the wrapper
    key = ("precision-test", id(inner))
    plan_cache.put(key, inner)
    plan_cache.clear()
    assert not inner.released
    wrapper.release()
    assert inner.released
