"""The fused MLP chain's process-wide options (``integrations/mlp_options.py``): GELU's split forward (a BIAS GEMM
and the framework's GELU) against a float64 NumPy oracle, the autotune option's reach (CUDA cuBLASLt plans only),
the one-pass choice's samples of several calls, and typed errors for what the options do not take."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
from nvdispatch import linalg
from nvdispatch.errors import InvalidArgumentError

torch = pytest.importorskip("torch")

from nvdispatch.integrations import lt_tune_once, mlp_options, torch_mlp_plan  # noqa: E402
from nvdispatch.integrations import torch_activation_grad as one_pass  # noqa: E402
from nvdispatch.integrations.mlp_options import mlp_options as current  # noqa: E402
from nvdispatch.integrations.mlp_options import set_mlp_options  # noqa: E402
from nvdispatch.integrations.torch_mlp import FusedMLP  # noqa: E402

from . import mlp_oracle  # noqa: E402

WIDTHS = [6, 12, 10, 3]


def _numpy(t):
    return t.detach().double().cpu().numpy()


@pytest.fixture
def fresh(monkeypatch):
    """Options back to their defaults and the plan cache empty, before and after; the epilogs of the GEMMs
    prepared meanwhile listed."""
    made = []
    prepare = linalg.prepare_call

    def counting(a, b, epilog=None, epilog_inputs=None):
        made.append(epilog)
        return prepare(a, b, epilog, epilog_inputs)

    for name in ("NVDISPATCH_MLP_AUTOTUNE", "NVDISPATCH_MLP_AUTOTUNE_BUDGET", "NVDISPATCH_MLP_CHOICE_REPEAT",
                 "NVDISPATCH_MLP_GELU_FORWARD"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    before = set_mlp_options(autotune=None, autotune_budget=None, choice_repeat=None, gelu_forward=None)
    nvdispatch.plan_cache.clear()
    monkeypatch.setattr(linalg, "prepare_call", counting)
    yield made
    set_mlp_options(**before)
    nvdispatch.plan_cache.clear()


@pytest.mark.parametrize("mode", ["eager", "aot_eager"])
def test_the_split_gelu_forward_matches_a_float64_oracle(fresh, mode):
    set_mlp_options(gelu_forward="split")
    torch.manual_seed(5)
    mlp = FusedMLP(WIDTHS, activation="gelu", dtype=torch.float64)
    fn = mlp if mode == "eager" else torch.compile(mlp, backend="aot_eager", fullgraph=True)
    for step in range(3):  # the first step prepares the chain's GEMMs, the others run them
        for p in mlp.parameters():
            p.grad = None
        x = torch.randn(5 + step, WIDTHS[0], dtype=torch.float64, requires_grad=True)
        x_before = x.detach().clone()
        out = fn(x)
        g = torch.randn(out.shape, dtype=torch.float64)
        out.backward(g)
        ws, bs = [_numpy(w) for w in mlp.weights], [_numpy(b) for b in mlp.biases]
        y, dx, dws, dbs = mlp_oracle.chain(_numpy(x), ws, bs, _numpy(g), "gelu")
        np.testing.assert_allclose(_numpy(out), y, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(_numpy(x.grad), dx, rtol=1e-10, atol=1e-10)
        for p, want in zip([*mlp.weights, *mlp.biases], [*dws, *dbs]):
            np.testing.assert_allclose(_numpy(p.grad), want, rtol=1e-10, atol=1e-10)
        assert torch.equal(x.detach(), x_before)  # the input is not modified
    assert "GELU_AUX_BIAS" not in fresh and fresh.count("BIAS") >= len(WIDTHS) - 1  # every forward GEMM a BIAS one
    assert "DGELU" in fresh  # the backward takes the split forward's pre-activations as GELU_AUX_BIAS's


def test_the_epilogue_gelu_forward_is_the_default(fresh):
    torch.manual_seed(5)
    mlp = FusedMLP(WIDTHS, activation="gelu", dtype=torch.float64)
    mlp(torch.randn(4, WIDTHS[0], dtype=torch.float64, requires_grad=True)).sum().backward()
    assert "GELU_AUX_BIAS" in fresh and current()["gelu_forward"] == "epilogue"


def test_a_relu_chain_and_inference_ignore_the_gelu_forward(fresh):
    set_mlp_options(gelu_forward="split")
    torch.manual_seed(5)
    relu = FusedMLP(WIDTHS, activation="relu", dtype=torch.float64)
    relu(torch.randn(4, WIDTHS[0], dtype=torch.float64, requires_grad=True)).sum().backward()
    gelu = FusedMLP(WIDTHS, activation="gelu", dtype=torch.float64)
    with torch.no_grad():
        gelu(torch.randn(4, WIDTHS[0], dtype=torch.float64))
    assert "RELU_BIAS" in fresh and "GELU_BIAS" in fresh and "GELU_AUX_BIAS" not in fresh


def test_a_plan_keeps_the_gelu_forward_it_first_read(fresh):
    torch.manual_seed(5)
    mlp = FusedMLP(WIDTHS, activation="gelu", dtype=torch.float64)
    x = torch.randn(4, WIDTHS[0], dtype=torch.float64, requires_grad=True)
    mlp(x).sum().backward()
    set_mlp_options(gelu_forward="split")  # after the problem was prepared: it keeps its form
    first = len(fresh)
    mlp(x).sum().backward()
    assert len(fresh) == first
    nvdispatch.plan_cache.clear()  # prepared again: the new form
    mlp(x).sum().backward()
    assert "GELU_AUX_BIAS" not in fresh[first:] and "BIAS" in fresh[first:]


def test_the_autotune_option_leaves_cpu_chains_untuned(fresh, monkeypatch):
    tuned = []
    monkeypatch.setattr(lt_tune_once, "tune_once", lambda *a, **k: tuned.append(a) or "tuned")
    set_mlp_options(autotune="always")
    torch.manual_seed(5)
    mlp = FusedMLP(WIDTHS, activation="relu", dtype=torch.float64)
    mlp(torch.randn(4, WIDTHS[0], dtype=torch.float64, requires_grad=True)).sum().backward()
    assert tuned == [] and fresh  # prepared, nothing timed: no cuBLASLt plan on the CPU
    plans = [p for p in nvdispatch.plan_cache.plans() if isinstance(p, torch_mlp_plan.MlpChainPlan)]
    assert plans and all(p.tuned == {} for p in plans)


class _Problem:
    m = n = k = 4096
    batch_shape = ()


class _Plan:
    problem = _Problem()


class _CudaLike(torch.Tensor):
    """A CPU tensor that says it is on CUDA (what the option's check reads), for the tuning's path on the CPU."""

    @property
    def is_cuda(self):
        return True


@pytest.mark.parametrize(("mode", "asked"), [("off", False), ("auto", True), ("always", True)])
def test_the_autotune_option_tunes_a_site_once_as_its_mode_says(fresh, monkeypatch, mode, asked):
    seen = []
    monkeypatch.setattr(lt_tune_once, "tune_once", lambda plan, **k: seen.append((plan, k["budget"])) or "timed")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    set_mlp_options(autotune=mode, autotune_budget=0.25)
    chain = torch_mlp_plan.MlpChainPlan("test")
    a = torch.zeros(2, 2).as_subclass(_CudaLike)
    plan = _Plan()
    assert chain._autotune(("forward", 0), plan, a) is asked
    assert seen == ([(plan, 0.25)] if asked else []) and chain.tuned == ({("forward", 0): "timed"} if asked else {})


def test_the_auto_mode_leaves_small_products_and_captures_alone(fresh, monkeypatch):
    seen = []
    monkeypatch.setattr(lt_tune_once, "tune_once", lambda plan, **k: seen.append(plan) or "timed")
    set_mlp_options(autotune="auto")
    chain = torch_mlp_plan.MlpChainPlan("test")
    a = torch.zeros(2, 2).as_subclass(_CudaLike)
    small = _Plan()
    small.problem = type("Small", (), {"m": 64, "n": 64, "k": 64, "batch_shape": ()})()
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert chain._autotune("site", small, a) is False
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert chain._autotune("site", _Plan(), a) is False  # nothing is timed inside a CUDA-graph capture
    assert seen == []


def test_options_come_from_the_environment_and_the_process_setting_wins(fresh, monkeypatch):
    monkeypatch.setenv("NVDISPATCH_MLP_GELU_FORWARD", " Split ")
    monkeypatch.setenv("NVDISPATCH_MLP_AUTOTUNE", "auto")
    monkeypatch.setenv("NVDISPATCH_MLP_AUTOTUNE_BUDGET", "0.5")
    monkeypatch.setenv("NVDISPATCH_MLP_CHOICE_REPEAT", "8")
    assert current() == {"autotune": "auto", "autotune_budget": 0.5, "choice_repeat": 8, "gelu_forward": "split"}
    before = set_mlp_options(gelu_forward="epilogue", autotune="off", choice_repeat=2)
    assert before == {"gelu_forward": None, "autotune": None, "choice_repeat": None}
    assert current() == {"autotune": "off", "autotune_budget": 0.5, "choice_repeat": 2, "gelu_forward": "epilogue"}
    set_mlp_options(**before)
    assert current()["gelu_forward"] == "split"


@pytest.mark.parametrize(("options", "argument"), [
    ({"gelu_forward": "fused"}, "gelu_forward"),
    ({"autotune": True}, "autotune"),
    ({"autotune_budget": 0}, "autotune_budget"),
    ({"autotune_budget": "1"}, "autotune_budget"),
    ({"choice_repeat": 0}, "choice_repeat"),
    ({"choice_repeat": 2.0}, "choice_repeat"),
    ({"gelu": "split"}, "gelu"),
])  # fmt: skip
def test_options_it_does_not_take_are_typed_errors_and_set_nothing(fresh, options, argument):
    valid = {"autotune": "always"} if "autotune" not in options else {"gelu_forward": "split"}
    with pytest.raises(InvalidArgumentError, match=argument):
        set_mlp_options(**valid, **options)
    assert current() == {"autotune": "off", "autotune_budget": lt_tune_once.BUDGET_SECONDS, "choice_repeat": 1,
                         "gelu_forward": "epilogue"}  # fmt: skip


@pytest.mark.parametrize(("name", "value"), [("NVDISPATCH_MLP_GELU_FORWARD", "aux"), ("NVDISPATCH_MLP_AUTOTUNE", "1"),
                                             ("NVDISPATCH_MLP_AUTOTUNE_BUDGET", "-2"),
                                             ("NVDISPATCH_MLP_CHOICE_REPEAT", "many")])  # fmt: skip
def test_an_environment_value_it_does_not_take_is_a_typed_error_naming_the_variable(fresh, monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(InvalidArgumentError, match=name):
        current()


def test_a_choice_samples_repeat_calls_back_to_back(fresh, monkeypatch):
    """Each timed sample runs a form ``choice_repeat`` times (on the GPU the stream's queue fills: its GPU time), and the
    sample is the time per call. Stand-in CUDA events on the CPU count the calls between them."""
    calls = {"epilogue": 0, "one-pass": 0}
    clock = [0.0]

    class Event:
        def __init__(self, enable_timing=True):
            self.at = 0.0

        def record(self, stream=None):
            self.at = clock[0]

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return (other.at - self.at) * 1e3

    def form(label, cost):
        def run():
            calls[label] += 1
            clock[0] += cost

        return run

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    set_mlp_options(choice_repeat=4)
    key = ("test", "repeat")
    try:
        got = one_pass.choose(key, {"epilogue": form("epilogue", 2.0), "one-pass": form("one-pass", 1.0)},
                              torch.device("cuda"))  # fmt: skip
    finally:
        one_pass.forget_choices()
    assert got == "one-pass"
    # one untimed call each (the other forms' check that they run here, the first form's warm-up), then ROUNDS
    # samples of choice_repeat calls
    assert calls == {"epilogue": 1 + 4 * one_pass.ROUNDS, "one-pass": 1 + 4 * one_pass.ROUNDS}


def test_the_options_module_is_framework_free():
    assert "torch" not in mlp_options.__dict__ and "torch" not in lt_tune_once.__dict__



def _cuda_check(mlp, fn, rows=200):
    """One bfloat16 step of ``fn`` (``mlp`` or its compiled form) on CUDA against the same chain in float64 (the
    error relative to each result's norm: a bfloat16 chain's rounding)."""
    x = torch.randn(rows, mlp.widths[0], device="cuda").to(torch.bfloat16).requires_grad_()
    for p in mlp.parameters():
        p.grad = None
    out = fn(x)
    g = torch.randn(out.shape, device="cuda").to(torch.bfloat16)
    out.backward(g)
    ws, bs = [_numpy(w) for w in mlp.weights], [_numpy(b) for b in mlp.biases]
    y, dx, dws, dbs = mlp_oracle.chain(_numpy(x), ws, bs, _numpy(g), "gelu")
    got = [out, x.grad, *[p.grad for p in [*mlp.weights, *mlp.biases]]]
    for have, want in zip(got, [y, dx, *dws, *dbs]):
        assert np.linalg.norm(_numpy(have) - want) <= 0.05 * np.linalg.norm(want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch with CUDA")
@pytest.mark.parametrize("mode", ["eager", "reduce-overhead"])
@pytest.mark.parametrize("options", [{"gelu_forward": "split"}, {"autotune": "always", "autotune_budget": 0.2}])
def test_the_options_on_cuda_match_a_float64_oracle(fresh, mode, options):
    set_mlp_options(**options)
    torch.manual_seed(7)
    mlp = FusedMLP([64, 136, 128, 40], activation="gelu", device="cuda", dtype=torch.bfloat16)
    fn = mlp if mode == "eager" else torch.compile(mlp, mode="reduce-overhead", fullgraph=True)
    for _ in range(4):  # warm-up, recording, replays
        if mode != "eager":
            torch.compiler.cudagraph_mark_step_begin()
        _cuda_check(mlp, fn)
    plans = [p for p in nvdispatch.plan_cache.plans() if isinstance(p, torch_mlp_plan.MlpChainPlan)]
    if "autotune" in options:
        assert any(p.tuned for p in plans)  # the sites' cuBLASLt plans were tuned
    else:
        assert "GELU_AUX_BIAS" not in fresh
