"""How the GPU convolution chooses its strategy, on the CPU: the timed choice over fake plans and a fake
clock (no timing thresholds: the clock's figures are the test's own), the recorded choice and its
persistence, and the traffic model's ordering of the strategies."""

from __future__ import annotations

import json

import pytest

from nvdispatch import plan_cache
from nvdispatch._adapters import CPU, OperandInfo
from nvdispatch._fft_convolve import build_convolve_problem
from nvdispatch._tunings import key_text
from nvdispatch.errors import InvalidArgumentError, PlanStateError
from nvdispatch.executors import cuda_fft_convolve as op
from nvdispatch.executors import cuda_fft_convolve_model as model
from nvdispatch.executors.timed_choice import (
    ROUNDS,
    SAMPLE_SECONDS,
    TUNING_KIND,
    Candidate,
    TimedChoicePlan,
    fastest,
)

ENV = {"gpu": "Fake GPU", "cc": "9.0", "driver": 13000, "cufft": 12000, "nvdispatch": "0.1.0"}
KEY = ("timed-choice", "fft_convolve", "a test key")


@pytest.fixture(autouse=True)
def _no_tunings_left():
    plan_cache.clear_tunings()
    yield
    plan_cache.clear_tunings()


class Problem:
    def describe(self) -> str:
        return "convolve(the test's problem)"


class FakePlan:
    def __init__(self, label: str, log: list):
        self.label, self.log, self.released = label, log, False
        self.steps = (f"{label}: its own step", "convolve(the test's problem)")

    def execute(self, operands, stream=None):
        if self.released:
            raise PlanStateError("plan", "a live plan", "a released one")
        self.log.append(self.label)
        return f"result of {self.label}"

    def release(self):
        self.released = True


class FakeClock:
    """Device seconds per call of each label; ``sample`` adds up the calls ``run`` made."""

    def __init__(self, seconds: dict, log: list, fail: dict | None = None):
        self.seconds, self.log, self.fail, self.samples = seconds, log, fail or {}, 0

    def sample(self, run, calls):
        self.samples += 1
        start = len(self.log)
        for _ in range(calls):
            run()
        made = self.log[start:]
        for label in made:
            if label in self.fail:
                raise self.fail[label]
        return sum(self.seconds[label] for label in made)


def _setup(seconds: dict, *, fail_make=(), fail_time=None, clock=True, **kwargs):
    log: list = []
    made: dict = {}

    def maker(label):
        def make():
            if label in fail_make:
                raise RuntimeError(f"{label} cannot plan here")
            made[label] = FakePlan(label, log)
            return made[label]

        return make

    cands = [Candidate(label, maker(label), float(i + 1), f"detail of {label}") for i, label in enumerate(seconds)]
    fake = FakeClock(seconds, log, fail_time)
    plan = TimedChoicePlan(
        Problem(),
        "timed",
        cands,
        environment=ENV,
        clock_for=lambda operands, stream: fake if clock else None,
        tuning_key=KEY,
        **kwargs,
    )
    return plan, made, log, fake


def test_the_first_call_times_every_candidate_and_keeps_the_fastest():
    plan, made, log, clock = _setup({"device-fused": 3e-4, "four-step": 1e-4, "unfused": 2e-4})
    assert set(made) == {"device-fused", "four-step", "unfused"} and plan.chosen is None
    assert "timed choice among device-fused, four-step, unfused" in plan.steps[0]
    assert plan.execute({"x": 1}) == "result of four-step"
    assert plan.chosen == "four-step" and plan.how == "timed"
    assert made["device-fused"].released and made["unfused"].released and not made["four-step"].released
    assert plan.medians == pytest.approx({"device-fused": 3e-4, "four-step": 1e-4, "unfused": 2e-4})
    assert clock.samples == 3 * (2 + ROUNDS)  # a warm-up and a calibrating call each, then the rounds
    calls = len(log)
    assert plan.execute({"x": 1}) == "result of four-step" and len(log) == calls + 1  # no more timing
    assert plan.steps[0].startswith("chose four-step: the fastest when timed here (median us per call: ")
    assert "device-fused 300.0" in plan.steps[0] and "four-step: its own step" in plan.steps


def test_rounds_rotate_the_order():
    once = SAMPLE_SECONDS  # a call as long as a burst: bursts of one call
    plan, _, log, _ = _setup({"a": once, "b": once, "c": once})
    plan.execute({})
    rounds = [label for label in log[6:-1]]  # after the warm-ups, before the call itself
    firsts = [rounds[i] for i in range(0, len(rounds), 3)]
    assert firsts[:3] == ["a", "b", "c"]


def test_ties_go_to_the_models_order():
    plan, _, _, _ = _setup({"device-fused": 2e-4, "unfused": 2e-4})
    plan.execute({})
    assert plan.chosen == "device-fused"
    assert fastest({"a": 2.0, "b": 1.0, "c": 1.0}, ["a", "b", "c"]) == "b"


def test_the_choice_is_recorded_and_saved(tmp_path):
    plan, _, _, _ = _setup({"four-step": 1e-4, "unfused": 2e-4})
    assert plan.tuning() is None
    plan.execute({})
    record = plan.tuning()
    assert record == {"choice": "four-step", "us": {"four-step": 100.0, "unfused": 200.0}, "env": ENV}
    assert plan_cache.tuning_for(KEY) == record
    path = tmp_path / "tunings.json"
    assert plan_cache.save(path) >= 1
    rows = json.loads(path.read_text())["tunings"]
    assert any(r["kind"] == TUNING_KIND and r["tuning"] == record for r in rows)
    plan_cache.clear_tunings()
    assert plan_cache.load(path) >= 1 and plan_cache.tuning_for(KEY) == record


def test_a_recorded_choice_plans_only_that_candidate():
    record = {"choice": "unfused", "us": {"four-step": 300.0, "unfused": 200.0}, "env": ENV}
    plan, made, _, clock = _setup({"four-step": 1e-4, "unfused": 2e-4}, tuning=record)
    assert list(made) == ["unfused"] and plan.chosen == "unfused" and plan.how == "recorded"
    assert plan.execute({}) == "result of unfused" and clock.samples == 0
    assert plan.steps[0].startswith("chose unfused by a timing recorded on this machine")
    plan_cache.record_tuning(KEY, record, TUNING_KIND)  # the executor's own key serves as well
    plan, made, _, _ = _setup({"four-step": 1e-4, "unfused": 2e-4})
    assert list(made) == ["unfused"] and plan.how == "recorded"


@pytest.mark.parametrize(
    "record",
    [
        {"choice": "unfused", "env": {**ENV, "gpu": "Another GPU"}},  # another machine
        {"choice": "cufft-lto", "env": ENV},  # not a candidate here
    ],
)
def test_a_choice_recorded_elsewhere_is_timed_again(record):
    plan, made, _, _ = _setup({"four-step": 1e-4, "unfused": 2e-4}, tuning=record)
    assert set(made) == {"four-step", "unfused"} and plan.chosen is None
    plan.execute({})
    assert plan.chosen == "four-step"


@pytest.mark.parametrize(
    "bad,why",
    [
        ({"env": ENV}, "'choice' is missing"),
        ({"choice": 3, "env": ENV}, "'choice'"),
        ({"choice": "a", "env": ENV, "us": {"a": -1}}, "microseconds"),
        ({"choice": "a", "env": ENV, "us": {"a": True}}, "microseconds"),
        ({"choice": "a", "env": [1]}, "'env'"),
        ({"choice": "a", "env": ENV, "extra": 1}, "unknown field 'extra'"),
    ],
)
def test_malformed_tunings_are_refused(bad, why):
    assert why in TimedChoicePlan.validate_tuning(bad)
    with pytest.raises(InvalidArgumentError, match="tuning"):
        _setup({"a": 1e-4, "b": 2e-4}, tuning=bad)


def test_small_problems_take_the_models_first_untimed():
    plan, made, _, clock = _setup({"device-fused": 3e-4, "unfused": 1e-4}, time_it=False, why_not_timed="tiny")
    assert list(made) == ["device-fused"] and plan.how == "model"
    assert plan.execute({}) == "result of device-fused" and clock.samples == 0 and plan.tuning() is None
    assert plan.steps[0] == "chose device-fused, the model's first (tiny)"
    assert plan.steps[1].startswith("model (time / HBM floor): device-fused 1.0 [detail of device-fused], unfused 2.0")


def test_a_stream_being_captured_runs_the_models_first_and_times_later():
    plan, _, _, _ = _setup({"device-fused": 3e-4, "unfused": 1e-4}, clock=False)
    assert plan.execute({}) == "result of device-fused" and plan.chosen is None and plan.tuning() is None
    plan._clock_for = lambda operands, stream: FakeClock({"device-fused": 3e-4, "unfused": 1e-4}, _log_of(plan))
    assert plan.execute({}) == "result of unfused" and plan.chosen == "unfused"


def _log_of(plan):
    return next(iter(plan._plans.values())).log


def test_candidates_that_cannot_plan_or_run_are_left_out():
    plan, made, _, _ = _setup({"four-step": 1e-4, "cufft-lto": 5e-5, "unfused": 2e-4}, fail_make=("four-step",))
    assert set(made) == {"cufft-lto", "unfused"}
    assert any(s.startswith("left out four-step: RuntimeError: four-step cannot plan here") for s in plan.steps)
    plan, _, _, _ = _setup({"cufft-lto": 5e-5, "unfused": 2e-4}, fail_time={"cufft-lto": RuntimeError("launch failed")})
    plan.execute({})
    assert plan.chosen == "unfused"
    assert any("left out cufft-lto: failed when timed: RuntimeError: launch failed" in s for s in plan.steps)


def test_when_nothing_can_plan_the_first_error_is_raised():
    with pytest.raises(RuntimeError, match="a cannot plan here"):
        _setup({"a": 1e-4, "b": 1e-4}, fail_make=("a", "b"))
    plan, _, _, _ = _setup({"a": 1e-4}, fail_time={"a": RuntimeError("boom")})
    with pytest.raises(RuntimeError, match="boom"):
        plan.execute({})


def test_an_interrupt_while_timing_leaves_the_plan_untimed():
    plan, _, _, clock = _setup({"a": 1e-4, "b": 2e-4}, fail_time={"b": KeyboardInterrupt()})
    with pytest.raises(KeyboardInterrupt):
        plan.execute({})
    assert plan.chosen is None and plan.tuning() is None and plan_cache.tuning_for(KEY) is None
    clock.fail.clear()
    plan.execute({})
    assert plan.chosen == "a"


def test_release_releases_every_plan():
    plan, made, _, _ = _setup({"a": 1e-4, "b": 2e-4})
    plan.release()
    assert all(p.released for p in made.values())
    with pytest.raises(PlanStateError):
        plan.execute({})


def test_a_released_plan_still_says_what_it_chose():
    plan, _, _, _ = _setup({"four-step": 3e-4, "unfused": 1e-4})
    plan.execute({})
    plan.release()
    assert plan.steps[0].startswith("chose unfused: the fastest when timed here")
    assert "unfused: its own step" in plan.steps and plan.steps[-1] == "convolve(the test's problem)"
    plan_cache.clear_tunings()
    untimed, _, _, _ = _setup({"four-step": 3e-4, "unfused": 1e-4})
    untimed.release()
    assert untimed.steps[0] == "timed choice among four-step, unfused: released before a call chose one"


# -- the model ------------------------------------------------------------------------------------------------
def _problem(rows, n, dtype="complex64", filter_rows=1):
    real = dtype.startswith("float")
    x = OperandInfo(None, "numpy", CPU, dtype, (rows, n), None)
    m = n // 2 + 1 if real else n
    hshape = (m,) if filter_rows == 1 else (rows, m)
    h = OperandInfo(
        None, "numpy", CPU, "complex64" if dtype in ("complex64", "float32") else "complex128", hshape, None
    )
    return build_convolve_problem(x, h, "numpy", CPU, None, -1)


def test_cufft_passes_by_length_and_precision():
    assert model.cufft_passes(1024, 8) == 1 and model.cufft_passes(16384, 8) == 1
    assert model.cufft_passes(65536, 8) == 2 and model.cufft_passes(1 << 20, 8) == 2
    assert model.cufft_passes(16384, 16) == 2 and model.cufft_passes(1 << 30, 8) == 3


def test_sizes_of_a_problem():
    s = model.sizes_of(_problem(256, 65536))
    assert (s.rows, s.n, s.real, s.complex_bytes) == (256, 65536, False, 8)
    assert s.floor_bytes == 2 * 256 * 65536 * 8 and s.filter_bytes == 0
    r = model.sizes_of(_problem(3, 64, "float64", filter_rows=3))
    assert r.real and r.x_bytes == 3 * 64 * 8 and r.spectrum_bytes == 3 * 33 * 16 and r.filter_bytes == 3 * 33 * 16
    assert r.complex_batch_bytes == 2 * 64 * 16


def _order(problem, names):
    return sorted(names, key=lambda name: model.estimate(problem, name).floors)


def test_the_model_orders_the_strategies_by_traffic():
    names = ["device-fused", "unfused", "cufft-lto"]
    assert _order(_problem(65536, 1024), names)[0] == "device-fused"
    long = _order(_problem(256, 65536), ["four-step", "unfused", "cufft-lto"])
    assert long == ["four-step", "unfused", "cufft-lto"]
    assert _order(_problem(64, 1 << 20), ["four-step", "unfused"]) == ["four-step", "unfused"]
    # a small problem: launches decide (one kernel, then two, three, four)
    assert _order(_problem(4, 8192), ["four-step", "unfused", "cufft-lto"]) == ["cufft-lto", "unfused", "four-step"]
    e = model.estimate(_problem(65536, 1024), "device-fused")
    assert e.floors > 1.0 and "2 traversals" in e.detail and str(e).startswith("device-fused ")
    with pytest.raises(ValueError, match="no model"):
        model.estimate(_problem(4, 64), "magic")


def test_candidates_keep_unfused_and_prune_the_rest(monkeypatch):
    def long_only(p):
        return None if p.forward.lengths[0] > 1024 else "one kernel"

    reasons = {"four-step": long_only}
    monkeypatch.setattr(op, "_REASONS", tuple((name, reasons.get(name, lambda p: None)) for name, _ in op._REASONS))
    monkeypatch.setattr(op, "_fused_alternative", lambda p: 8)
    labels = [c.label for c in op.candidates(_problem(65536, 1024))]
    assert labels[0] == "device-fused" and "device-fused ept=8" in labels and "unfused" in labels
    assert len(labels) <= op.MOST_CANDIDATES and "four-step" not in labels  # n <= 1024: one kernel
    long = op.candidates(_problem(256, 65536))
    assert [c.label for c in long][0].startswith("four-step") and "unfused" in [c.label for c in long]
    assert all(c.model >= long[0].model for c in long)
    assert op.strategies(_problem(256, 65536))[0] == "timed"


def test_the_tuning_key_of_a_problem_has_a_json_form():
    key = ("timed-choice", "fft_convolve", tuple(sorted(ENV.items())), _problem(8, 4096))
    assert key_text(key) is not None


# -- a plan over the plan cache's byte bound (64 x 2**20 complex128 on an H200) ---------------------------------
class SizedPlan(FakePlan):
    """A candidate reporting the workspace cuFFT would: its forward and inverse plans' bytes."""

    workspace_bytes = 2 * plan_cache.max_bytes


def test_explain_after_a_call_whose_timed_plan_outgrew_the_cache(monkeypatch):
    """The first call times the candidates and runs the winner; its plan is over the cache's byte bound, so
    it is retired at once and released when the call lets go. ``explain()`` then plans again (the recorded
    choice, over the bound too) and must read the steps of a plan it holds, not of one released meanwhile."""
    from nvdispatch import _route
    from nvdispatch._cuda import runtime
    from nvdispatch._fft_convolve import OP
    from nvdispatch.executors.cuda import CudaExecutor

    seconds = {"four-step": 3e-3, "unfused": 2e-3, "cufft-lto": 4e-3, "cufft-lto-load": 4e-3}
    log: list = []
    applies = {"four-step", "unfused", "cufft-lto", "cufft-lto-load"}
    monkeypatch.setattr(
        op, "_REASONS", tuple((name, lambda p, name=name: None if name in applies else "no") for name, _ in op._REASONS)
    )
    monkeypatch.setattr(op, "_make", lambda problem, name: SizedPlan(name, log))
    monkeypatch.setattr(op, "environment", lambda device_index: ENV)
    monkeypatch.setattr(op, "_clock_for", lambda problem, dev: lambda operands, stream: FakeClock(seconds, log))
    monkeypatch.setattr(op, "_result_check", lambda problem, dev: None)  # (the results are strings here)
    monkeypatch.setattr(runtime, "current_device", lambda: 0)
    sel = _route.Selection(CudaExecutor(), False)
    monkeypatch.setattr(_route, "select", lambda o, problem: sel)
    monkeypatch.setattr(_route, "_SELECTED", {})
    problem = _problem(64, 1 << 20, "complex128")
    try:
        first = _route.run_uncached(OP, problem, {"x": 1, "h": 2}, None, lambda s, operands: operands, None)
        assert first == "result of unfused"
        explanation = _route.explain_selected("convolve", OP, problem, sel)
        assert explanation.strategy == "timed"
        assert explanation.steps[0].startswith("chose unfused by a timing recorded on this machine")
        assert "unfused: its own step" in explanation.steps
    finally:
        plan_cache.clear()


def test_the_four_step_offers_its_configurations_and_the_model_prefers_long_tile_rows(monkeypatch):
    monkeypatch.setattr(op, "_REASONS", tuple((name, lambda p: None) for name, _ in op._REASONS))
    labels = [c.label for c in op.candidates(_problem(64, 1 << 20))]
    assert "four-step" in labels and "unfused" in labels and len(labels) <= op.MOST_CANDIDATES
    assert any(label.startswith("four-step 1024x1024 cols ") for label in labels)
    by_run = [model.column_efficiency(b) for b in (32, 64, 128, 256)]
    assert by_run == sorted(by_run) and model.column_efficiency(0) >= by_run[-1]  # a thread per column
    narrow = model.estimate(_problem(64, 1 << 20), "four-step", tile_run_bytes=32, middle_length=1024)
    wide = model.estimate(_problem(64, 1 << 20), "four-step", tile_run_bytes=128, middle_length=1024)
    assert wide.floors < narrow.floors
