"""Bad Dask input raises typed errors naming the argument when the call is made (not at dask_compute), and a
worker killed during compute() still gives the right, whole result."""

from __future__ import annotations

import time

import dask.array as da
import numpy as np
import pytest
from dask_reference import close, exit_soon, slow_copy

import nvdispatch
import nvdispatch.fft as F
from nvdispatch import errors


def _x(shape=(4, 4), chunks=2):
    return da.from_array(np.arange(float(np.prod(shape))).reshape(shape), chunks=chunks)


def test_unknown_nan_chunk_sizes():
    x = _x()
    z = x[x[:, 0] >= 0]  # boolean indexing: Dask no longer knows the chunk sizes
    with pytest.raises(errors.UnsupportedOperandError, match=r"^a: .*known chunk sizes.*compute_chunk_sizes"):
        nvdispatch.matmul(z, x)
    with pytest.raises(errors.UnsupportedOperandError, match=r"^b: "):
        nvdispatch.matmul(x, z)
    with pytest.raises(errors.UnsupportedOperandError, match=r"^x: "):
        F.fft(z)


def test_unknown_chunk_type():
    sp = pytest.importorskip("scipy.sparse")
    x = _x()
    s = x.map_blocks(sp.csr_matrix, meta=sp.csr_matrix((0, 0)))
    with pytest.raises(errors.UnsupportedOperandError, match=r"^a: .*chunks of type scipy\.sparse"):
        nvdispatch.matmul(s, x)
    with pytest.raises(errors.UnsupportedOperandError, match=r"^x: "):
        F.rfft(s)


def test_chunks_that_cannot_be_aligned():
    x = _x((6, 4), 2)
    with pytest.raises(errors.ShapeMismatchError, match=r"^b: "):
        nvdispatch.matmul(x, _x((5, 3)))  # K 4 vs 5: no rechunk makes these meet
    with pytest.raises(errors.EpilogInputError, match=r"bias"):
        nvdispatch.matmul(x, _x((4, 3)), epilog="BIAS", epilog_inputs={"bias": _x((5,), 2)})
    mask = da.from_array(np.zeros((6, 7), np.uint8), chunks=(2, 7))  # a bit mask cut into 1 block, result into 2
    with pytest.raises(errors.ShapeMismatchError, match=r"relu_aux"):
        nvdispatch.matmul(x, _x((4, 6), (2, 3)), epilog="DRELU", epilog_inputs={"relu_aux": mask})


def test_plain_operands_mix_when_small_and_fail_when_large():
    x = _x()
    close(nvdispatch.matmul(x, np.eye(4)).compute(scheduler="sync"), x.compute(), "float64")
    big = np.broadcast_to(np.float64(0), (4, 2**25))  # 1 GiB: more than Dask's array.chunk-size
    with pytest.raises(errors.MixedOperandsError, match=r"^b: .*dask.array.from_array"):
        nvdispatch.matmul(x, big)
    torch = pytest.importorskip("torch")
    with pytest.raises(errors.MixedOperandsError, match=r"^b: "):
        nvdispatch.matmul(x, torch.ones(4, 3, dtype=torch.float64))


def test_no_executor_when_dask_is_skipped():
    with nvdispatch.skip_backend("dask"), pytest.raises(errors.NoExecutorError):
        F.fft(_x())


def test_a_worker_killed_during_compute_still_gives_the_right_result(dask_client):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((96, 48)), rng.standard_normal((48, 96))
    bias = rng.standard_normal(96)
    A = da.from_array(a, chunks=(8, 16)).map_blocks(slow_copy, 0.02)
    B = da.from_array(b, chunks=(16, 8)).map_blocks(slow_copy, 0.02)
    r = nvdispatch.matmul(A, B, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    future = dask_client.compute(r)
    deadline = time.monotonic() + 30
    while not any(dask_client.processing().values()) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # some blocks done, many in flight
    victim = sorted(dask_client.scheduler_info()["workers"])[0]
    dask_client.run(exit_soon, workers=[victim])
    got = future.result(timeout=120)
    close(got, np.maximum(a @ b + bias, 0), "float64")
    dask_client.wait_for_workers(2, timeout=60)
    assert victim not in dask_client.scheduler_info()["workers"]  # it did die (its nanny started a new one)


def test_a_bit_mask_aux_of_unknown_width_is_taken_block_for_block():
    """cuBLASLt's ReLU bit mask has a width per block only the block executor knows (NaN chunk sizes along
    the last axis): a DRELU call takes it block for block, rechunking the rows only."""
    import math

    mask = da.from_array(np.zeros((6, 16), np.uint8), chunks=(3, 8))
    mask = mask.map_blocks(lambda b: b[:, :2], chunks=((3, 3), (math.nan, math.nan)), dtype=np.uint8)
    a, b = _x((6, 4), (2, 4)), _x((4, 10), (4, 5))
    r = nvdispatch.matmul(a, b, epilog="DRELU", epilog_inputs={"relu_aux": mask})
    assert r.chunks == ((2, 2, 2), (5, 5))
    with pytest.raises(errors.ShapeMismatchError, match=r"relu_aux"):
        nvdispatch.matmul(a, _x((4, 10), ((4,), (4, 4, 2))), epilog="DRELU", epilog_inputs={"relu_aux": mask})
    with pytest.raises(errors.UnsupportedOperandError, match=r"^b: "):
        nvdispatch.matmul(a, mask)  # unknown sizes are taken only where a bit mask is expected
