"""CuPy-chunked Dask arrays on a GPU: the synchronous scheduler and a one-GPU dask_cuda.LocalCUDACluster.
RELU_BIAS matmul (K concatenated per block, tree-reduced, whole) and FFTs along chunked axes against float64 NumPy; each block's
product is one fused cuBLASLt launch (explain per block). Skipped without a GPU.

On the GPU machine (Dask is not installed there; see tests/dask/README.md for the wheels to carry):
    python3 -m pytest -m gpu -q tests/dask
"""

from __future__ import annotations

import numpy as np
import pytest
from dask_reference import close

import nvdispatch
import nvdispatch.fft as F

pytestmark = pytest.mark.gpu

cupy = pytest.importorskip("cupy")
da = pytest.importorskip("dask.array")


def _operands(m=96, k=80, n=72, chunks_a=(32, 40), chunks_b=(40, 24), seed=0):
    rng = np.random.default_rng(seed)
    a, b, bias = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n), (n,)))
    A = da.from_array(cupy.asarray(a), chunks=chunks_a, asarray=False)
    B = da.from_array(cupy.asarray(b), chunks=chunks_b, asarray=False)
    return a, b, bias, A, B


def _want(a, b, bias):
    return np.maximum(a.astype(np.float64) @ b + bias, 0)


@pytest.fixture(scope="module")
def cuda_client():
    dask_cuda = pytest.importorskip("dask_cuda")
    distributed = pytest.importorskip("distributed")
    with (
        dask_cuda.LocalCUDACluster(n_workers=1, dashboard_address=None) as cluster,
        distributed.Client(cluster) as client,
    ):
        import cloudpickle
        import dask_reference

        cloudpickle.register_pickle_by_value(dask_reference)
        yield client


#: K in 4 chunks: concatenated per block (the panels, a and b once, are fewer bytes than 3 partial products);
#: in 2 chunks: tree-reduced (more bytes than the 1 partial product); whole
K_CHUNKS = pytest.mark.parametrize("k_chunks", [20, 40, 80], ids=["K concatenated", "K tree", "K whole"])


@K_CHUNKS
def test_relu_bias_matmul_sync(k_chunks):
    a, b, bias, A, B = _operands(chunks_a=(32, k_chunks), chunks_b=(k_chunks, 24))
    r = nvdispatch.matmul(A, B, epilog="RELU_BIAS", epilog_inputs={"bias": cupy.asarray(bias)})
    assert isinstance(r._meta, cupy.ndarray) and r.dtype == np.float32
    got = r.compute(scheduler="sync")
    assert isinstance(got, cupy.ndarray)  # the chunks stayed on the GPU
    close(cupy.asnumpy(got), _want(a, b, bias), "float32")


@pytest.mark.parametrize("k_chunks", [20, 40], ids=["K concatenated", "K tree"])
def test_relu_bias_matmul_local_cuda_cluster(k_chunks, cuda_client):
    a, b, bias, A, B = _operands(chunks_a=(32, k_chunks), chunks_b=(k_chunks, 24))
    r = nvdispatch.matmul(A, B, epilog="RELU_BIAS", epilog_inputs={"bias": cupy.asarray(bias)})
    got = cuda_client.compute(r, sync=True)
    close(cupy.asnumpy(got), _want(a, b, bias), "float32")


@K_CHUNKS
def test_each_block_is_one_fused_cublaslt_launch(k_chunks):
    _, _, bias, A, B = _operands(chunks_a=(32, k_chunks), chunks_b=(k_chunks, 24))
    e = nvdispatch.explain(A, B, epilog="RELU_BIAS", epilog_inputs={"bias": cupy.asarray(bias)})
    assert e.executor == "dask"
    form = {20: "K in 4 chunks concatenated", 40: "K in 2 chunks tree-reduced", 80: "K in 1 chunk(s)"}[k_chunks]
    assert form in str(e), e.steps
    block = [s for s in e.steps if s.startswith("first block")]
    assert block[0] == "first block: executor 'cuda', strategy 'native'", block
    launches = [s for s in block if "cublasLtMatmul" in s]
    assert len(launches) == 1 and "one launch" in launches[0] and "RELU_BIAS" in launches[0], block
    assert not any("copy" in s or "in place" in s for s in block), block


@pytest.mark.parametrize("func,kwargs", [("fft", {"axis": 0}), ("fftn", {}), ("rfftn", {}), ("irfft", {"axis": 1})])
def test_fft_along_chunked_axes(func, kwargs, cuda_client):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 48)).astype(np.float32)
    if func not in ("rfftn",):
        x = (x + 1j * rng.standard_normal((64, 48))).astype(np.complex64)
    X = da.from_array(cupy.asarray(x), chunks=(16, 12), asarray=False)
    y = getattr(F, func)(X, **kwargs)
    assert isinstance(y._meta, cupy.ndarray)
    want = getattr(np.fft, func)(x.astype(np.complex128 if x.dtype.kind == "c" else np.float64), **kwargs)
    for got in (y.compute(scheduler="sync"), cuda_client.compute(y, sync=True)):
        assert isinstance(got, cupy.ndarray)
        close(cupy.asnumpy(got), want, str(got.dtype))


def test_fft_block_explain_names_a_gpu_executor():
    X = da.from_array(cupy.ones((64, 48), cupy.complex64), chunks=(16, 12), asarray=False)
    e = nvdispatch.explain(F.fft, X, axis=0)
    assert "rechunk x" in str(e)
    assert any(s.startswith("first block: executor 'c") for s in e.steps), e.steps  # 'cuda' or 'cupy'
