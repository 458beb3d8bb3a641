"""The NumPy plan's direct call (the cached hot path of a plain product) gives np.matmul's exact result:
``ndarray.dot`` for real and integer matrices (cheaper to call), ``np.matmul`` elsewhere."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import nvdispatch
from nvdispatch import plan_cache

DTYPES = ["float16", "float32", "float64", "int8", "int32", "uint16", "uint64", "complex64", "complex128"]
SHAPES = [(1, 1, 1), (8, 8, 8), (3, 1, 5), (1, 7, 1), (17, 33, 65), (130, 64, 7)]


def _operand(rng, shape, dtype):
    x = rng.standard_normal(shape) * 3
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def _layouts(a, b):
    yield a, b
    yield np.asfortranarray(a), b
    yield a, np.asfortranarray(b)
    wide_a = np.repeat(a, 2, axis=1)[:, ::2]  # strided views
    wide_b = np.repeat(b, 2, axis=0)[::2]
    yield wide_a, wide_b


@pytest.mark.parametrize("dtype", DTYPES)
def test_cached_plain_calls_equal_np_matmul_bit_for_bit(dtype):
    rng = np.random.default_rng(0)
    for (m, k, n), first in itertools.product(SHAPES, (True, False)):
        a, b = _operand(rng, (m, k), dtype), _operand(rng, (k, n), dtype)
        for x, y in _layouts(a, b):
            if first:
                plan_cache.clear()  # the full path, then the hot path
            got = [nvdispatch.matmul(x, y), nvdispatch.matmul(x, y)]
            want = np.matmul(x, y)
            for g in got:
                assert type(g) is np.ndarray and g.dtype == want.dtype and g.shape == want.shape
                np.testing.assert_array_equal(g, want)
                assert g.flags.c_contiguous == want.flags.c_contiguous


def test_the_direct_call_is_dot_for_real_matrices_and_matmul_elsewhere():
    from nvdispatch.executors.numpy_matmul import NumpyMatmulPlan

    def direct(a, b):
        mm = nvdispatch.Matmul(a, b)
        mm.plan()
        plan = mm._plan
        mm.free()
        assert isinstance(plan, NumpyMatmulPlan)
        return plan.direct

    f32 = np.ones((4, 3), np.float32)
    assert direct(f32, f32.T) is np.ndarray.dot
    assert direct(f32.astype(np.int64), f32.T.astype(np.int8)) is np.ndarray.dot
    assert direct(f32.astype(np.complex64), f32.T) is np.matmul  # complex outer products round otherwise
    assert direct(np.ones((2, 4, 3)), f32.T) is np.matmul  # batches broadcast in np.matmul only
    assert direct(np.ones(3), f32.T) is not np.ndarray.dot  # a vector product's own call
