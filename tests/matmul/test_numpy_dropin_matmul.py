"""``nvdispatch.matmul`` as a drop-in for ``numpy.matmul`` on NumPy input (issue #28.7): array-likes are taken the
NumPy way, and a 1-D @ 1-D product is a NumPy scalar of NumPy's result type (NumPy's
``TestMatmul.test_result_types``). The reference is ``numpy.matmul`` itself, on float64/int64 values."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
from nvdispatch import errors


@pytest.mark.parametrize(
    "a, b",
    [
        ([[1.0, 2.0], [3.0, 4.0]], [[1.0], [-1.0]]),
        (((1, 2), (3, 4)), (5, 6)),  # tuples, a 1-D right operand
        ([1.5, -2.0], np.arange(6.0).reshape(2, 3)),  # a list beside an array
        (np.arange(6).reshape(3, 2), [[1, 0, 2], [0, 1, 0]]),  # integers
    ],
)
def test_array_likes_are_taken_as_numpy_matmul_takes_them(a, b):
    want = np.matmul(a, b)
    for _ in range(2):
        got = nvdispatch.matmul(a, b)
        assert type(got) is type(want) and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_array_like_epilog_inputs_and_c_are_taken_too():
    a, b = [[1.0, -2.0], [3.0, 4.0]], [[1.0, 0.0], [0.0, 1.0]]
    got = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": [1.0, -10.0]})
    np.testing.assert_array_equal(got, np.maximum(np.array(a) @ np.array(b) + [1.0, -10.0], 0))
    got = nvdispatch.matmul(a, b, [[1.0, 1.0], [1.0, 1.0]], beta=2.0)
    np.testing.assert_array_equal(got, np.array(a) @ np.array(b) + 2)
    with nvdispatch.Matmul(a, b) as mm:
        np.testing.assert_array_equal(mm.plan().execute(), np.matmul(a, b))


@pytest.mark.parametrize(
    "x, what",
    [([[1.0], [1.0, 2.0]], "ragged"), ([["a", "b"]], "strings"), ("ab", "a string"), ([[None]], "objects")],
)
def test_array_likes_numpy_cannot_compute_with_are_typed_errors(x, what):
    with pytest.raises(errors.UnsupportedOperandError) as info:
        nvdispatch.matmul(x, np.ones((2, 2)))
    assert info.value.argument == "a"


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "complex64", "complex128"])
def test_a_vector_dot_product_is_a_numpy_scalar_of_numpys_type(dtype):
    v = np.arange(1, 5).astype(dtype)
    want = np.matmul(v, v)
    assert isinstance(want, np.generic)
    for _ in range(3):  # planned, then the cached call
        got = nvdispatch.matmul(v, v)
        assert type(got) is type(want) and got == want
    assert type(nvdispatch.matmul(v.tolist(), v)) is type(np.matmul(v.tolist(), v))
    if dtype.startswith("float"):
        got = nvdispatch.matmul(v, -v, epilog="RELU")  # with an epilog too: NumPy's scalar type
        assert type(got) is type(want) and got == 0


def test_vector_matrix_products_stay_arrays():
    v, m = np.arange(3.0), np.arange(6.0).reshape(3, 2)
    for _ in range(2):
        got = nvdispatch.matmul(v, m)
        assert type(got) is np.ndarray and got.shape == (2,)
        np.testing.assert_array_equal(got, v @ m)
