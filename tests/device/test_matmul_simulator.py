"""Device GEMM against NumPy under Numba's CUDA simulator (one or two tiles per launch)."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch.device as device

from .gemm_kernels import run_gemm

CASES = [
    # size, precision, data_type, arrangement, block
    ((8, 8, 4), np.float32, "real", ("col_major", "col_major", "col_major"), {"block_size": 16}),
    ((6, 10, 3), np.float64, "real", ("row_major", "col_major", "row_major"), {"block_size": 8}),
    ((5, 7, 6), np.float32, "complex", ("col_major", "row_major", "col_major"), {"block_dim": (4, 2)}),
    ((4, 4, 8), np.float64, "complex", ("row_major", "row_major", "row_major"), {"block_size": 32}),
]


@pytest.mark.parametrize("size,precision,data_type,arrangement,block", CASES)
def test_matmul_matches_numpy(size, precision, data_type, arrangement, block):
    MM = device.matmul(
        size=size,
        precision=precision,
        data_type=data_type,
        arrangement=arrangement,
        compiler="numba",
        **block,
    )
    result, reference = run_gemm(MM, tiles=2)
    tol = 1e-5 if precision == np.float32 else 1e-12
    assert np.abs(result - reference).max() / np.abs(reference).max() < tol


def test_matmul_attributes():
    MM = device.Matmul(size=(32, 16, 8), precision="float64", data_type="complex", block_dim=(32, 2))
    assert MM.a_dim == (32, 8) and MM.b_dim == (8, 16) and MM.c_dim == (32, 16)
    assert MM.block_dim == device.Dim3(32, 2, 1) and MM.block_size == 64
    assert MM.shared_memory_size == (32 * 8 + 8 * 16 + 32 * 16) * 16
    assert str(MM.value_type) == "complex128"
