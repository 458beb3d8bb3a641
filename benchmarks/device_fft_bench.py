"""Benchmark nvdispatch.device FFT/GEMM in Numba kernels against cuFFTDx/cuBLASDx (nvmath) and cuFFT.

Batched fp32 c2c load -> FFT -> store kernels (in place) for n = 64 ... 4096, and batched block GEMMs
(global -> shared -> GEMM -> global). Times per launch are medians over batches of back-to-back launches
timed with CUDA events, after a warm-up (see time_it); all peers run in this one process. A peer that is
not installed or fails is recorded with the reason and skipped.

Usage: python benchmarks/device_fft_bench.py [--out DIR] [--budget SECONDS] [--suggested-only] [--jobs N]
Writes DIR/device_fft_bench.json and DIR/device_fft_bench.png. Needs an NVIDIA GPU and ``pip install
'nvdispatch[numba]'``; nvmath-python and CuPy are timed when installed. ``--jobs N`` compiles the kernels in N
processes at once (Numba compilation dominates the run time) and then times them one process at a time.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import numpy as np
from _bench import RESULTS, parser, progress, require_numba_gpu

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

try:  # main() says what is missing; the compile workers import this module too
    from numba import cuda

    import nvdispatch.device as device
except ImportError:
    cuda = device = None

SIZES = [64, 128, 256, 512, 1024, 2048, 4096]
ELEMENTS = 1 << 24  # complex elements per batch (128 MiB in place)
REPEATS = 20  # launches per timed batch
BATCHES = 7
WARMUP_S = 0.2


def time_it(launch, synchronize=None, event=None, elapsed=None) -> float:
    """Milliseconds per launch of ``launch()``, measured with CUDA events.

    Warm-up for WARMUP_S seconds of back-to-back launches (clocks settle), then BATCHES batches of REPEATS
    back-to-back launches between two events; the median over batches of the time per launch. Launching a
    batch back to back keeps the queue full, so the host's launch overhead (tens of microseconds per Numba
    launch, comparable to one 0.1 ms kernel) is hidden instead of timed. The defaults time Numba launches;
    ``synchronize``/``event``/``elapsed`` let CuPy calls be timed the same way.
    """
    synchronize = synchronize or cuda.synchronize
    event = event or cuda.event
    elapsed = elapsed or cuda.event_elapsed_time
    end = time.perf_counter() + WARMUP_S
    while time.perf_counter() < end:
        for _ in range(REPEATS):
            launch()
        synchronize()
    times = []
    for _ in range(BATCHES):
        start, stop = event(), event()
        start.record()
        for _ in range(REPEATS):
            launch()
        stop.record()
        stop.synchronize()
        times.append(elapsed(start, stop) / REPEATS)
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


def prepare_fft(F, n, check=True):
    """Compile and check the load -> FFT -> store kernel of ``F``; return (entry without timing, launch)."""
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
    entry = {
        "elements_per_thread": int(F.elements_per_thread),
        "ffts_per_block": int(F.ffts_per_block),
        "batch": batch,
        "shared_bytes": int(F.shared_memory_size),
        "compile_s": round(compile_s, 2),
        "rel_error": error,
        **kernel_resources(kernel),
    }
    return entry, launch


def kernel_resources(kernel) -> dict:
    """Registers and local memory per thread of the compiled kernel (empty if unavailable)."""
    try:
        compiled = next(iter(kernel.overloads.values()))
        return {"registers": int(compiled.regs_per_thread), "local_bytes": int(compiled.local_mem_per_thread)}
    except Exception:  # noqa: BLE001
        return {}


def ours_candidates(n, suggested_only=False):
    """The suggested configuration first, then the other of 8 / 16 elements per thread (128 threads/block)."""
    seen = []
    for ept in ("suggested",) if suggested_only else ("suggested", 8, 16):
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


GEMM_CASES = [
    ((32, 32, 32), "float32"),
    ((64, 64, 64), "float32"),
    ((32, 32, 32), "float64"),
    ((64, 64, 64), "float64"),
]
GEMM_TILES = 132 * 64


def tasks(suggested_only=False, skip_gemm=False) -> list[tuple]:
    """Every kernel to time, as picklable tuples (see prepare_task)."""
    out = []
    for n in SIZES:
        for (ept, fpb), suggested in ours_candidates(n, suggested_only):
            out.append(("fft", "ours", n, ept, fpb, suggested))
        out.append(("fft", "cufftdx", n))
    if not skip_gemm:
        for size, dtype in GEMM_CASES:
            out.append(("gemm", "ours", size, dtype))
            out.append(("gemm", "cublasdx", size, dtype))
    return out


def prepare_task(task):
    """Build the operation of ``task``, compile and check its kernel: (entry, launch, metric)."""
    if task[0] == "fft":
        n = task[2]
        if task[1] == "ours":
            F = device.fft(
                fft_type="c2c",
                size=n,
                precision=np.float32,
                direction="forward",
                execution="Block",
                elements_per_thread=task[3],
                ffts_per_block=task[4],
            )
        else:
            import nvmath.device as nvd

            F = nvd.FFT(
                size=n,
                precision=np.float32,
                fft_type="c2c",
                execution="Block",
                direction="forward",
                ffts_per_block="suggested",
                elements_per_thread="suggested",
            )
        entry, launch = prepare_fft(F, n)
        if task[1] == "ours":
            entry["suggested"] = task[5]
        return entry, launch, lambda ms: {"TBps": 2 * entry["batch"] * n * 8 / (ms * 1e-3) / 1e12}
    size, dtype = task[2], np.dtype(task[3]).type
    if task[1] == "ours":
        MM = device.matmul(size=size, precision=dtype, data_type="real", block_size=256)
    else:
        import nvmath.device as nvd

        MM = nvd.Matmul(
            size=size,
            precision=dtype,
            data_type="real",
            arrangement=("col_major", "col_major", "col_major"),
            execution="Block",
            block_size=256,
        )
    entry, launch = prepare_gemm(MM, size, dtype, GEMM_TILES)
    m, n, k = size
    return entry, launch, lambda ms: {"GFLOPs": 2 * m * n * k * GEMM_TILES / (ms * 1e-3) / 1e9}


def _time_prepared(entry, launch, metric) -> dict:
    ms = time_it(launch)
    return {"ms": ms, **metric(ms), **entry}


def run_tasks(task_list, deadline, jobs=1) -> dict:
    """{task: entry} for every task; with ``jobs`` > 1, kernels compile in that many processes at once and
    are then timed one process at a time (nothing else runs on the GPU while a kernel is timed)."""
    if jobs <= 1:
        results = {}
        for task in progress(task_list, "kernels"):
            results[task] = _run_one(task, deadline)
            print(*task, results[task], flush=True)
        return results
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    shares = [task_list[i::jobs] for i in range(jobs)]
    shares = [share for share in shares if share]
    with context.Manager() as manager:
        found = manager.dict()
        lock, ready = context.Lock(), context.Barrier(len(shares))
        workers = [
            context.Process(target=_worker, args=(share, deadline, lock, ready, found)) for share in shares
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join(max(1.0, deadline - time.time() + 30))
        for w in workers:
            if w.is_alive():
                w.kill()
        results = dict(found)
    for task in task_list:
        results.setdefault(task, {"skipped": "worker did not report (time budget or crash)"})
    return results


def _run_one(task, deadline) -> dict:
    if time.time() > deadline:
        return {"skipped": "time budget"}
    try:
        return _time_prepared(*prepare_task(task))
    except Exception:  # noqa: BLE001
        return {"error": traceback.format_exc()[-1500:]}


def _worker(share, deadline, lock, ready, found):
    prepared = []
    for task in share:
        if time.time() > deadline:
            found[task] = {"skipped": "time budget"}
            continue
        try:
            prepared.append((task, prepare_task(task)))
        except Exception:  # noqa: BLE001
            found[task] = {"error": traceback.format_exc()[-1500:]}
    try:
        ready.wait(max(1.0, deadline - time.time()))
    except Exception:  # noqa: BLE001 - a broken barrier (another worker failed): time anyway, still one at a time
        pass
    with lock:
        for task, (entry, launch, metric) in prepared:
            try:
                found[task] = _time_prepared(entry, launch, metric)
            except Exception:  # noqa: BLE001
                found[task] = {"error": traceback.format_exc()[-1500:]}
            print(*task, found[task], flush=True)


def bench_fft(results, measured, suggested_only=False):
    try:
        import nvmath.device  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        results["peers"]["cufftdx"] = f"unavailable: {exc!r}"
    try:
        import cupy as cp
    except Exception as exc:  # noqa: BLE001
        cp = None
        results["peers"]["cufft"] = f"unavailable: {exc!r}"
    for n in SIZES:
        row = {"n": n, "ours": [], "cufftdx": None, "cufft": None}
        results["fft"].append(row)
        for (ept, fpb), suggested in ours_candidates(n, suggested_only):
            row["ours"].append(measured.get(("fft", "ours", n, ept, fpb, suggested), {"skipped": "not run"}))
        if "cufftdx" not in results["peers"]:
            row["cufftdx"] = measured.get(("fft", "cufftdx", n), {"skipped": "not run"})
        if cp is not None:
            try:
                batch = ELEMENTS // n
                x = cp.asarray(np.ones((batch, n), np.complex64))
                ms = time_it(
                    lambda x=x: cp.fft.fft(x, axis=-1),
                    synchronize=cp.cuda.Device().synchronize,
                    event=cp.cuda.Event,
                    elapsed=cp.cuda.get_elapsed_time,
                )
                row["cufft"] = {"ms": ms, "TBps": 2 * batch * n * 8 / (ms * 1e-3) / 1e12, "batch": batch}
                del x
                cp.get_default_memory_pool().free_all_blocks()
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


def prepare_gemm(MM, size, dtype, tiles):
    """Compile and check the block GEMM kernel of ``MM``; return (entry without timing, launch)."""
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
    return {"rel_error": error, **kernel_resources(kernel)}, launch


def bench_gemm(results, measured):
    try:
        import nvmath.device  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        results["peers"]["cublasdx"] = f"unavailable: {exc!r}"
    for size, dtype in GEMM_CASES:
        row = {"size": size, "precision": dtype, "ours": None, "cublasdx": None}
        row["ours"] = measured.get(("gemm", "ours", size, dtype), {"skipped": "not run"})
        if "cublasdx" not in results["peers"]:
            row["cublasdx"] = measured.get(("gemm", "cublasdx", size, dtype), {"skipped": "not run"})
        results["gemm"].append(row)
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
    ap = parser(__doc__, out=False)
    ap.add_argument("--out", metavar="DIR", default=RESULTS, help="folder for the JSON and the plot")
    ap.add_argument("--budget", type=float, default=300.0, help="seconds before remaining work is skipped")
    ap.add_argument("--skip-gemm", action="store_true")
    ap.add_argument("--suggested-only", action="store_true", help="time only the suggested configuration")
    ap.add_argument(
        "--jobs", type=int, default=1, help="processes compiling kernels at once (timing stays one at a time)"
    )
    args = ap.parse_args()
    require_numba_gpu()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + args.budget
    name = cuda.get_current_device().name
    results = {
        "device": name.decode() if isinstance(name, bytes) else str(name),
        "timing": f"median over {BATCHES} batches of {REPEATS} back-to-back launches, after {WARMUP_S} s warm-up",
        "peers": {},
        "fft": [],
        "gemm": [],
    }
    try:
        measured = run_tasks(tasks(args.suggested_only, args.skip_gemm), deadline, args.jobs)
        bench_fft(results, measured, args.suggested_only)
        if not args.skip_gemm:
            bench_gemm(results, measured)
    finally:
        (out / "device_fft_bench.json").write_text(json.dumps(results, indent=1, default=str))
        try:
            plot(results, out / "device_fft_bench.png")
        except Exception as exc:  # noqa: BLE001
            print("plot failed:", exc)


if __name__ == "__main__":
    main()
