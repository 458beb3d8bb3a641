"""Device FFT against numpy.fft, run under Numba's CUDA simulator in CI (tiny launches)."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

import nvdispatch.device as device
from nvdispatch.device import fft

from .fft_kernels import relative_error, run_fft, tolerance

KINDS = [("c2c", "forward"), ("c2c", "inverse"), ("r2c", "forward"), ("c2r", "inverse")]
# (size, elements_per_thread, ffts_per_block): few threads per block, every radix and the pad path.
BLOCK_CASES = [
    (2, 2, 2),
    (8, 2, 1),
    (16, 4, 2),
    (12, 6, 1),
    (64, 8, 1),
    (60, 30, 1),
    (105, 105, 1),
    (256, 16, 1),
]
THREAD_SIZES = [2, 7, 16, 30]


def test_seed_kernel_runs_unchanged():
    batch_size = 2
    ffts_per_block = 1
    FFT_fwd = fft(
        fft_type="c2c",
        size=128,
        precision=np.float32,
        direction="forward",
        ffts_per_block=1,
        elements_per_thread=2,
        execution="Block",
        compiler="numba",
    )
    FFT_inv = fft(
        fft_type="c2c",
        size=128,
        precision=np.float32,
        direction="inverse",
        ffts_per_block=1,
        elements_per_thread=2,
        execution="Block",
        compiler="numba",
    )
    value_type, storage_size = FFT_fwd.value_type, FFT_fwd.storage_size
    shared_memory_size, block_dim = FFT_fwd.shared_memory_size, FFT_fwd.block_dim

    @cuda.jit(link=FFT_fwd.files + FFT_inv.files)
    def apply_filter(signal, filter_kernel):
        thread_data = cuda.local.array(shape=(storage_size,), dtype=value_type)
        shared_mem = cuda.shared.array(shape=(0,), dtype=value_type)
        fft_id = cuda.blockIdx.x * ffts_per_block + cuda.threadIdx.y
        if fft_id >= batch_size:
            return
        offset = cuda.threadIdx.x
        for i in range(FFT_fwd.elements_per_thread):
            thread_data[i] = signal[fft_id, offset + i * FFT_fwd.stride]
        FFT_fwd(thread_data, shared_mem)
        for i in range(FFT_fwd.elements_per_thread):
            thread_data[i] = thread_data[i] * filter_kernel[fft_id, offset + i * FFT_fwd.stride]
        FFT_inv(thread_data, shared_mem)
        for i in range(FFT_fwd.elements_per_thread):
            signal[fft_id, offset + i * FFT_fwd.stride] = thread_data[i]

    rng = np.random.default_rng(1)
    shape = (batch_size, 128)
    x = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)
    h = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)
    data_d, filter_d = cuda.to_device(x), cuda.to_device(h)
    apply_filter[batch_size, block_dim, 0, shared_memory_size](data_d, filter_d)
    result = data_d.copy_to_host()
    reference = np.fft.ifft(np.fft.fft(x, axis=-1) * h, axis=-1) * 128
    assert relative_error(result, reference) < 1e-5


@pytest.mark.parametrize("kind,direction", KINDS)
@pytest.mark.parametrize("size,ept,fpb", BLOCK_CASES)
def test_block_fft_matches_numpy(kind, direction, size, ept, fpb):
    F = device.FFT(
        size, np.float32, kind, "Block", direction=direction, elements_per_thread=ept, ffts_per_block=fpb
    )
    result, reference = run_fft(F, batch=fpb + 1)
    assert relative_error(result, reference) < tolerance(np.float32)


@pytest.mark.parametrize("kind,direction", KINDS)
@pytest.mark.parametrize("size", THREAD_SIZES)
def test_thread_fft_matches_numpy(kind, direction, size):
    F = device.FFT(size, np.float64, kind, "Thread", direction=direction)
    result, reference = run_fft(F, batch=3)
    assert relative_error(result, reference) < tolerance(np.float64)


@pytest.mark.parametrize("kind,direction", KINDS)
def test_block_fft_double_precision(kind, direction):
    F = device.FFT(
        48, np.float64, kind, "Block", direction=direction, elements_per_thread=6, ffts_per_block=1
    )
    result, reference = run_fft(F, batch=1)
    assert relative_error(result, reference) < tolerance(np.float64)


def test_class_style_execute_with_suggested_knobs():
    F = device.FFT(size=32, precision=np.float32, fft_type="c2c", execution="Block", direction="inverse")
    assert F.elements_per_thread in F.valid("elements_per_thread")
    F_small = device.FFT(
        size=32,
        precision=np.float32,
        fft_type="c2c",
        execution="Block",
        direction="inverse",
        elements_per_thread=8,
        ffts_per_block="suggested",
    )
    storage_size, value_type, stride = F_small.storage_size, F_small.value_type, F_small.stride

    @cuda.jit(link=F_small.files)
    def kernel(data):
        thread_data = cuda.local.array(shape=(storage_size,), dtype=value_type)
        shared_mem = cuda.shared.array(shape=(0,), dtype=value_type)
        row = cuda.threadIdx.y
        for i in range(F_small.elements_per_thread):
            thread_data[i] = data[row, cuda.threadIdx.x + i * stride]
        F_small.execute(thread_data, shared_mem)
        for i in range(F_small.elements_per_thread):
            data[row, cuda.threadIdx.x + i * stride] = thread_data[i]

    rng = np.random.default_rng(2)
    x = (rng.standard_normal((F_small.ffts_per_block, 32)) * (1 + 1j)).astype(np.complex64)
    data_d = cuda.to_device(x)
    kernel[1, F_small.block_dim, 0, F_small.shared_memory_size](data_d)
    assert relative_error(data_d.copy_to_host(), np.fft.ifft(x, axis=-1) * 32) < 2e-5


@pytest.mark.parametrize("kind,direction", [("c2c", "forward"), ("c2r", "inverse")])
def test_block_fft_one_shared_plane_when_two_exceed_48k(kind, direction):
    F = device.FFT(4096, np.float64, kind, "Block", direction=direction, elements_per_thread=32)
    assert F.shared_memory_size <= 48 * 1024  # real and imaginary parts exchanged one after the other
    result, reference = run_fft(F, batch=1)
    assert relative_error(result, reference) < tolerance(np.float64)


@pytest.mark.parametrize(
    "size,precision,kind,direction",
    [
        (512, np.float32, "c2c", "forward"),
        (2048, np.float32, "c2c", "inverse"),
        (4096, np.float32, "c2c", "forward"),
        (4096, np.float64, "c2c", "forward"),
        (16384, np.float32, "c2c", "inverse"),  # more than 48 KiB of shared memory
        (8192, np.float32, "c2r", "inverse"),
        (1024, np.float32, "r2c", "forward"),
        (1024, np.float32, "c2r", "inverse"),
    ],
)
# The kernel leaves the storage slots it does not load uninitialised, as they are on a GPU: the simulator's
# arithmetic on that garbage may overflow (RuntimeWarnings), and the results, checked here, must not depend on it.
@pytest.mark.filterwarnings("ignore:.*(overflow|invalid value) encountered:RuntimeWarning")
def test_suggested_configuration_of_large_sizes(size, precision, kind, direction):
    F = device.FFT(size, precision, kind, "Block", direction=direction)
    assert F.shared_memory_size % (2 * np.dtype(precision).itemsize) == 0  # whole value_type elements
    result, reference = run_fft(F, batch=1)
    assert relative_error(result, reference) < tolerance(precision)


def test_nvmath_style_kernel_reads_every_knob_from_the_object():
    fft_r2c = device.FFT(
        fft_type="r2c",
        size=128,
        precision=np.float32,
        elements_per_thread=8,
        ffts_per_block=2,
        execution="Block",
    )

    @cuda.jit
    def kernel(inp, out):
        thread_data = cuda.local.array(shape=(fft_r2c.storage_size,), dtype=fft_r2c.value_type)
        reals = thread_data.view(np.float32)
        shared_mem = cuda.shared.array(shape=(0,), dtype=fft_r2c.value_type)
        row = cuda.threadIdx.y
        index = cuda.threadIdx.x
        for i in range(fft_r2c.elements_per_thread):
            if index < fft_r2c.size:
                reals[i] = inp[row, index]
            index += fft_r2c.stride
        fft_r2c(thread_data, shared_mem)
        index = cuda.threadIdx.x
        for i in range(fft_r2c.elements_per_thread):
            if index < fft_r2c.size // 2 + 1:
                out[row, index] = thread_data[i]
            index += fft_r2c.stride

    x = np.random.default_rng(3).standard_normal((2, 128)).astype(np.float32)
    out = cuda.to_device(np.zeros((2, 65), np.complex64))
    kernel[1, fft_r2c.block_dim, 0, fft_r2c.shared_memory_size](cuda.to_device(x), out)
    assert relative_error(out.copy_to_host(), np.fft.rfft(x, axis=-1)) < 2e-5


@pytest.mark.parametrize("kind,direction", KINDS)
def test_double_buffered_exchanges_need_one_barrier_each(kind, direction):
    F = device.FFT(
        64, np.float32, kind, "Block", direction=direction, elements_per_thread=4, ffts_per_block=2
    )
    config = F._config
    assert config.regions == 2 and config.exchanges >= 2
    # one barrier on entry (the caller may have used the shared memory), then one per exchange
    assert F.source.count("cuda.syncthreads()") == config.exchanges + 1
    result, reference = run_fft(F, batch=5)
    assert relative_error(result, reference) < tolerance(np.float32)


def test_one_region_when_two_exceed_48k():
    F = device.FFT(4096, np.float32, "c2c", "Block", direction="forward", elements_per_thread=16)
    config = F._config
    assert config.regions == 1 and F.shared_memory_size <= 48 * 1024
    assert F.source.count("cuda.syncthreads()") == 2 * config.exchanges


@pytest.mark.parametrize("ffts_per_block, regions", [(1, 2), (2, 1)])
def test_two_regions_for_one_fft_per_block_or_a_small_block(ffts_per_block, regions):
    F = device.FFT(
        1024, np.float32, "c2c", "Block", direction="forward", elements_per_thread=16, ffts_per_block=ffts_per_block
    )
    assert F._config.regions == regions
