"""The stateful Matmul: plan, autotune, execute, reset_operands, free, context manager."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
from nvdispatch import ComputeType, Epilog, MatmulOptions, errors
from tests.matmul.matmul_reference import gelu

torch = pytest.importorskip("torch")


def test_seed_pattern_with_row_bias():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 32)).astype(np.float32)
    b = rng.standard_normal((32, 16)).astype(np.float32)
    bias = rng.standard_normal((1, 16)).astype(np.float32)
    mm = nvdispatch.Matmul(a, b, options={"compute_type": ComputeType.COMPUTE_32F_FAST_16F})
    mm.plan(epilog=Epilog.RELU_BIAS, epilog_inputs={"bias": bias})
    r = mm.execute()
    mm.free()
    np.testing.assert_allclose(r, np.maximum(a @ b + bias, 0), rtol=1e-5, atol=1e-5)


def test_options_as_dataclass_or_dict_are_equivalent():
    a, b = np.ones((3, 2)), np.ones((2, 4))
    x = nvdispatch.Matmul(a, b, options=MatmulOptions(bgrad_axis="m")).plan(
        epilog="DRELU_BGRAD", epilog_inputs={"relu_aux": np.ones((3, 4), bool)}
    )
    y = nvdispatch.Matmul(a, b, options={"bgrad_axis": "m"}).plan(
        epilog="DRELU_BGRAD", epilog_inputs={"relu_aux": np.ones((3, 4), bool)}
    )
    rx, ry = x.execute(), y.execute()
    np.testing.assert_array_equal(rx[0], ry[0])
    assert rx[1]["drelu_bgrad"].shape == (3, 1)


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_reset_operands_and_reexecute(framework):
    conv = (lambda x: x) if framework == "numpy" else torch.from_numpy
    rng = np.random.default_rng(1)
    a, b, bias = rng.standard_normal((5, 4)), rng.standard_normal((4, 3)), rng.standard_normal(3)
    with nvdispatch.Matmul(conv(a), conv(b), alpha=2.0) as mm:
        mm.plan(epilog="GELU_BIAS", epilog_inputs={"bias": conv(bias)})
        first = mm.execute()
        a2, bias2 = rng.standard_normal((5, 4)), rng.standard_normal(3)
        mm.reset_operands(a=conv(a2), epilog_inputs={"bias": conv(bias2)})
        second = mm.execute()
        # non-contiguous replacement with the same shape: re-planned transparently
        a3 = np.asfortranarray(rng.standard_normal((5, 4)))
        mm.reset_operands(a=conv(a3) if framework == "numpy" else conv(a3.T.copy()).T)
        third = mm.execute()
    np.testing.assert_allclose(np.asarray(first), gelu(2 * a @ b + bias), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(second), gelu(2 * a2 @ b + bias2), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(third), gelu(2 * a3 @ b + bias2), rtol=1e-12)
    with pytest.raises(errors.PlanStateError):
        mm.execute()


def test_autotune_keeps_the_fastest_and_results_stay_right():
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((300, 50)), rng.standard_normal((50, 70))
    bias = rng.standard_normal((300, 1))
    mm = nvdispatch.Matmul(a, b)
    mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    timings = mm.autotune(iterations=2)
    assert mm.strategy == min(timings, key=timings.get)
    np.testing.assert_allclose(mm.execute(), np.maximum(a @ b + bias, 0), rtol=1e-12)
    with pytest.raises(errors.InvalidArgumentError, match="iterations"):
        mm.autotune(iterations=0)


@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_stateless_calls_take_the_strategy_autotune_chose_from_their_next_call(library, monkeypatch):
    from nvdispatch import linalg

    rng = np.random.default_rng(4)
    a, b, bias = (rng.standard_normal(s).astype(np.float32) for s in ((64, 32), (32, 16), (16,)))
    if library == "torch":
        a, b, bias = (torch.from_numpy(x) for x in (a, b, bias))
    kw = {"epilog": "RELU_BIAS", "epilog_inputs": {"bias": bias}}
    ran = []
    for _ in range(3):  # the call key is stored, then found (and, for Torch, remembered behind its guard)
        nvdispatch.matmul(a, b, **kw)
    mm = nvdispatch.Matmul(a, b).plan(**kw)
    first = mm.strategy
    others = [s for s in linalg.strategies_of(mm._selection.executor, "matmul", mm._problem) if s != first]
    assert others, "the executor offers one strategy here: nothing to choose"
    chosen = others[-1]
    monkeypatch.setattr(linalg, "_time_in_turns", lambda plans, *args: {s: float(s != chosen) for s in plans})
    mm.autotune()
    assert mm.strategy == chosen

    def spy(executor, op, problem, strategy, *args, **kwargs):
        ran.append(strategy)
        return original(executor, op, problem, strategy, *args, **kwargs)

    original = linalg.acquire_plan
    monkeypatch.setattr(linalg, "acquire_plan", spy)  # the full path plans through it; the call key finds the plan
    for _ in range(3):
        got = nvdispatch.matmul(a, b, **kw)
        np.testing.assert_allclose(
            np.asarray(got), np.maximum(np.asarray(a) @ np.asarray(b) + np.asarray(bias), 0), rtol=1e-5, atol=1e-5
        )
    assert ran == [chosen]  # chosen again once, then found by the call key
    assert nvdispatch.plan_cache.get(linalg.plan_key(mm._selection.executor, "matmul", mm._problem, first)) is not None
    mm.free()


def test_plan_can_change_epilog_and_preferences():
    a, b = np.ones((2, 3)), -np.ones((3, 2))
    mm = nvdispatch.Matmul(a, b)
    np.testing.assert_array_equal(mm.plan().execute(), a @ b)
    np.testing.assert_array_equal(mm.plan(epilog=Epilog.RELU, preferences={"strategy": "plain"}).execute(), 0 * (a @ b))
    assert mm.strategy == "plain" and mm.executor == "numpy"
    assert "planned" in repr(mm)


def test_matmul_with_c_alpha_beta():
    rng = np.random.default_rng(3)
    a, b, c = rng.standard_normal((4, 3)), rng.standard_normal((3, 5)), rng.standard_normal((4, 5))
    mm = nvdispatch.Matmul(a, b, c, alpha=0.5, beta=-2.0).plan()
    np.testing.assert_allclose(mm.execute(), 0.5 * a @ b - 2 * c, rtol=1e-12)
    # beta defaults to 1 when c is given
    np.testing.assert_allclose(nvdispatch.matmul(a, b, c), a @ b + c, rtol=1e-12)


def test_reset_operands_checks_like_construction_and_replans_only_for_new_strides():
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((6, 4)), rng.standard_normal((4, 5))
    mm = nvdispatch.Matmul(a, b).plan(epilog="RELU")
    plan = mm._plan
    a2 = rng.standard_normal((6, 4))
    mm.reset_operands(a=a2, alpha=2.0)
    assert mm._plan is plan  # same layout: no re-planning
    np.testing.assert_allclose(mm.execute(), np.maximum(2.0 * a2 @ b, 0), rtol=1e-12)
    mm.reset_operands(a=np.asfortranarray(a2))
    assert mm._plan is not plan
    np.testing.assert_allclose(mm.execute(), np.maximum(2.0 * a2 @ b, 0), rtol=1e-12)
    with pytest.raises(errors.MixedOperandsError, match="a"):
        mm.reset_operands(a=torch.from_numpy(a2))
    with pytest.raises(errors.InvalidArgumentError, match="alpha"):
        mm.reset_operands(alpha=1j)
    with pytest.raises(errors.InvalidArgumentError, match="beta"):
        mm.reset_operands(beta=2.0)
    with pytest.raises(errors.EpilogInputError, match="bias"):
        mm.reset_operands(epilog_inputs={"bias": np.ones(5)})
    # a failed reset changed nothing
    np.testing.assert_allclose(mm.execute(), np.maximum(2.0 * a2 @ b, 0), rtol=1e-12)


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_execute_binds_operands_once_and_rebinds_after_reset(framework):
    # execute() binds its operands (and the plan's direct call) once; every reset must be seen by the next one
    conv = (lambda x: x) if framework == "numpy" else torch.from_numpy
    rng = np.random.default_rng(7)
    a, b, bias = rng.standard_normal((6, 4)), rng.standard_normal((4, 5)), rng.standard_normal(5)
    with nvdispatch.Matmul(conv(a), conv(b)) as mm:
        mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": conv(bias)})
        runs = [mm.execute(), mm.execute()]
        bias2 = rng.standard_normal(5)
        mm.reset_operands(epilog_inputs={"bias": conv(bias2)})
        runs.append(mm.execute())
        mm.reset_operands(alpha=3.0)  # off the direct call
        runs.append(mm.execute())
        mm.reset_operands(alpha=1)  # and back on it
        runs.append(mm.execute())
    relu = lambda x: np.maximum(x, 0)  # noqa: E731
    want = [relu(a @ b + bias)] * 2 + [relu(a @ b + bias2), relu(3 * a @ b + bias2), relu(a @ b + bias2)]
    for got, expect in zip(runs, want):
        np.testing.assert_allclose(np.asarray(got), expect, rtol=1e-12)
