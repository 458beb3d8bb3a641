"""Checks the CPU engine test files share: what the route does when one engine is missing, and when the
calibration finds one engine the fastest."""

from __future__ import annotations

import time
from collections.abc import Callable

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


def _slowed(run):
    def wrapped(*args, **kwargs):
        time.sleep(2e-3)
        return run(*args, **kwargs)

    return wrapped


def assert_calibration_chooses(monkeypatch, engine: str, a, b, bias, check: Callable) -> None:
    """With every engine but ``engine`` made slower (each of their calls sleeps first), a calibration of the
    RELU_BIAS problem of ``a``, ``b``, ``bias`` ranks ``engine`` first, the route runs it (strategy ``inplace``,
    the engine named by explain), and ``check(result)`` passes on the planning call and the cached plan's hot
    path."""
    from nvdispatch.executors import numpy_matmul_panels

    ep = numpy_matmul_engines.EnginePlan
    for name in ("_ufunc", "_blas", "_torch", "_gemm", "_tiled"):
        if name != f"_{engine}":
            monkeypatch.setattr(ep, name, _slowed(getattr(ep, name)))
    direct = numpy_matmul_engines._ufunc_direct
    monkeypatch.setattr(numpy_matmul_engines, "_ufunc_direct", lambda *args: _slowed(direct(*args)))
    monkeypatch.setattr(numpy_matmul_engines, "swept", _slowed(numpy_matmul_engines.swept))  # the sweep's, both calls
    monkeypatch.setattr(numpy_matmul.NumpyMatmulPlan, "execute", _slowed(numpy_matmul.NumpyMatmulPlan.execute))
    if engine != "panels":
        for name in ("_panels", "_compiled_panels"):
            panels = numpy_matmul_panels.PanelPlan
            monkeypatch.setattr(panels, name, _slowed(getattr(panels, name)))
    numpy_matmul_calibration.clear()
    nvdispatch.plan_cache.clear()
    try:
        kw = {"epilog": "RELU_BIAS", "epilog_inputs": {"bias": bias}}
        numpy_matmul.calibrate(nvdispatch.explain(a, b, **kw).problem, persist=False)
        nvdispatch.plan_cache.clear()
        info = nvdispatch.explain(a, b, **kw)
        assert info.strategy == "inplace"
        assert any(f"engine {engine!r}" in s for s in info.steps)
        (entry,) = numpy_matmul_calibration.calibrations().values()
        assert entry["order"][0] == engine and engine in entry["seconds"]
        for _ in range(2):  # planning, then the cached plan's hot path
            check(nvdispatch.matmul(a, b, **kw))
    finally:
        numpy_matmul_calibration.clear()
        nvdispatch.plan_cache.clear()
