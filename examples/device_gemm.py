"""A block GEMM inside a Numba CUDA kernel with nvdispatch.device (cuBLASDx-style), one tile per block.

Runs on an NVIDIA GPU, or under Numba's CUDA simulator when no GPU is present.

    python examples/device_gemm.py

Needs: ``pip install 'nvdispatch[numba]'`` (numba and numba-cuda).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys

if __name__ == "__main__":  # before Numba is imported, so that --help works without it
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()


def _has_gpu() -> bool:
    try:
        return ctypes.CDLL("libcuda.so.1").cuInit(0) == 0
    except OSError:
        return False


if not _has_gpu():
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numpy as np  # noqa: E402

try:
    from numba import cuda
except ImportError:
    print(f"skipped: {os.path.basename(__file__)} needs Numba: pip install 'nvdispatch[numba]'")
    sys.exit(0)

from nvdispatch.device import matmul  # noqa: E402

m, n, k = 16, 8, 12
MM = matmul(size=(m, n, k), precision=np.float64, data_type="real", block_size=32, compiler="numba")
a_dim, b_dim, c_dim, block_size = MM.a_dim, MM.b_dim, MM.c_dim, MM.block_size


@cuda.jit(link=MM.files)
def gemm(a, b, c, alpha, beta):
    # Column-major tiles (the default arrangement) are stored transposed: shape (columns, rows).
    sa = cuda.shared.array(shape=(a_dim[1], a_dim[0]), dtype=np.float64)
    sb = cuda.shared.array(shape=(b_dim[1], b_dim[0]), dtype=np.float64)
    sc = cuda.shared.array(shape=(c_dim[1], c_dim[0]), dtype=np.float64)
    t = cuda.threadIdx.x
    for e in range(t, m * k, block_size):
        sa[e // m, e % m] = a[e % m, e // m]
    for e in range(t, k * n, block_size):
        sb[e // k, e % k] = b[e % k, e // k]
    for e in range(t, m * n, block_size):
        sc[e // m, e % m] = c[e % m, e // m]
    cuda.syncthreads()
    MM(alpha, sa, sb, beta, sc)
    cuda.syncthreads()
    for e in range(t, m * n, block_size):
        c[e % m, e // m] = sc[e // m, e % m]


def main() -> None:
    rng = np.random.default_rng(0)
    a, b, c = rng.standard_normal((m, k)), rng.standard_normal((k, n)), rng.standard_normal((m, n))
    c_d = cuda.to_device(c)
    gemm[1, MM.block_dim](cuda.to_device(a), cuda.to_device(b), c_d, 2.0, 0.5)
    error = np.abs(c_d.copy_to_host() - (2.0 * a @ b + 0.5 * c)).max()
    print(f"{MM!r}: max abs error vs numpy {error:.1e}")
    assert error < 1e-12


if __name__ == "__main__":
    main()
