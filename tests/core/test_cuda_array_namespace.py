"""``CudaArray.__array_namespace__``: the namespace wrapper turns CudaArray arguments into the backing
framework's arrays (checked here with NumPy standing in for CuPy; the GPU test uses the real one)."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
from nvdispatch import errors
from nvdispatch._cuda import cuda_array_namespace as ns
from nvdispatch._cuda.arrays import CudaArray


def _fake(host: np.ndarray) -> CudaArray:
    """A CudaArray object (no memory: base given) standing for ``host``; the adopt function below maps it."""
    x = CudaArray(host.shape, host.dtype.name, base=host, ptr=0)
    return x


def test_functions_take_cuda_arrays_alone_in_lists_and_by_keyword():
    host_a, host_b = np.arange(6.0).reshape(2, 3), np.ones((2, 3))
    a, b = _fake(host_a), _fake(host_b)
    xp = ns.CudaArrayNamespace("numpy", np, lambda x: x._base, CudaArray)
    np.testing.assert_array_equal(xp.add(a, b), host_a + 1)
    np.testing.assert_array_equal(xp.concatenate([a, b], axis=0), np.concatenate([host_a, host_b]))
    np.testing.assert_array_equal(xp.where(xp.greater(a, 2.0), a, b), np.where(host_a > 2, host_a, 1.0))
    assert float(xp.linalg.norm(a)) == pytest.approx(np.linalg.norm(host_a))  # submodules too
    assert xp.float32 is np.float32 and xp.pi == np.pi  # constants and dtypes untouched
    assert xp.add is xp.add  # wrapped once


def test_the_type_is_public_and_declares_the_namespace():
    assert nvdispatch.CudaArray is CudaArray and "CudaArray" in nvdispatch.__all__
    for attr in ("__array_namespace__", "__dlpack__", "__dlpack_device__", "__cuda_array_interface__"):
        assert hasattr(CudaArray, attr)


def test_unknown_api_version_is_a_typed_error():
    with pytest.raises(errors.InvalidArgumentError, match="api_version"):
        ns.namespace(CudaArray, "1999.01")


@pytest.mark.gpu
def test_cuda_array_results_have_a_working_namespace():
    cupy = pytest.importorskip("cupy")

    class Raw:  # a foreign object with only __cuda_array_interface__
        def __init__(self, arr):
            self._a = arr
            self.__cuda_array_interface__ = arr.__cuda_array_interface__

    a, b = cupy.random.standard_normal((8, 5)), cupy.random.standard_normal((5, 3))
    r = nvdispatch.matmul(Raw(a), Raw(b))
    assert isinstance(r, CudaArray)
    xp = r.__array_namespace__()
    total = xp.sum(r)
    assert isinstance(total, cupy.ndarray)
    np.testing.assert_allclose(float(total), float((a @ b).sum()), rtol=1e-10)
    np.testing.assert_allclose(xp.asarray(r).get(), (a @ b).get(), rtol=1e-12)
