"""``Matmul.autotune``'s result-agreement check on the CPU, for real: each strategy's result is compared with
``plain``'s before timing; one made wrong in a single element of the last row is never chosen (a WARNING,
``explain_matmul`` names it, the record keeps why), those within rounding are all timed. Results are checked
against a float64 NumPy oracle; no timing decides anything."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import nvdispatch
from nvdispatch import _agreement, _matmul_agreement, linalg, plan_cache
from nvdispatch.executors import numpy_matmul

RNG = np.random.default_rng(3)


@pytest.fixture(autouse=True)
def _fresh_cache():
    plan_cache.clear()
    plan_cache.clear_tunings()
    yield
    plan_cache.clear()
    plan_cache.clear_tunings()


class Wrong:
    """A plan of strategy ``strategy`` whose result is off in one element of the last row."""

    def __init__(self, plan):
        self._plan = plan

    def __getattr__(self, name):
        if name in ("propose_tuning", "autotune"):  # (no private tuned copy: the check must see this plan)
            raise AttributeError(name)
        return getattr(self._plan, name)

    def execute(self, operands, stream=None):
        got = self._plan.execute(operands, stream)
        result = got[0] if isinstance(got, tuple) else got
        result[-1, result.shape[-1] // 2] += 1.0 + abs(result).max()
        return got


def _operands(dtype=np.float32, m=300, k=200, n=90):
    a = RNG.standard_normal((m, k)).astype(dtype)
    b = RNG.standard_normal((k, n)).astype(dtype)
    bias = RNG.standard_normal(n).astype(dtype)
    return a, b, bias


def _oracle(a, b, bias):
    return np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias, 0)


def _break(monkeypatch, strategy):
    make = numpy_matmul.plan

    def plan(problem, name, tuning=None):
        got = make(problem, name, tuning)
        return Wrong(got) if name == strategy else got

    monkeypatch.setattr(numpy_matmul, "plan", plan)


def test_a_strategy_wrong_in_one_element_of_the_last_row_is_never_chosen(monkeypatch, caplog):
    a, b, bias = _operands()
    kw = {"epilog": "RELU_BIAS", "epilog_inputs": {"bias": bias}}
    strategies = numpy_matmul.strategies(nvdispatch.Matmul(a, b).plan(**kw)._problem)
    assert "plain" in strategies and len(strategies) > 1
    broken = strategies[0]
    plan_cache.clear()
    _break(monkeypatch, broken)
    mm = nvdispatch.Matmul(a, b).plan(**kw)
    with caplog.at_level(logging.WARNING, logger="nvdispatch"):
        timings = mm.autotune(iterations=1)
    assert broken not in timings and "plain" in timings
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warning) == 1 and broken in warning[0] and "matmul" in warning[0] and "differs" in warning[0]
    np.testing.assert_allclose(mm.execute(), _oracle(a, b, bias), rtol=1e-4, atol=1e-3)
    explained = linalg.explain_matmul(a, b, **kw)
    assert explained.strategy != broken
    assert any(s.startswith(f"rejected {broken} when autotuned: its result differs from plain's") for s in explained.steps)
    assert f"[{a.shape[0] - 1}, {b.shape[1] // 2}]" in " ".join(explained.steps)
    recorded = plan_cache.tuning_for(linalg.choice_key(mm._selection.executor, "matmul", mm._problem))
    assert set(recorded["rejected"]) == {broken}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_strategies_within_rounding_are_all_timed(dtype):
    a, b, bias = _operands(dtype, m=513, k=1000, n=70)
    mm = nvdispatch.Matmul(a, b).plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    timings = mm.autotune(iterations=1)
    assert set(timings) == set(numpy_matmul.strategies(mm._problem))
    rtol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(mm.execute(), _oracle(a, b, bias), rtol=rtol, atol=rtol * 10)


def test_the_tolerance_separates_rounding_from_a_wrong_element():
    a, b, bias = _operands(np.float32, m=64, k=4096, n=64)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    single = (a @ b).astype(np.float64)
    scale = np.abs(a).max() * np.abs(b).max()
    tol = _agreement.gemm_tolerance("float32", 4096, scale, "float32", np.abs(exact).max())
    assert np.abs(single - exact).max() < tol / 10  # rounding: far inside
    assert _agreement.disagreement(_agreement.sample_host(exact), _agreement.sample_host(single), tol) is None
    wrong = single.copy()
    wrong[-1, 10] = single[-1, 11]  # an index off by one
    assert np.abs(wrong - exact).max() > 10 * tol


def test_no_reference_no_check():
    assert _matmul_agreement.reference_of(("native", "framework_fused")) is None
    assert _matmul_agreement.reference_of(("native", "inplace", "plain")) == "plain"


def test_the_cublaslt_check_reads_device_samples_and_bounds_rounding(monkeypatch):
    """``lt_result_check.result_check`` (what the GPU autotune checks its winner with), over host memory offered
    as device memory: the runtime's copy is the one stand-in."""
    import ctypes

    from nvdispatch._cuda import arrays, lt_result_check, runtime

    def copy_to_host(dst, src, stream, pitch=None):
        for i in range(len(dst)):
            ctypes.memmove(dst.ctypes.data + i * dst.itemsize, src + i * (pitch or dst.itemsize), dst.itemsize)
        return dst

    monkeypatch.setattr(runtime, "copy_to_host", copy_to_host)
    a, b, _ = _operands(np.float32, m=130, k=512, n=70)
    problem = nvdispatch.Matmul(a, b).plan()._problem

    def view(x):
        return arrays.DeviceView(x.ctypes.data, x.dtype.name, x.shape, tuple(s // x.itemsize for s in x.strides))

    exact = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
    latest = [a @ b]
    check = lt_result_check.result_check(problem, lambda: view(latest[0]), exact.shape, {"a": view(a), "b": view(b)}, 0)
    expected = check.read()
    np.testing.assert_array_equal(expected, _agreement.sample_host(latest[0]))
    tol = check.tolerance(expected)
    assert np.abs(exact.astype(np.float64) - latest[0]).max() < tol
    wrong = exact.copy()
    wrong[-1, 0] += 1.0
    latest[0] = wrong
    bad = _agreement.disagreement(expected, check.read(), tol)
    assert bad is not None and _agreement.position(check.shape, bad[1]) == f"[{a.shape[0] - 1}, 0]"


class WrongEngine(Wrong):
    direct = None  # (the calibration's hot call then runs execute)


def test_the_engine_calibration_ranks_an_engine_with_a_wrong_result_last(caplog):
    from nvdispatch.executors import numpy_matmul_calibration as calibration

    a, b, bias = _operands(np.float32, m=200, k=64, n=96)
    problem = nvdispatch.Matmul(a, b).plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})._problem
    candidates = numpy_matmul.candidates(problem)
    assert calibration.REFERENCE in candidates and len(candidates) > 1
    broken = next(e for e in candidates if e != calibration.REFERENCE)

    def make_plan(rep, engine):
        got = numpy_matmul.engine_plan(rep, engine)
        return WrongEngine(got) if engine == broken else got

    calibration.clear()
    try:
        with caplog.at_level(logging.WARNING, logger="nvdispatch"):
            ranked = calibration.calibrate(problem, candidates, make_plan, persist=False)
        assert ranked.order[-1] == broken and broken not in ranked.seconds and ranked.rejected == (broken,)
        assert set(ranked.order) == set(candidates)
        assert f"{broken} last: results disagreed with ufunc's" in ranked.describe()
        (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert "CPU engine calibration" in warning and broken in warning
        honest = calibration.calibrate(problem, candidates, numpy_matmul.engine_plan, persist=False)
        assert honest.rejected == () and set(honest.seconds) == set(candidates)
    finally:
        calibration.clear()
