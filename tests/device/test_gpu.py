"""The device FFT and GEMM on a real GPU: many blocks, large batches (skipped without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch.device as device

from .fft_kernels import relative_error, run_fft, tolerance
from .gemm_kernels import run_gemm
from .test_fft_simulator import (
    test_nvmath_style_kernel_reads_every_knob_from_the_object as nvmath_style_kernel,
)
from .test_fft_simulator import test_seed_kernel_runs_unchanged as seed_kernel

pytestmark = pytest.mark.gpu

POWERS_OF_TWO = [2**p for p in range(1, 13)]


def test_seed_kernel_on_gpu():
    seed_kernel()


def test_nvmath_style_kernel_on_gpu():
    nvmath_style_kernel()


@pytest.mark.parametrize("size", POWERS_OF_TWO + [96, 243, 1000, 2401])
def test_c2c_block_suggested_large_batch(size):
    F = device.fft(fft_type="c2c", size=size, precision=np.float32, direction="forward", execution="Block")
    result, reference = run_fft(F, batch=4099)
    assert relative_error(result, reference) < tolerance(np.float32)


@pytest.mark.parametrize("kind,direction", [("c2c", "inverse"), ("r2c", "forward"), ("c2r", "inverse")])
@pytest.mark.parametrize(
    "size,precision",
    [(128, np.float32), (4096, np.float32), (360, np.float64), (4096, np.float64), (16384, np.float32), (8192, np.float32)],
)
def test_block_all_types(kind, direction, size, precision):
    F = device.FFT(size, precision, kind, "Block", direction=direction)
    result, reference = run_fft(F, batch=1001)
    assert relative_error(result, reference) < tolerance(precision)


@pytest.mark.parametrize("kind,direction", [("c2c", "forward"), ("r2c", "forward"), ("c2r", "inverse")])
@pytest.mark.parametrize("size", [8, 35, 64])
def test_thread_execution(kind, direction, size):
    F = device.FFT(size, np.float32, kind, "Thread", direction=direction)
    result, reference = run_fft(F, batch=10000)
    assert relative_error(result, reference) < tolerance(np.float32)


@pytest.mark.parametrize(
    "size,precision,data_type",
    [
        ((32, 32, 32), np.float32, "real"),
        ((64, 64, 32), np.float64, "real"),
        ((16, 16, 16), np.float32, "complex"),
    ],
)
def test_matmul_many_tiles(size, precision, data_type):
    MM = device.matmul(size=size, precision=precision, data_type=data_type, block_size=128)
    result, reference = run_gemm(MM, tiles=500)
    tol = 1e-4 if precision == np.float32 else 1e-12
    assert np.abs(result - reference).max() / np.abs(reference).max() < tol
