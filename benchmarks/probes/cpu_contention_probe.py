"""Probe: the CPU linear layer's engines alone under each kind of other thread in the process — none (a loop of
the call alone, the BLAS's workers asleep), OpenBLAS's worker still spinning after a bare ``np.matmul``, a thread
busy in compiled code (NumPy sorting with the GIL let go), a thread running pure Python — with what the per-call
look (``_hotpath.running_threads``) saw before each call. Which engine wins under which kind says whether
"another thread running: the BLAS-threaded engine" is the right per-call rule beyond OpenBLAS's own worker.

Run with the tree's src on PYTHONPATH and the extension built; times are medians of ``--calls`` calls per engine
and setting, the engines interleaved call by call.

    python benchmarks/probes/cpu_contention_probe.py --m 8192 --n 1024 --k 256 --calls 15
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import numpy as np

import nvdispatch
from nvdispatch.executors import blas_threads, cpu_contention, numpy_matmul


class _Other:
    """A thread of the given kind for the duration of the block (``none``: nothing)."""

    def __init__(self, kind: str):
        self.kind = kind

    def __enter__(self):
        self.stop = threading.Event()
        x = np.random.default_rng(0).standard_normal(1 << 18)

        def compiled():
            while not self.stop.is_set():
                np.sort(x)

        def python():
            n = 0
            while not self.stop.is_set():
                n += 1

        work = {"compiled": compiled, "python": python}.get(self.kind)
        self.thread = None if work is None else threading.Thread(target=work, daemon=True)
        if self.thread is not None:
            self.thread.start()
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.stop.set()
        if self.thread is not None:
            self.thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=8192)
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--k", type=int, default=256)
    parser.add_argument("--calls", type=int, default=15, help="timed calls per engine and setting")
    parser.add_argument("--engines", nargs="+", default=["tiled", "gemm", "sweep"])
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    a = rng.standard_normal((args.m, args.k), dtype=np.float32)
    b = rng.standard_normal((args.k, args.n), dtype=np.float32)
    bias = rng.standard_normal(args.n, dtype=np.float32)
    problem = nvdispatch.explain(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}).problem
    have = numpy_matmul.candidates(problem)
    calls = {e: numpy_matmul.engine_plan(problem, e).direct for e in args.engines if e in have}
    look = cpu_contention.probe() or (lambda: None)
    print(f"{args.m}x{args.n}x{args.k} float32 RELU_BIAS; ms per call (median), and the calls the look saw busy")
    for kind in ("none", "after np.matmul", "compiled", "python"):
        times = {e: [] for e in calls}
        seen = {e: 0 for e in calls}
        with _Other(kind if kind in ("compiled", "python") else "none"):
            for _ in range(args.calls):
                for engine, direct in calls.items():
                    if kind == "none":
                        blas_threads.let_workers_sleep()
                        direct(a, b, bias)  # (a loop of the call alone: its own call before)
                    elif kind == "after np.matmul":
                        np.matmul(a, b)
                    seen[engine] += bool(look())
                    t0 = time.perf_counter()
                    direct(a, b, bias)
                    times[engine].append(time.perf_counter() - t0)
        row = ", ".join(f"{e} {statistics.median(t) * 1e3:.1f} (busy {seen[e]}/{args.calls})" for e, t in times.items())
        print(f"  {kind:>16}: {row}")


if __name__ == "__main__":
    main()
