"""Checks the CPU engine test files share: what the route does when one engine is missing."""

from __future__ import annotations

import numpy as np
from matmul_reference import assert_close, expected

import nvdispatch
from nvdispatch import Epilog
from nvdispatch.executors import numpy_matmul, numpy_matmul_calibration, numpy_matmul_engines


def assert_route_runs_without(engine: str, seed: int) -> None:
    """With ``engine`` unavailable (the caller has patched it away), a fresh calibration never orders it and the
    route's RELU_BIAS result still matches the float64 oracle."""
    rng = np.random.default_rng(seed)
    a, b, bias = (rng.standard_normal(s).astype(np.float32) for s in ((9, 4), (4, 6), (6,)))
    kw = {"epilog": Epilog.RELU_BIAS, "epilog_inputs": {"bias": bias}}
    numpy_matmul_calibration.clear()
    nvdispatch.plan_cache.clear()
    try:
        assert engine not in numpy_matmul.engine_order(nvdispatch.explain(a, b, **kw).problem)
        got = nvdispatch.matmul(a, b, **kw)
    finally:
        numpy_matmul_calibration.clear()
        nvdispatch.plan_cache.clear()
    want, _ = expected(a, b, None, 1, None, Epilog.RELU_BIAS, {"bias": bias})
    assert_close(got, want, "float32")


def data(shape, dtype, seed: int, order: str = "C") -> np.ndarray:
    """Standard-normal operand of ``dtype`` (complex: independent real and imaginary parts), C or F order."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    x = x.astype(dtype)
    return np.asfortranarray(x) if order == "F" else x


def engine_plan(engine: str, a, b, **kw):
    """The plan of ``engine`` for this call's problem, which it must apply to."""
    problem = nvdispatch.explain(a, b, **kw).problem
    assert engine in numpy_matmul_engines.applicable(problem)
    return numpy_matmul.engine_plan(problem, engine)


def no_fallback(plan, engine: str):
    """``plan`` made to fail where it would fall back on the ufuncs."""

    def refuse(*args):
        raise AssertionError(f"the {engine} engine fell back on the ufuncs")

    plan._ufunc = refuse
    return plan
