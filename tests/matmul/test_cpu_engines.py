"""The NumPy executor's engines (BLAS gemm with beta=1, Torch's addmm family on zero-copy views, the
whole-result ufunc pass) against the independent float64 oracle, on every layout they meet, and the
per-class calibration that picks among them."""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pytest
from matmul_reference import assert_close, expected

import nvdispatch
from nvdispatch import Epilog
from nvdispatch.executors import numpy_matmul, numpy_matmul_calibration
from nvdispatch.executors.numpy_matmul_engines import STRATEGY_OF, available

try:  # the Torch engine is a candidate in processes that use Torch
    import torch  # noqa: F401
except ImportError:  # pragma: no cover
    pass

STRATEGIES = ["native", "framework_fused", "inplace", "plain"]
LINEAR = [Epilog.BIAS, Epilog.RELU_BIAS, Epilog.GELU_BIAS, Epilog.RELU, Epilog.GELU, Epilog.DEFAULT]


def _ints(shape, dtype, seed, order="C"):
    x = np.random.default_rng(seed).integers(-3, 4, shape).astype(dtype)
    return np.asfortranarray(x) if order == "F" else x


def _offered(a, b, **kw):
    return nvdispatch.explain(a, b, **kw).strategies


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("epilog", LINEAR, ids=lambda e: e.name)
@pytest.mark.parametrize(
    "m, k, n, a_order, b_order, dtype",
    [(37, 6, 9, "C", "C", "float32"), (64, 33, 17, "F", "C", "float64"), (130, 40, 70, "F", "F", "float32")],
)
def test_engine_matches_oracle(strategy, epilog, dtype, m, k, n, a_order, b_order):
    a, b = _ints((m, k), dtype, 1, a_order), _ints((k, n), dtype, 2, b_order)
    inputs = {"bias": _ints((n,), dtype, 3)} if "BIAS" in epilog.name else None
    kw = {"epilog": epilog, "epilog_inputs": inputs, "alpha": 0.5}
    if epilog is Epilog.DEFAULT:
        kw["c"], kw["beta"] = _ints((m, n), dtype, 4), 2.0
    c = kw.pop("c", None)
    if strategy not in _offered(a, b, c=c, **kw):
        pytest.skip(f"{strategy} not offered here (engine not installed or not applicable)")
    before = (a.copy(), b.copy())
    got = nvdispatch.matmul(a, b, c, **kw, preferences={"strategy": strategy})
    want, _ = expected(a, b, c, 0.5, kw.get("beta"), epilog, inputs)
    assert got.dtype == np.dtype(dtype) and got.shape == (m, n)
    assert_close(got, want, dtype, scale=4 if "GELU" in epilog.name else 1)
    np.testing.assert_array_equal(a, before[0])
    np.testing.assert_array_equal(b, before[1])


@pytest.mark.parametrize("strategy", ["native", "framework_fused", "inplace"])
def test_engines_fall_back_on_layouts_they_cannot_read(strategy):
    a_big = _ints((40, 20), "float32", 5)
    a = a_big[::2, ::2]  # strided: BLAS would need a copy
    b = _ints((10, 7), "float32", 6)
    b.flags.writeable = False  # read-only: Torch cannot view it
    bias = _ints((7,), "float32", 7)
    kw = {"epilog": Epilog.RELU_BIAS, "epilog_inputs": {"bias": bias}}
    if strategy not in _offered(a, b, **kw):
        pytest.skip(f"{strategy} not offered here")
    got = nvdispatch.matmul(a, b, **kw, preferences={"strategy": strategy})
    want, _ = expected(a, b, None, 1, None, Epilog.RELU_BIAS, {"bias": bias})
    assert_close(got, want, "float32")
    got = nvdispatch.matmul(a, b, **kw, preferences={"strategy": strategy})  # the hot path too
    assert_close(got, want, "float32")


@pytest.mark.parametrize("strategy", ["native", "framework_fused", "inplace"])
def test_vectors_batch_of_one_and_empty(strategy):
    bias = _ints((5,), "float64", 8)
    kw = {"epilog": Epilog.RELU_BIAS, "epilog_inputs": {"bias": bias}, "preferences": {"strategy": strategy}}
    for a, b in [
        (_ints((4,), "float64", 9), _ints((4, 5), "float64", 10)),  # 1-D a
        (_ints((1, 3, 4), "float64", 11), _ints((4, 5), "float64", 12)),  # batch of one
        (np.zeros((0, 4)), _ints((4, 5), "float64", 13)),
        (np.zeros((3, 0)), np.zeros((0, 5))),
    ]:
        if strategy not in _offered(a, b, epilog=kw["epilog"], epilog_inputs=kw["epilog_inputs"]):
            continue
        got = nvdispatch.matmul(a, b, **kw)
        want, _ = expected(a, b, None, 1, None, Epilog.RELU_BIAS, {"bias": bias})
        assert got.shape == want.shape
        assert_close(got, want, "float64")


def test_nan_through_relu_is_the_same_on_every_strategy():
    a = np.array([[np.nan, 1.0], [1.0, 1.0]], np.float32)
    b = np.eye(2, dtype=np.float32)
    bias = np.array([0.0, -5.0], np.float32)
    kw = {"epilog": Epilog.RELU_BIAS, "epilog_inputs": {"bias": bias}}
    results = {s: nvdispatch.matmul(a, b, **kw, preferences={"strategy": s}) for s in _offered(a, b, **kw)}
    first = next(iter(results.values()))
    for s, r in results.items():
        np.testing.assert_array_equal(r, first, err_msg=s)


def test_planning_never_measures_and_calibrating_orders_the_class_once(monkeypatch):
    numpy_matmul_calibration.clear()
    calls = []
    real = numpy_matmul_calibration._measure

    def spy(problem, candidates, make_plan):
        calls.append(candidates)
        return real(problem, candidates, make_plan)

    monkeypatch.setattr(numpy_matmul_calibration, "_measure", spy)
    a, b = _ints((16, 8), "float32", 14), _ints((8, 12), "float32", 15)
    kw = {"epilog": Epilog.RELU_BIAS, "epilog_inputs": {"bias": _ints((12,), "float32", 16)}}
    first = nvdispatch.explain(a, b, **kw)
    assert not calls  # a query: an unmeasured class runs on the default order
    assert "the default order" in first.steps[-1] and first.strategy == "inplace"
    ranked = numpy_matmul.calibrate(first.problem)
    assert len(calls) == 1 and ranked.source == "fresh"
    nvdispatch.plan_cache.clear()
    a2 = _ints((17, 8), "float32", 17)  # same class (size bucket, layout, epilog)
    second = nvdispatch.explain(a2, b, **kw)
    assert len(calls) == 1
    assert STRATEGY_OF[ranked.order[0]] == second.strategy == second.strategies[0] != "plain"
    assert "calibrated by this process" in second.steps[-1]
    info = numpy_matmul_calibration.calibrations()
    (entry,) = info.values()
    assert entry["source"] == "fresh" and entry["order"] == ranked.order
    assert set(entry["seconds"]) == set(calls[0]) and all(t > 0 for t in entry["seconds"].values())
    numpy_matmul_calibration.clear()
    nvdispatch.plan_cache.clear()
    third = nvdispatch.explain(a, b, **kw)  # the ranking kept (in the session's cache directory)
    assert len(calls) == 1 and "calibrated on this machine" in third.steps[-1]
    assert third.strategy == second.strategy
    nvdispatch.plan_cache.clear()


def test_large_problems_calibrate_on_a_shrunk_copy():
    from nvdispatch._matmul_problem import ArraySig

    bias = {"bias": np.ones(6, np.float32)}
    p = nvdispatch.explain(
        np.ones((8, 4), np.float32), np.ones((4, 6), np.float32), epilog="RELU_BIAS", epilog_inputs=bias
    ).problem
    a = ArraySig("float32", (1 << 20, 1024), (1024, 1))
    b = ArraySig("float32", (1024, 256), (256, 1))
    big = dataclasses.replace(p, m=1 << 20, k=1024, n=256, a=a, b=b, result_shape=(1 << 20, 256))
    rep = numpy_matmul_calibration.representative(big)
    assert rep.k == 1024 and rep.n == 256 and rep.m * rep.n * rep.k <= numpy_matmul_calibration.CACHE_BUDGET_MACS
    assert numpy_matmul_calibration.problem_class(big) != numpy_matmul_calibration.problem_class(p)


def test_engines_available_are_the_installed_ones():
    import importlib.util

    have = available()
    assert have[0] == "ufunc"
    assert ("torch" in have) == (sys.modules.get("torch") is not None)  # never imported just to try it
    assert ("blas" in have) == (importlib.util.find_spec("scipy") is not None)


@pytest.mark.parametrize("strategy", ["native", "framework_fused", "inplace"])
def test_batch_of_one_with_c(strategy):
    a, b = _ints((1, 2, 3), "float64", 18), _ints((1, 3, 1), "float64", 19)
    c = _ints((1, 2, 1), "float64", 20)
    kw = {"epilog": Epilog.RELU, "alpha": 2.0, "beta": 0.5}
    if strategy not in _offered(a, b, c=c, **kw):
        pytest.skip(f"{strategy} not offered here")
    got = nvdispatch.matmul(a, b, c, **kw, preferences={"strategy": strategy})
    want, _ = expected(a, b, c, 2.0, 0.5, Epilog.RELU, None)
    assert got.shape == want.shape
    assert_close(got, want, "float64")


def test_engines_with_own_threads_count_their_slower_setting(monkeypatch):
    """An engine that is fastest in a loop of its own but slow right after another BLAS product (its threads
    share the cores with the BLAS's spinning workers) ranks behind one that is steady in both."""
    import time
    import types

    state = {"after_product": False}

    def product(a, b):
        state["after_product"] = True
        return np.matmul(a, b)

    class Fake:
        def __init__(self, name):
            self.name, self.direct = name, None
            self.own_threads = 2 if name == "threads" else 1

        def execute(self, ops):
            slow, state["after_product"] = state["after_product"], False
            time.sleep({"threads": 6e-3 if slow else 0.0, "steady": 2e-3}[self.name])

    class NumpyWithSpiedMatmul(types.ModuleType):
        matmul = staticmethod(product)

        def __getattr__(self, name):
            return getattr(np, name)

    monkeypatch.setattr(numpy_matmul_calibration, "np", NumpyWithSpiedMatmul("numpy"))
    monkeypatch.setattr(numpy_matmul_calibration.blas_threads, "let_workers_sleep", lambda: None)
    a, b = _ints((16, 8), "float32", 21), _ints((8, 12), "float32", 22)
    problem = nvdispatch.explain(a, b, epilog=Epilog.RELU).problem
    seconds, settled, mixed = numpy_matmul_calibration._measure(
        problem, ("threads", "steady"), lambda p, name: Fake(name)
    )
    assert seconds["threads"] >= 6e-3 and seconds["steady"] >= 2e-3  # each its slower setting: a sleep's least
    assert seconds["threads"] > seconds["steady"]
    # (each setting kept too: the engine with threads of its own first when settled, the steady one after a product)
    assert settled["threads"] < settled["steady"] and mixed["threads"] > mixed["steady"]


def test_default_order_puts_the_sweep_first_only_beyond_the_cache():
    candidates = ("sweep", "blas", "panels", "ufunc")
    small = nvdispatch.explain(np.ones((8, 4), np.float32), np.ones((4, 6), np.float32), epilog="RELU").problem
    big = dataclasses.replace(small, m=1 << 14, n=1 << 10, result_shape=(1 << 14, 1 << 10))
    assert numpy_matmul_calibration.default_order(candidates, small)[:2] == ("ufunc", "sweep")
    assert numpy_matmul_calibration.default_order(candidates, big)[:2] == ("sweep", "ufunc")
    assert numpy_matmul_calibration.default_order(candidates) == ("sweep", "ufunc", "blas", "panels")
