"""Array-API standard / PEP 465 matmul semantics, checked on every executor that can run here.

NumPy is the oracle. Each check runs under ``set_backend(<executor>, only=True)`` with that executor's
own array type, so a check cannot silently pass through another executor.
"""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
from nvdispatch import errors
from nvdispatch.executors import builtin


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _targets():
    """(executor name, to_array, to_numpy) for every executor usable on this machine."""
    out = [pytest.param("numpy", np.asarray, np.asarray, id="numpy")]
    torch = _torch()
    if torch is not None:
        out.append(pytest.param("torch", torch.from_numpy, lambda t: t.cpu().numpy(), id="torch-cpu"))
        if torch.cuda.is_available():
            cuda = lambda a: torch.from_numpy(a).cuda()  # noqa: E731
            out.append(pytest.param("torch", cuda, lambda t: t.cpu().numpy(), id="torch-cuda", marks=pytest.mark.gpu))
            if builtin("cuda") is not None and builtin("cuda").unavailable() is None:
                out.append(
                    pytest.param("cuda", cuda, lambda t: t.cpu().numpy(), id="cuda-torch", marks=pytest.mark.gpu)
                )
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0 and builtin("cupy") is not None:
            out.append(pytest.param("cupy", cupy.asarray, cupy.asnumpy, id="cupy", marks=pytest.mark.gpu))
    except Exception:  # noqa: BLE001 - no CuPy or no device
        pass
    return out


TARGETS = _targets()

SHAPES = [
    # (a shape, b shape): 2-D, 1-D promotion on either or both sides, batch broadcasting
    ((3, 4), (4, 5)),
    ((4,), (4, 5)),
    ((3, 4), (4,)),
    ((4,), (4,)),
    ((2, 3, 4), (4, 5)),
    ((3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (5, 4, 2)),
    ((4,), (2, 4, 5)),
    ((2, 3, 4), (4,)),
    ((0, 4), (4, 5)),
    ((3, 0), (0, 5)),
]

DTYPES = ["float32", "float64", "int32", "int64", "complex64", "complex128"]


def _data(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, size=shape)
    if dtype.startswith("complex"):
        x = x + 1j * rng.integers(-3, 4, size=shape)
    return x.astype(dtype)


@pytest.mark.parametrize("name,to_array,to_numpy", TARGETS)
@pytest.mark.parametrize("a_shape,b_shape", SHAPES)
def test_shapes_and_values_follow_pep465(name, to_array, to_numpy, a_shape, b_shape):
    a, b = _data(a_shape, "float64", 0), _data(b_shape, "float64", 1)
    if name == "cuda" and 0 in a_shape + b_shape:
        # cuBLASLt takes no zero-size problems: the cuda executor declines them (its default position
        # leaves them to the framework's executor); conformance shows the gap rather than hiding it
        with nvdispatch.set_backend(name, only=True), pytest.raises(errors.NoExecutorError, match="zero-size"):
            nvdispatch.matmul(to_array(a), to_array(b))
        pytest.skip("the cuda executor declines zero-size matmuls")
    with nvdispatch.set_backend(name, only=True):
        got = nvdispatch.matmul(to_array(a), to_array(b))
    want = np.asarray(np.matmul(a, b))
    assert tuple(got.shape) == want.shape
    np.testing.assert_allclose(to_numpy(got), want, rtol=1e-12)


@pytest.mark.parametrize("name,to_array,to_numpy", TARGETS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_result_dtype_is_the_promoted_dtype(name, to_array, to_numpy, dtype):
    a, b = _data((3, 4), dtype, 0), _data((4, 2), dtype, 1)
    with nvdispatch.set_backend(name, only=True):
        try:
            got = nvdispatch.matmul(to_array(a), to_array(b))
        except errors.NoExecutorError as exc:
            pytest.skip(f"{name} does not run {dtype}: {exc}")
    assert np.dtype(str(got.dtype).removeprefix("torch.")) == np.dtype(dtype)
    np.testing.assert_array_equal(to_numpy(got), np.matmul(a, b))


@pytest.mark.parametrize("name,to_array,to_numpy", TARGETS)
def test_mixed_dtypes_promote(name, to_array, to_numpy):
    a, b = _data((3, 4), "float32", 0), _data((4, 2), "float64", 1)
    with nvdispatch.set_backend(name, only=True):
        got = nvdispatch.matmul(to_array(a), to_array(b))
    assert str(got.dtype).endswith("float64")


@pytest.mark.parametrize("name,to_array,to_numpy", TARGETS)
@pytest.mark.parametrize("a_shape,b_shape", [((), (3, 4)), ((3, 4), ()), ((), ())])
def test_zero_dimensional_operands_are_errors(name, to_array, to_numpy, a_shape, b_shape):  # ValueErrors, as in NumPy
    a, b = _data(a_shape, "float64", 0), _data(b_shape, "float64", 1)
    with nvdispatch.set_backend(name, only=True), pytest.raises(errors.ShapeMismatchError):
        nvdispatch.matmul(to_array(np.asarray(a)), to_array(np.asarray(b)))


@pytest.mark.parametrize("name,to_array,to_numpy", TARGETS)
@pytest.mark.parametrize(
    "a_shape,b_shape",
    [((3, 4), (5, 2)), ((4,), (5,)), ((3, 4), (3,)), ((2, 3, 4), (3, 4, 5)), ((2, 3, 4), (3, 5, 4, 2))],
)
def test_mismatched_dimensions_are_errors(name, to_array, to_numpy, a_shape, b_shape):
    a, b = _data(a_shape, "float64", 0), _data(b_shape, "float64", 1)
    with nvdispatch.set_backend(name, only=True), pytest.raises(errors.ShapeMismatchError):
        nvdispatch.matmul(to_array(a), to_array(b))


@pytest.mark.parametrize("name,to_array,to_numpy", TARGETS)
def test_operands_are_not_modified(name, to_array, to_numpy):
    a, b = _data((2, 3, 4), "float64", 0), _data((4, 5), "float64", 1)
    ta, tb = to_array(a), to_array(b)
    with nvdispatch.set_backend(name, only=True):
        nvdispatch.matmul(ta, tb)
    np.testing.assert_array_equal(to_numpy(ta), a)
    np.testing.assert_array_equal(to_numpy(tb), b)
