"""FFT convolution inside a Numba CUDA kernel with nvdispatch.device (cuFFTDx-style block FFT).

Runs on an NVIDIA GPU, or anywhere under Numba's CUDA simulator: without a GPU this script switches the
simulator on itself (set NUMBA_ENABLE_CUDASIM before numba is imported to choose explicitly).

    python examples/device_fft_convolution.py

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

from nvdispatch.device import fft  # noqa: E402

size, batch_size, ffts_per_block = 128, 4, 2
FFT_fwd = fft(fft_type="c2c", size=size, precision=np.float32, direction="forward",
              ffts_per_block=ffts_per_block, elements_per_thread=8, execution="Block", compiler="numba")
FFT_inv = fft(fft_type="c2c", size=size, precision=np.float32, direction="inverse",
              ffts_per_block=ffts_per_block, elements_per_thread=8, execution="Block", compiler="numba")
value_type, storage_size = FFT_fwd.value_type, FFT_fwd.storage_size
shared_memory_size, block_dim = FFT_fwd.shared_memory_size, FFT_fwd.block_dim


@cuda.jit(link=FFT_fwd.files + FFT_inv.files)
def apply_filter(signal, filter_kernel):
    thread_data = cuda.local.array(shape=(storage_size,), dtype=value_type)
    shared_mem = cuda.shared.array(shape=(0,), dtype=value_type)
    fft_id = cuda.blockIdx.x * ffts_per_block + cuda.threadIdx.y
    offset = cuda.threadIdx.x
    for i in range(FFT_fwd.elements_per_thread):
        thread_data[i] = signal[fft_id, offset + i * FFT_fwd.stride]
    FFT_fwd(thread_data, shared_mem)
    for i in range(FFT_fwd.elements_per_thread):
        thread_data[i] = thread_data[i] * filter_kernel[fft_id, offset + i * FFT_fwd.stride]
    FFT_inv(thread_data, shared_mem)
    for i in range(FFT_fwd.elements_per_thread):
        signal[fft_id, offset + i * FFT_fwd.stride] = thread_data[i] / size  # cuFFTDx: unnormalised inverse


def main() -> None:
    rng = np.random.default_rng(0)
    signal = (rng.standard_normal((batch_size, size)) + 1j * rng.standard_normal((batch_size, size)))
    signal = signal.astype(np.complex64)
    response = np.fft.fft(np.exp(-np.arange(size) / 4.0)).astype(np.complex64)  # a causal smoothing filter
    filters = np.broadcast_to(response, (batch_size, size)).copy()
    data_d, filter_d = cuda.to_device(signal), cuda.to_device(filters)
    apply_filter[batch_size // ffts_per_block, block_dim, 0, shared_memory_size](data_d, filter_d)
    result = data_d.copy_to_host()
    reference = np.fft.ifft(np.fft.fft(signal, axis=-1) * filters, axis=-1)
    error = np.abs(result - reference).max() / np.abs(reference).max()
    where = "the CUDA simulator" if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" else "the GPU"
    print(f"{FFT_fwd!r}\nblock_dim={tuple(block_dim)}, shared memory {shared_memory_size} B, ran on {where}")
    print(f"max relative error vs numpy.fft: {error:.2e}")
    assert error < 1e-5


if __name__ == "__main__":
    main()
