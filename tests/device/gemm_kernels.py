"""A GEMM kernel shared by the simulator and GPU tests: global -> shared -> MM -> global, one tile per block."""

from __future__ import annotations

import numpy as np
from numba import cuda

import nvdispatch.device as device


def storage_shape(shape: tuple[int, int], order: str) -> tuple[int, int]:
    return shape if order == "row_major" else (shape[1], shape[0])


def gemm_kernel(MM: device.Matmul):
    a_shape = storage_shape(MM.a_dim, MM.arrangement[0])
    b_shape = storage_shape(MM.b_dim, MM.arrangement[1])
    c_shape = storage_shape(MM.c_dim, MM.arrangement[2])
    value_type, threads = MM.value_type, MM.block_size
    bx, by = MM.block_dim[0], MM.block_dim[1]

    @cuda.jit(link=MM.files)
    def kernel(a, b, c, alpha, beta, out):
        sa = cuda.shared.array(shape=a_shape, dtype=value_type)
        sb = cuda.shared.array(shape=b_shape, dtype=value_type)
        sc = cuda.shared.array(shape=c_shape, dtype=value_type)
        tile = cuda.blockIdx.x
        tid = cuda.threadIdx.x + cuda.threadIdx.y * bx + cuda.threadIdx.z * bx * by
        for e in range(tid, a_shape[0] * a_shape[1], threads):
            sa[e // a_shape[1], e % a_shape[1]] = a[tile, e // a_shape[1], e % a_shape[1]]
        for e in range(tid, b_shape[0] * b_shape[1], threads):
            sb[e // b_shape[1], e % b_shape[1]] = b[tile, e // b_shape[1], e % b_shape[1]]
        for e in range(tid, c_shape[0] * c_shape[1], threads):
            sc[e // c_shape[1], e % c_shape[1]] = c[tile, e // c_shape[1], e % c_shape[1]]
        cuda.syncthreads()
        MM(alpha, sa, sb, beta, sc)
        cuda.syncthreads()
        for e in range(tid, c_shape[0] * c_shape[1], threads):
            out[tile, e // c_shape[1], e % c_shape[1]] = sc[e // c_shape[1], e % c_shape[1]]

    return kernel


def logical(x: np.ndarray, order: str) -> np.ndarray:
    """Batched storage arrays -> logical matrices."""
    return x if order == "row_major" else np.swapaxes(x, -1, -2)


def run_gemm(MM: device.Matmul, tiles: int, alpha=1.5, beta=-0.5, seed=0):
    rng = np.random.default_rng(seed)
    vt = np.dtype(MM.numpy_value_type)

    def rand(shape):
        x = rng.standard_normal(shape)
        if vt.kind == "c":
            x = x + 1j * rng.standard_normal(shape)
        return x.astype(vt)

    a = rand((tiles, *storage_shape(MM.a_dim, MM.arrangement[0])))
    b = rand((tiles, *storage_shape(MM.b_dim, MM.arrangement[1])))
    c = rand((tiles, *storage_shape(MM.c_dim, MM.arrangement[2])))
    out = cuda.to_device(np.zeros_like(c))
    gemm_kernel(MM)[tiles, MM.block_dim](
        cuda.to_device(a), cuda.to_device(b), cuda.to_device(c), alpha, beta, out
    )
    A, B, C = (logical(x.astype(np.complex128), o) for x, o in zip((a, b, c), MM.arrangement))
    reference = alpha * A @ B + beta * C
    return logical(out.copy_to_host(), MM.arrangement[2]), reference
