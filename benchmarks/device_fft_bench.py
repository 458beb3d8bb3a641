"""Benchmark nvdispatch.device FFT/GEMM in Numba kernels against cuFFTDx/cuBLASDx (nvmath) and cuFFT.

Batched fp32 c2c load -> FFT -> store kernels (in place) for n = 64 ... 4096, and batched block GEMMs
(global -> shared -> GEMM -> global). Times are medians of CUDA-event timings; all peers run in this one
process. A peer that is not installed or fails is recorded with the reason and skipped.

Usage: python benchmarks/device_fft_bench.py --out DIR [--budget SECONDS]
Writes DIR/device_fft_bench.json and DIR/device_fft_bench.png.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from numba import cuda  # noqa: E402

import nvdispatch.device as device  # noqa: E402

SIZES = [64, 128, 256, 512, 1024, 2048, 4096]
ELEMENTS = 1 << 24  # complex elements per batch (128 MiB in place)
REPEATS = 20


def time_it(launch, repeats=REPEATS, events=None) -> float:
    """Median milliseconds of ``launch()`` measured with CUDA events."""
    launch()
    cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = cuda.event(), cuda.event()
        start.record()
        launch()
        stop.record()
        stop.synchronize()
        times.append(cuda.event_elapsed_time(start, stop))
    return float(np.median(times))


def fft_kernel(F, value_type):
    storage_size, ept, stride, fpb = F.storage_size, F.elements_per_thread, F.stride, F.ffts_per_block

    files = getattr(F, "files", None)

    @cuda.jit(link=files) if files else cuda.jit
    def kernel(data):
        thread_data = cuda.local.array(shape=(storage_size,), dtype=value_type)
        shared_mem = cuda.shared.array(shape=(0,), dtype=value_type)
        fft_id = cuda.blockIdx.x * fpb + cuda.threadIdx.y
        index = cuda.threadIdx.x
        for i in range(ept):
            thread_data[i] = data[fft_id, index + i * stride]
        F.execute(thread_data, shared_mem)  # nvmath 1.0's FFT objects are not callable, only .execute
        for i in range(ept):
            data[fft_id, index + i * stride] = thread_data[i]

    return kernel


def measure_fft(F, n, check=True) -> dict:
    batch = ELEMENTS // n
    batch -= batch % F.ffts_per_block
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((batch, n)) + 1j * rng.standard_normal((batch, n))).astype(np.complex64)
    data = cuda.to_device(x)
    t0 = time.time()
    kernel = fft_kernel(F, F.value_type)
    grid = batch // F.ffts_per_block
    block = tuple(F.block_dim)
    launch = lambda: kernel[grid, block, 0, F.shared_memory_size](data)  # noqa: E731
    launch()
    cuda.synchronize()
    compile_s = time.time() - t0
    error = None
    if check:
        data.copy_to_device(x)
        launch()
        got = data.copy_to_host()[:64]
        ref = np.fft.fft(x[:64].astype(np.complex128), axis=-1)
        error = float(np.abs(got - ref).max() / np.abs(ref).max())
    ms = time_it(launch)
    return {
        "ms": ms,
        "TBps": 2 * batch * n * 8 / (ms * 1e-3) / 1e12,
        "elements_per_thread": int(F.elements_per_thread),
        "ffts_per_block": int(F.ffts_per_block),
        "batch": batch,
        "compile_s": round(compile_s, 2),
        "rel_error": error,
    }


def ours_candidates(n):
    """The suggested configuration first, then the other of 8 / 16 elements per thread (128 threads/block)."""
    seen = []
    for ept in ("suggested", 8, 16):
        try:
            F = device.fft(
                fft_type="c2c", size=n, precision=np.float32, direction="forward", elements_per_thread=ept
            )
        except device.DeviceConfigurationError:
            continue
        key = (F.elements_per_thread, F.ffts_per_block)
        if key not in [s[0] for s in seen]:
            seen.append((key, ept == "suggested"))
    return seen


def bench_fft(results, deadline):
    try:
        import nvmath.device as nvd
    except Exception as exc:  # noqa: BLE001
        nvd = None
        results["peers"]["cufftdx"] = f"unavailable: {exc!r}"
    try:
        import cupy as cp
    except Exception as exc:  # noqa: BLE001
        cp = None
        results["peers"]["cufft"] = f"unavailable: {exc!r}"
    for n in SIZES:
        row = {"n": n, "ours": [], "cufftdx": None, "cufft": None}
        results["fft"].append(row)
        for (ept, fpb), suggested in ours_candidates(n):
            if time.time() > deadline:
                row["ours"].append({"skipped": "time budget"})
                break
            try:
                F = device.fft(
                    fft_type="c2c",
                    size=n,
                    precision=np.float32,
                    direction="forward",
                    execution="Block",
                    elements_per_thread=ept,
                    ffts_per_block=fpb,
                )
                entry = measure_fft(F, n)
                entry["suggested"] = suggested
                row["ours"].append(entry)
            except Exception as exc:  # noqa: BLE001
                row["ours"].append({"error": repr(exc)[:500]})
            print(n, row["ours"][-1], flush=True)
        if nvd is not None and time.time() < deadline:
            try:
                F = nvd.FFT(
                    size=n,
                    precision=np.float32,
                    fft_type="c2c",
                    execution="Block",
                    direction="forward",
                    ffts_per_block="suggested",
                    elements_per_thread="suggested",
                )
                row["cufftdx"] = measure_fft(F, n)
            except Exception:  # noqa: BLE001
                row["cufftdx"] = {"error": traceback.format_exc()[-1500:]}
            print(n, "cufftdx", row["cufftdx"], flush=True)
        if cp is not None:
            try:
                batch = ELEMENTS // n
                x = cp.asarray(np.ones((batch, n), np.complex64))
                cp.fft.fft(x, axis=-1)
                start, stop = cp.cuda.Event(), cp.cuda.Event()
                times = []
                for _ in range(REPEATS):
                    start.record()
                    cp.fft.fft(x, axis=-1)
                    stop.record()
                    stop.synchronize()
                    times.append(cp.cuda.get_elapsed_time(start, stop))
                ms = float(np.median(times))
                row["cufft"] = {"ms": ms, "TBps": 2 * batch * n * 8 / (ms * 1e-3) / 1e12, "batch": batch}
            except Exception as exc:  # noqa: BLE001
                row["cufft"] = {"error": repr(exc)[:500]}
            print(n, "cufft", row["cufft"], flush=True)


def gemm_kernel(MM, value_type, call_style):
    m, n, k = MM.size if hasattr(MM, "size") and len(MM.size) == 3 else (MM.m, MM.n, MM.k)
    threads = int(np.prod(tuple(MM.block_dim)))
    a_shape, b_shape, c_shape = (k, m), (n, k), (n, m)  # column-major tiles stored transposed

    @cuda.jit
    def kernel(a, b, c, alpha, beta, out):
        sa = cuda.shared.array(shape=a_shape, dtype=value_type)
        sb = cuda.shared.array(shape=b_shape, dtype=value_type)
        sc = cuda.shared.array(shape=c_shape, dtype=value_type)
        tile = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        for e in range(tid, k * m, threads):
            sa[e // m, e % m] = a[tile, e // m, e % m]
        for e in range(tid, n * k, threads):
            sb[e // k, e % k] = b[tile, e // k, e % k]
        for e in range(tid, n * m, threads):
            sc[e // m, e % m] = c[tile, e // m, e % m]
        cuda.syncthreads()
        MM.execute(alpha, sa, sb, beta, sc)
        cuda.syncthreads()
        for e in range(tid, n * m, threads):
            out[tile, e // m, e % m] = sc[e // m, e % m]

    return kernel


def measure_gemm(MM, size, dtype, tiles) -> dict:
    m, n, k = size
    rng = np.random.default_rng(0)
    a = rng.standard_normal((tiles, k, m)).astype(dtype)
    b = rng.standard_normal((tiles, n, k)).astype(dtype)
    c = rng.standard_normal((tiles, n, m)).astype(dtype)
    ad, bd, cd, od = (cuda.to_device(v) for v in (a, b, c, np.zeros_like(c)))
    kernel = gemm_kernel(MM, MM.value_type if hasattr(MM, "value_type") else dtype, None)
    launch = lambda: kernel[tiles, tuple(MM.block_dim)](ad, bd, cd, 1.0, 0.5, od)  # noqa: E731
    launch()
    cuda.synchronize()
    got = od.copy_to_host()[:4]
    ref = 1.0 * np.swapaxes(np.swapaxes(a[:4], 1, 2) @ np.swapaxes(b[:4], 1, 2), 1, 2) + 0.5 * c[:4]
    error = float(np.abs(got - ref).max() / np.abs(ref).max())
    ms = time_it(launch)
    return {"ms": ms, "GFLOPs": 2 * m * n * k * tiles / (ms * 1e-3) / 1e9, "rel_error": error}


def bench_gemm(results, deadline):
    try:
        import nvmath.device as nvd
    except Exception as exc:  # noqa: BLE001
        nvd = None
        results["peers"]["cublasdx"] = f"unavailable: {exc!r}"
    for size, dtype in [
        ((32, 32, 32), np.float32),
        ((64, 64, 64), np.float32),
        ((32, 32, 32), np.float64),
        ((64, 64, 64), np.float64),
    ]:
        if time.time() > deadline:
            break
        tiles = 132 * 64
        row = {"size": size, "precision": np.dtype(dtype).name, "ours": None, "cublasdx": None}
        results["gemm"].append(row)
        try:
            MM = device.matmul(size=size, precision=dtype, data_type="real", block_size=256)
            row["ours"] = measure_gemm(MM, size, dtype, tiles)
        except Exception:  # noqa: BLE001
            row["ours"] = {"error": traceback.format_exc()[-1500:]}
        if nvd is not None:
            try:
                MM = nvd.Matmul(
                    size=size,
                    precision=dtype,
                    data_type="real",
                    arrangement=("col_major", "col_major", "col_major"),
                    execution="Block",
                    block_size=256,
                )
                row["cublasdx"] = measure_gemm(MM, size, dtype, tiles)
            except Exception:  # noqa: BLE001
                row["cublasdx"] = {"error": traceback.format_exc()[-1500:]}
        print("gemm", row, flush=True)


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ns = [r["n"] for r in results["fft"]]

    def best(entries):
        ok = [e["TBps"] for e in entries if isinstance(e, dict) and "TBps" in e]
        return max(ok) if ok else np.nan

    ax.plot(ns, [best(r["ours"]) for r in results["fft"]], "o-", label="nvdispatch.device (Numba)")
    ax.plot(ns, [best([r["cufftdx"]]) for r in results["fft"]], "s-", label="cuFFTDx (nvmath 1.0)")
    ax.plot(ns, [best([r["cufft"]]) for r in results["fft"]], "^-", label="cuFFT (CuPy)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("FFT size n (fp32 c2c, batched, 128 MiB in place)")
    ax.set_ylabel("TB/s (read + write)")
    ax.set_title("Device FFT throughput on " + results.get("device", "GPU"))
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="benchmarks")
    parser.add_argument(
        "--budget", type=float, default=300.0, help="seconds before remaining work is skipped"
    )
    parser.add_argument("--skip-gemm", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + args.budget
    results = {
        "device": cuda.get_current_device().name.decode()
        if isinstance(cuda.get_current_device().name, bytes)
        else str(cuda.get_current_device().name),
        "peers": {},
        "fft": [],
        "gemm": [],
    }
    try:
        bench_fft(results, deadline - (60 if not args.skip_gemm else 0))
        if not args.skip_gemm:
            bench_gemm(results, deadline)
    finally:
        (out / "device_fft_bench.json").write_text(json.dumps(results, indent=1, default=str))
        try:
            plot(results, out / "device_fft_bench.png")
        except Exception as exc:  # noqa: BLE001
            print("plot failed:", exc)


if __name__ == "__main__":
    main()
