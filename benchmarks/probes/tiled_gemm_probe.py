"""Probe: a blocked float32 GEMM with the bias + RELU epilog applied per register tile (tiled_gemm_probe.c),
against ``np.matmul`` (NumPy's BLAS) alone and ``np.matmul`` + a bias/RELU sweep, on one and on all cores.

Run with the tree's src on PYTHONPATH (for NumPy's BLAS thread control). Compiles the C prototype with the
system's ``cc`` into a temporary folder, loads it with ctypes and times each variant interleaved, per round
(median of ``--rounds``). x86-64 with AVX-512F only (the prototype's kernel); ``PROBE_SHIFT=1`` starts the column
panels on the result's cache lines.

    python benchmarks/probes/tiled_gemm_probe.py --m 8192 --k 256 --n 1024 --rounds 15
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import subprocess
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def build(mr: int) -> ctypes.CDLL:
    out = os.path.join(tempfile.mkdtemp(prefix="tiled_probe_"), f"tiled_{mr}.so")
    src = os.path.join(HERE, "tiled_gemm_probe.c")
    subprocess.run(["cc", "-O3", "-shared", "-fPIC", "-pthread", f"-DMR={mr}", src, "-o", out], check=True)
    lib = ctypes.CDLL(out)
    f = lib.tiled_sgemm
    P, L = ctypes.c_void_p, ctypes.c_long
    f.argtypes = [P, L, P, L, P, L, L, L, L, P, ctypes.c_float, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return lib


def aligned_empty(shape, dtype=np.float32, align=64):
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(nbytes + align, np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off : off + nbytes].view(dtype).reshape(shape)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, default=8192)
    ap.add_argument("--k", type=int, default=256)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--mr", type=int, default=14, help="micro-tile rows (the kernel is MR x 32)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    from nvdispatch.executors.blas_threads import let_workers_sleep, single_threaded

    lib = build(args.mr)
    rng = np.random.default_rng(0)
    m, k, n = args.m, args.k, args.n
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    flops = 2.0 * m * n * k

    kept = {True: aligned_empty((m, n)), False: np.empty((m, n), np.float32)}

    def tiled(threads, nt, aligned=True, pre=False):
        def run():
            if pre:
                c = kept[aligned]
            else:
                c = aligned_empty((m, n)) if aligned else np.empty((m, n), np.float32)
            lib.tiled_sgemm(
                a.ctypes.data, k, b.ctypes.data, n, c.ctypes.data, n, m, n, k, bias.ctypes.data, 1.0, 1, threads, nt
            )
            return c

        return run

    def npmm(threads, sweep):
        def run():
            with single_threaded() if threads == 1 else contextlib.nullcontext():
                c = np.matmul(a, b)
                if sweep:
                    c += bias
                    np.maximum(c, 0, out=c)
            return c

        return run

    ref = np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias, 0)
    variants = {}
    for t in sorted({1, args.threads}):
        variants[f"np.matmul t{t}"] = npmm(t, False)
        variants[f"np.matmul+ufuncs t{t}"] = npmm(t, True)
        variants[f"tiled t{t}"] = tiled(t, 0)
        variants[f"tiled nt t{t}"] = tiled(t, 1)
        variants[f"tiled unaligned t{t}"] = tiled(t, 0, aligned=False)
        variants[f"tiled pre t{t}"] = tiled(t, 0, pre=True)
        variants[f"tiled pre unaligned t{t}"] = tiled(t, 0, aligned=False, pre=True)
    for name, f in variants.items():
        if name.startswith("np.matmul t"):
            continue
        err = np.abs(f() - ref).max() / np.abs(ref).max()
        assert err < 1e-5, (name, err)
    times = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, f in variants.items():
            let_workers_sleep()
            t0 = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t0)
    for name, ts in times.items():
        med = float(np.median(ts))
        print(f"{name:28s} {med * 1e3:8.2f} ms  {flops / med / 1e9:7.1f} GFLOP/s")


if __name__ == "__main__":
    main()
