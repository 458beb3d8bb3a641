"""Autotuning the CPU plans' knobs (nvdispatch.executors.cpu_autotune): a plan proposes, ``Matmul.autotune``
commits every proposal once, at the end (issue #27 item 2): interrupted anywhere before, every shared plan and
``explain()`` stay as they were."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
from nvdispatch import linalg, plan_cache
from nvdispatch.executors import numpy_matmul, numpy_matmul_engines, numpy_matmul_panels
from nvdispatch.executors.numpy_matmul_panels import PanelPlan

_KNOBS = {"ufunc": ("block_rows", "threads", "steps"), "panels": ("panel_rows", "threads", "steps")}


@pytest.fixture
def operands():
    rng = np.random.default_rng(7)
    # a result over one block (256 KiB): strategy inplace runs the blocked pass or the row panels, each with
    # knobs to tune
    a, b, bias = rng.standard_normal((700, 40)), rng.standard_normal((40, 50)), rng.standard_normal(50)
    return a, b, bias


def _planned(monkeypatch, engine, a, b, bias):
    kw = {"epilog": "RELU_BIAS", "epilog_inputs": {"bias": bias}, "preferences": {"strategy": "inplace"}}
    plan_cache.clear()
    monkeypatch.setattr(numpy_matmul, "_inplace_engine", lambda problem, tuning: engine)
    mm = nvdispatch.Matmul(a, b).plan(**kw)
    return mm, kw


@pytest.mark.parametrize("engine", ["ufunc", "panels"])
def test_an_autotune_interrupted_after_every_plan_proposed_commits_nothing(monkeypatch, operands, engine):
    """Today's plans tuned themselves (committed) inside the loop over strategies: an interrupt in the timing
    that follows the loop left the shared plan on the new setting."""
    a, b, bias = operands
    mm, kw = _planned(monkeypatch, engine, a, b, bias)
    shared = mm._plan
    want_cls = numpy_matmul.NumpyMatmulPlan if engine == "ufunc" else PanelPlan
    assert type(shared) is want_cls
    before = tuple(getattr(shared, k) for k in _KNOBS[engine])
    explained = nvdispatch.explain(a, b, **kw).steps
    # the only settings to try differ from the plan's: a committed proposal would show
    monkeypatch.setattr(numpy_matmul, "_BLOCK_CHOICES", (1 << 12,))
    monkeypatch.setattr(numpy_matmul_panels, "panel_byte_choices", lambda: (1 << 12,))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(linalg, "_time_in_turns", interrupted)
    with pytest.raises(KeyboardInterrupt):
        mm.autotune(iterations=1)
    assert tuple(getattr(shared, k) for k in _KNOBS[engine]) == before
    assert mm._plan is shared and mm.strategy == "inplace"
    assert nvdispatch.explain(a, b, **kw).steps == explained == shared.steps
    np.testing.assert_allclose(mm.execute(), np.maximum(a @ b + bias, 0), rtol=1e-12)
    assert plan_cache.users(shared) == 1  # only mm's hold: the autotune let go of everything it pinned


@pytest.mark.parametrize("engine", ["ufunc", "panels"])
def test_a_finished_autotune_commits_the_proposal_and_explain_describes_it(monkeypatch, operands, engine):
    a, b, bias = operands
    mm, kw = _planned(monkeypatch, engine, a, b, bias)
    shared = mm._plan
    monkeypatch.setattr(numpy_matmul, "_BLOCK_CHOICES", (1 << 12,))
    monkeypatch.setattr(numpy_matmul_panels, "panel_byte_choices", lambda: (1 << 12,))
    before = shared.steps
    timings = mm.autotune(iterations=1)
    assert set(timings) >= {"inplace"} and shared.steps != before
    assert shared.steps == nvdispatch.explain(a, b, **kw).steps
    knob = _KNOBS[engine][0]
    assert f"{getattr(shared, knob)} rows" in " ".join(shared.steps)
    np.testing.assert_allclose(mm.execute(), np.maximum(a @ b + bias, 0), rtol=1e-12)


def test_a_commit_interrupted_part_way_undoes_what_it_committed(operands):
    a, b, bias = operands
    problem = nvdispatch.explain(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}).problem
    ops = {"a": a, "b": b, "bias": bias, "alpha": 1, "beta": None}
    plans = [numpy_matmul.NumpyMatmulPlan(problem, "inplace"), PanelPlan(problem)]
    before = [p._setting for p in plans]
    proposals = [p.propose_tuning(ops, 1) for p in plans]
    proposals = [type(q)(q.target, q.target.with_setting((q.before[0] + 1, 1)), q.timings, q.before) for q in proposals]

    class Failing:
        target = plan = None

        def commit(self):
            raise KeyboardInterrupt

        def undo(self):
            pass

    with pytest.raises(KeyboardInterrupt):
        linalg._commit([*proposals, Failing()])
    assert [p._setting for p in plans] == before
    linalg._commit(proposals)
    assert [p._setting for p in plans] == [q.plan._setting for q in proposals] != before


def test_a_proposal_is_timed_on_a_private_copy(operands):
    a, b, bias = operands
    problem = nvdispatch.explain(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}).problem
    ops = {"a": a, "b": b, "bias": bias, "alpha": 1, "beta": None}
    for plan in (numpy_matmul.NumpyMatmulPlan(problem, "inplace"), PanelPlan(problem)):
        setting, steps = plan._setting, plan.steps
        proposal = plan.propose_tuning(ops, 1)
        assert plan._setting == setting and plan.steps == steps  # nothing changed until commit
        assert proposal.plan is not plan and proposal.timings
        np.testing.assert_allclose(proposal.plan.execute(ops), np.maximum(a @ b + bias, 0), rtol=1e-12)
    assert numpy_matmul_engines.EnginePlan(problem, "blas").tuning() is None  # (no knobs: nothing to propose)
