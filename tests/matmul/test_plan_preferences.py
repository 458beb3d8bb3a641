"""MatmulPlanPreferences.limit and max_workspace_bytes are honoured: validated, part of the plan key, and read by
the executors that have the knob (cuBLASLt's heuristic request count and workspace cap; the NumPy executor's
autotune configurations). GPU-marked tests check the cuBLASLt side on a GPU machine."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
from nvdispatch import errors

A, B, BIAS = np.ones((64, 32), np.float32), np.ones((32, 48), np.float32), np.ones(48, np.float32)
RELU_BIAS = {"epilog": "RELU_BIAS", "epilog_inputs": {"bias": BIAS}}


@pytest.mark.parametrize(
    "prefs, argument",
    [
        ({"limit": 0}, "preferences.limit"),
        ({"limit": True}, "preferences.limit"),
        ({"max_workspace_bytes": -1}, "preferences.max_workspace_bytes"),
        ({"max_workspace_bytes": 1.5}, "preferences.max_workspace_bytes"),
        ({"max_workspace_bytes": "32MiB"}, "preferences.max_workspace_bytes"),
    ],
)
def test_bad_preferences_are_refused_naming_them(prefs, argument):
    with pytest.raises(errors.InvalidArgumentError, match=argument):
        nvdispatch.matmul(A, B, preferences=prefs)


def test_plan_shaping_preferences_are_part_of_the_problem_and_the_strategy_is_not():
    plain = nvdispatch.explain(A, B, **RELU_BIAS)
    assert plain.problem.preferences is None  # defaults: the same plan as a call without preferences
    same = nvdispatch.explain(A, B, **RELU_BIAS, preferences={"strategy": "inplace", "limit": 8})
    assert same.problem == plain.problem
    capped = nvdispatch.explain(A, B, **RELU_BIAS, preferences={"max_workspace_bytes": 1 << 20, "limit": 3})
    assert capped.problem != plain.problem
    assert capped.problem.plan_preferences.max_workspace_bytes == 1 << 20
    assert capped.problem.plan_preferences.limit == 3 and capped.problem.preferences.strategy is None


@pytest.mark.parametrize("limit", [1, 3, 100])
def test_numpy_autotune_times_at_most_limit_configurations(limit, monkeypatch):
    from nvdispatch.executors import numpy_matmul, numpy_matmul_panels

    # strategy "inplace" is served by the engine the calibration ranked first, the row panels or the blocked
    # pass (each with its own knobs): whichever it is must time the first `limit` configurations
    timed = []
    knobs = {
        numpy_matmul.NumpyMatmulPlan: len(numpy_matmul._BLOCK_CHOICES) * len({1, numpy_matmul._CPUS}),
        numpy_matmul_panels.PanelPlan: len(numpy_matmul_panels.panel_byte_choices())
        * len({1, numpy_matmul_panels.default_threads()}),
    }

    def spying(original, every):
        def spy(self, operands, iterations=3):  # (the signature of the CPU plans' propose_tuning)
            got = original(self, operands, iterations)
            if got is not None:  # (the plans of other strategies have no knobs)
                timed.append((len(got.timings), every))
            return got

        return spy

    for cls, every in knobs.items():
        monkeypatch.setattr(cls, "propose_tuning", spying(cls.propose_tuning, every))
    a = np.ones((2048, 32), np.float32)  # a result of several blocks: one block has no block knobs to tune
    mm = nvdispatch.Matmul(a, B)
    mm.plan(**RELU_BIAS, preferences={"strategy": "inplace", "limit": limit})
    mm.autotune(iterations=1)
    assert timed and all(n == min(limit, every) for n, every in timed), timed
    np.testing.assert_allclose(mm.execute(), np.maximum(a @ B + BIAS, 0))


# -- cuBLASLt (GPU machine) ------------------------------------------------------------------------------------
def _cuda_operands():
    torch = pytest.importorskip("torch")
    a = torch.randn(512, 256, device="cuda")
    b = torch.randn(256, 384, device="cuda")
    return a, b, torch.randn(384, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("cap", [0, 1 << 16, 1 << 20])
def test_cublaslt_plans_stay_within_max_workspace_bytes(cap):
    a, b, bias = _cuda_operands()
    prefs = {"strategy": "native", "max_workspace_bytes": cap}
    with nvdispatch.set_backend("cuda", only=True):
        mm = nvdispatch.Matmul(a, b)
        mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias}, preferences=prefs)
        out = mm.execute()
        plan = mm._plan
        assert plan.core.max_workspace == cap and plan.algorithm.workspaceSize <= cap
        mm.autotune(iterations=1)  # every candidate timed stays within the cap too
        assert mm._plan.algorithm.workspaceSize <= cap
    want = (a @ b + bias).clamp_min(0)
    assert (out - want).abs().max().item() < 1e-2 * want.abs().max().item()


@pytest.mark.gpu
@pytest.mark.parametrize("limit", [1, 4])
def test_cublaslt_autotune_asks_the_heuristic_for_limit_candidates(limit, monkeypatch):
    from nvdispatch._cuda import lt_autotune

    asked = []
    original = lt_autotune.candidates

    def spy(core, handle, count=lt_autotune.CANDIDATES):
        asked.append(count)
        return original(core, handle, count)

    monkeypatch.setattr(lt_autotune, "candidates", spy)
    a, b, bias = _cuda_operands()
    with nvdispatch.set_backend("cuda", only=True):
        mm = nvdispatch.Matmul(a, b)
        mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias}, preferences={"strategy": "native", "limit": limit})
        mm.autotune(iterations=1)
    assert asked and set(asked) == {limit}
