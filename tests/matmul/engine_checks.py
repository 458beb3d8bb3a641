"""Checks the CPU engine test files share: what the route does when one engine is missing."""

from __future__ import annotations

import numpy as np
from matmul_reference import assert_close, expected

import nvdispatch
from nvdispatch import Epilog
from nvdispatch.executors import numpy_matmul, numpy_matmul_calibration


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
