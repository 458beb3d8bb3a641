"""Kernels shared by the simulator and GPU tests: load -> FFT -> store in the cuFFTDx data layout."""

from __future__ import annotations

import numpy as np
from numba import cuda

import nvdispatch.device as device


def block_kernel(F: device.FFT):
    """A batched Block-execution kernel: ``out[fft_id] = FFT(inp[fft_id])``."""
    size, ept, stride, fpb = F.size, F.elements_per_thread, F.stride, F.ffts_per_block
    storage_size, value_type, real = F.storage_size, F.value_type, F.precision
    half = size // 2 + 1
    kind = F.fft_type

    @cuda.jit(link=F.files)
    def kernel(inp, out):
        thread_data = cuda.local.array(shape=(storage_size,), dtype=value_type)
        shared_mem = cuda.shared.array(shape=(0,), dtype=value_type)
        fft_id = cuda.blockIdx.x * fpb + cuda.threadIdx.y
        batch = inp.shape[0]
        t = cuda.threadIdx.x
        reals = thread_data.view(real)
        if fft_id < batch:
            for i in range(ept):
                index = t + i * stride
                if kind == "r2c":
                    reals[i] = inp[fft_id, index]
                elif kind == "c2r":
                    if i < storage_size and index < half:
                        thread_data[i] = inp[fft_id, index]
                else:
                    thread_data[i] = inp[fft_id, index]
        F(thread_data, shared_mem)
        if fft_id < batch:
            for i in range(ept):
                index = t + i * stride
                if kind == "c2r":
                    out[fft_id, index] = reals[i]
                elif kind == "r2c":
                    if i < storage_size and index < half:
                        out[fft_id, index] = thread_data[i]
                else:
                    out[fft_id, index] = thread_data[i]

    return kernel


def thread_kernel(F: device.FFT):
    """A batched Thread-execution kernel: thread ``g`` transforms row ``g``."""
    size, storage_size, value_type, real = F.size, F.storage_size, F.value_type, F.precision
    half = size // 2 + 1
    kind = F.fft_type

    @cuda.jit(link=F.files)
    def kernel(inp, out):
        thread_data = cuda.local.array(shape=(storage_size,), dtype=value_type)
        reals = thread_data.view(real)
        g = cuda.grid(1)
        if g >= inp.shape[0]:
            return
        if kind == "r2c":
            for i in range(size):
                reals[i] = inp[g, i]
        elif kind == "c2r":
            for i in range(half):
                thread_data[i] = inp[g, i]
        else:
            for i in range(size):
                thread_data[i] = inp[g, i]
        F(thread_data)
        if kind == "c2r":
            for i in range(size):
                out[g, i] = reals[i]
        elif kind == "r2c":
            for i in range(half):
                out[g, i] = thread_data[i]
        else:
            for i in range(size):
                out[g, i] = thread_data[i]

    return kernel


def make_problem(F: device.FFT, batch: int, seed: int = 0):
    """Random input rows and the NumPy reference output (unnormalised inverse)."""
    rng = np.random.default_rng(seed)
    n, real = F.size, F.precision
    cplx = np.result_type(real, np.complex64)
    if F.fft_type == "r2c":
        x = rng.standard_normal((batch, n)).astype(real)
        return x, np.fft.rfft(x.astype(np.float64), axis=-1), np.zeros((batch, n // 2 + 1), cplx)
    if F.fft_type == "c2r":
        spectrum = np.fft.rfft(rng.standard_normal((batch, n)), axis=-1).astype(cplx)
        return (
            spectrum,
            np.fft.irfft(spectrum.astype(np.complex128), n=n, axis=-1) * n,
            np.zeros((batch, n), real),
        )
    x = (rng.standard_normal((batch, n)) + 1j * rng.standard_normal((batch, n))).astype(cplx)
    ref = np.fft.fft(x, axis=-1) if F.direction == "forward" else np.fft.ifft(x, axis=-1) * n
    return x, ref, np.zeros((batch, n), cplx)


def run_fft(F: device.FFT, batch: int, seed: int = 0):
    """Run ``F`` over ``batch`` rows; return (result, reference)."""
    x, ref, out = make_problem(F, batch, seed)
    x_d, out_d = cuda.to_device(x), cuda.to_device(out)
    if F.execution == "Thread":
        threads = 32
        thread_kernel(F)[(batch + threads - 1) // threads, threads](x_d, out_d)
    else:
        blocks = (batch + F.ffts_per_block - 1) // F.ffts_per_block
        kernel = block_kernel(F)
        if device.needs_opt_in(F.shared_memory_size):  # more than 48 KiB of shared memory
            from numba import typeof

            device.allow_shared_memory(kernel, (typeof(x_d), typeof(out_d)), F.shared_memory_size)
        kernel[blocks, F.block_dim, 0, F.shared_memory_size](x_d, out_d)
    return out_d.copy_to_host(), ref


def relative_error(result, reference) -> float:
    return float(np.abs(result - reference).max() / max(np.abs(reference).max(), 1e-30))


def tolerance(precision) -> float:
    return 2e-5 if precision == np.float32 else 1e-12
