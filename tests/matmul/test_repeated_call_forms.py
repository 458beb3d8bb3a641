"""Repeated calls find their plan by their call key whatever documented form their arguments take (they used to
be validated in full on every call): ``alpha``/``beta`` as NumPy scalars (the key holds the scalar's class; a
class whose values are not all valid for the result dtype, a float for an integer result, is still checked each
call), and ``options``/``preferences`` as dicts."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
from nvdispatch import errors, plan_cache

SCALARS = [np.float32(0.5), np.float64(-1.5), np.float16(2.0), np.int64(3), np.int8(-2), np.uint16(4)]


@pytest.fixture(autouse=True)
def _clean():
    plan_cache.clear()
    yield
    plan_cache.clear()


@pytest.mark.parametrize("alpha", SCALARS, ids=lambda s: type(s).__name__)
def test_numpy_scalar_alpha_and_beta_find_their_plan(alpha, full_paths):
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((5, 4), (4, 3), (5, 3)))
    bias = rng.standard_normal(3).astype(np.float32)
    calls = [
        (lambda: nvdispatch.matmul(a, b, alpha=alpha), float(alpha) * (a @ b)),
        (lambda: nvdispatch.matmul(a, b, c, alpha=alpha, beta=alpha), float(alpha) * (a @ b + c)),
        (
            lambda: nvdispatch.matmul(a, b, alpha=alpha, epilog="RELU_BIAS", epilog_inputs={"bias": bias}),
            np.maximum(float(alpha) * (a @ b) + bias, 0),
        ),
    ]
    for call, want in calls:
        call()
        full_paths[0] = 0
        for _ in range(3):
            np.testing.assert_allclose(call(), want, rtol=1e-5, atol=1e-5)
        assert full_paths[0] == 0, "a repeated call was validated in full again"


def test_a_float_scalar_for_an_integer_result_is_validated_every_call(full_paths):
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    b = np.ones((3, 2), dtype=np.int32)
    for _ in range(3):
        np.testing.assert_array_equal(nvdispatch.matmul(a, b, alpha=np.float32(2.0)), 2 * (a @ b))
        with pytest.raises(errors.InvalidArgumentError, match="alpha"):
            nvdispatch.matmul(a, b, alpha=np.float32(1.5))
    assert full_paths[0] == 6
    np.testing.assert_array_equal(nvdispatch.matmul(a, b, alpha=np.int16(3)), 3 * (a @ b))


def test_a_complex_scalar_needs_a_complex_result_every_call():
    a = np.ones((2, 2), np.float32)
    for _ in range(2):
        with pytest.raises(errors.InvalidArgumentError, match="alpha"):
            nvdispatch.matmul(a, a, alpha=np.complex64(1 + 1j))
    z = a.astype(np.complex64)
    for _ in range(2):
        np.testing.assert_allclose(nvdispatch.matmul(z, z, alpha=np.complex64(1j)), 1j * (z @ z))


def test_options_and_preferences_as_dicts_find_their_plan(full_paths):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.ones((4, 2), np.float32)
    bias = np.array([1.0, -100.0], np.float32)
    calls = [
        (lambda: nvdispatch.matmul(a, b, options={"scale_type": "float32"}), a @ b),
        (lambda: nvdispatch.matmul(a, b, preferences={"strategy": "plain"}), a @ b),
        (
            lambda: nvdispatch.matmul(
                a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}, preferences={"strategy": "inplace"}
            ),
            np.maximum(a @ b + bias, 0),
        ),
    ]
    for call, want in calls:
        call()
        full_paths[0] = 0
        for _ in range(3):
            np.testing.assert_allclose(call(), want)
        assert full_paths[0] == 0, "a repeated call was validated in full again"
    # the items are the key: another value is another call, validated as such
    with pytest.raises(errors.InvalidArgumentError):
        nvdispatch.matmul(a, b, preferences={"strategy": "no such strategy"})
    for _ in range(2):  # an unhashable value: the full path, and its typed error
        with pytest.raises(errors.InvalidArgumentError, match="scale_type"):
            nvdispatch.matmul(a, b, options={"scale_type": ["unhashable"]})
