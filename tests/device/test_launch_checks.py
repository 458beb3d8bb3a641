"""Device misuse raises DeviceLaunchError naming the argument (checked under the simulator in CI): a launch
with the wrong block_dim, too little dynamic shared memory, a thread_data or GEMM tile too small."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from numba import cuda

from nvdispatch.device import fft, matmul
from nvdispatch.device.errors import DeviceLaunchError
from nvdispatch.device.simulator_compat import simulator_active
from nvdispatch.errors import InvalidArgumentError, NvdispatchError

pytestmark = pytest.mark.skipif(not simulator_active(), reason="launch checks run on a GPU only in debug mode")

F = fft(fft_type="c2c", size=16, precision=np.float32, direction="forward", ffts_per_block=1,
        elements_per_thread=4, execution="Block")


def _kernel(F, storage):
    ept, stride, value_type = F.elements_per_thread, F.stride, F.value_type

    @cuda.jit
    def kernel(signal):
        thread_data = cuda.local.array(shape=(storage,), dtype=value_type)
        shared_mem = cuda.shared.array(shape=(0,), dtype=value_type)
        n = signal.shape[1]
        for i in range(min(ept, storage)):
            if cuda.threadIdx.x + i * stride < n:
                thread_data[i] = signal[cuda.threadIdx.y, cuda.threadIdx.x + i * stride]
        F(thread_data, shared_mem)
        for i in range(min(ept, storage)):
            if cuda.threadIdx.x + i * stride < n:
                signal[cuda.threadIdx.y, cuda.threadIdx.x + i * stride] = thread_data[i]

    return kernel


def _signal():
    return (np.arange(16) + 1j).astype(np.complex64).reshape(1, 16)


def test_correct_launch_still_matches_numpy():
    x = _signal()
    _kernel(F, F.storage_size)[1, F.block_dim, 0, F.shared_memory_size](x)
    assert np.allclose(x, np.fft.fft(_signal()), atol=1e-3)


@pytest.mark.parametrize("threads", [2, 8])
def test_wrong_block_dim(threads):
    with pytest.raises(DeviceLaunchError) as info:
        _kernel(F, F.storage_size)[1, (threads, 1, 1), 0, F.shared_memory_size](_signal())
    err = info.value
    assert err.argument == "block_dim" and "x == 4" in err.expected and f"blockDim.x = {threads}" in err.got
    assert isinstance(err, InvalidArgumentError) and isinstance(err, ValueError) and isinstance(err, NvdispatchError)


def test_too_many_ffts_per_block():
    with pytest.raises(DeviceLaunchError, match="block_dim: expected y <= ffts_per_block = 1"):
        _kernel(F, F.storage_size)[1, (4, 2, 1), 0, 2 * F.shared_memory_size](np.zeros((2, 16), np.complex64))


@pytest.mark.parametrize("shared", [0, 8])
def test_too_little_shared_memory(shared):
    with pytest.raises(DeviceLaunchError) as info:
        _kernel(F, F.storage_size)[1, F.block_dim, 0, shared](_signal())
    assert info.value.argument == "shared_mem"
    assert str(F.shared_memory_size) in info.value.expected and f"bytes = {shared}" in info.value.got


def test_thread_data_too_small():
    with pytest.raises(DeviceLaunchError) as info:
        _kernel(F, F.storage_size - 1)[1, F.block_dim, 0, F.shared_memory_size](_signal())
    assert info.value.argument == "thread_data" and "storage_size = 4" in info.value.expected


def test_error_survives_pickling():
    err = DeviceLaunchError("tid=[0, 0, 0] ctaid=[0, 0, 0]: block_dim: expected x == 4, got blockDim.x = 2")
    back = pickle.loads(pickle.dumps(err))
    assert (back.argument, back.expected, back.got, str(back)) == (err.argument, err.expected, err.got, str(err))


def test_gemm_wrong_block_dim_and_small_tile():
    MM = matmul(size=(4, 4, 4), precision=np.float64, data_type="real", block_size=16)

    def kernel_for(tile):
        @cuda.jit
        def gemm(c_out):
            sa = cuda.shared.array(shape=(tile, 4), dtype=np.float64)
            sb = cuda.shared.array(shape=(4, 4), dtype=np.float64)
            sc = cuda.shared.array(shape=(4, 4), dtype=np.float64)
            MM(1.0, sa, sb, 0.0, sc)

        return gemm

    with pytest.raises(DeviceLaunchError, match=r"block_dim: expected \(16, 1, 1\)"):
        kernel_for(4)[1, 8](np.zeros((4, 4)))
    with pytest.raises(DeviceLaunchError) as info:
        kernel_for(3)[1, 16](np.zeros((4, 4)))
    assert info.value.argument == "a" and "4 x 4" in info.value.expected
