"""``linalg.prepare_call``: the call an integration runs a fixed GEMM with (the plan ``matmul`` would run, held),
giving what ``matmul`` gives for arrays of the same signatures, against a float64 NumPy oracle."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
from nvdispatch import linalg


def _relu_bias(a, b, bias):
    return np.maximum(np.asarray(a, np.float64) @ np.asarray(b, np.float64) + np.asarray(bias, np.float64), 0)


def test_numpy_calls_run_the_held_plan():
    rng = np.random.default_rng(0)
    a, b, bias = rng.standard_normal((5, 3)), rng.standard_normal((3, 4)), rng.standard_normal(4)
    hold, call = linalg.prepare_call(a, b, "RELU_BIAS", {"bias": bias})
    try:
        assert nvdispatch.plan_cache.users(hold.plan) >= 1
        for _ in range(2):
            a2, b2, bias2 = rng.standard_normal((5, 3)), rng.standard_normal((3, 4)), rng.standard_normal(4)
            np.testing.assert_allclose(call(a2, b2, bias2), _relu_bias(a2, b2, bias2), rtol=1e-12, atol=1e-12)
    finally:
        hold.close()


def test_an_epilog_with_an_output_gives_matmuls_pair():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((6, 3)), rng.standard_normal((3, 2))
    hold, call = linalg.prepare_call(a, b, "BGRADB")
    try:
        d, extra = call(a, b)
        np.testing.assert_allclose(d, a @ b, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.ravel(extra["bgradb"]), b.sum(axis=0), rtol=1e-12, atol=1e-12)
    finally:
        hold.close()


def test_arrays_seen_through_views_come_back_in_their_framework():
    xp = pytest.importorskip("array_api_strict")
    a = xp.asarray(np.arange(6.0).reshape(2, 3))
    b = xp.asarray(np.ones((3, 2)))
    hold, call = linalg.prepare_call(a, b)
    try:
        got = call(a, b)
        assert type(got) is type(a)
        np.testing.assert_allclose(np.asarray(got), np.arange(6.0).reshape(2, 3) @ np.ones((3, 2)))
    finally:
        hold.close()


def test_a_coercing_backend_takes_the_public_function():
    torch = pytest.importorskip("torch")
    a, b, bias = torch.randn(4, 3, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    with nvdispatch.set_backend("numpy", coerce=True):
        hold, call = linalg.prepare_call(a, b, "RELU_BIAS", {"bias": bias})
        try:
            got = call(a, b, bias)
        finally:
            hold.close()
    assert isinstance(got, np.ndarray)  # as matmul gives under that backend
    np.testing.assert_allclose(got, _relu_bias(a.numpy(), b.numpy(), bias.numpy()), rtol=1e-6, atol=1e-6)
