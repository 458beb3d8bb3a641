"""Dask benchmark: nvdispatch on Dask arrays vs dask.array's own expressions, same run, medians over repeats.

CPU (default): a ``distributed.LocalCluster`` of 2 worker processes (1 thread each), operands persisted on the
workers, each timing a ``persist()`` + ``wait()`` of the result (nothing gathered to the client):

* fused RELU_BIAS matmul, 16384×4096 @ 4096×1024 fp32, a and b in 4×4 blocks (K chunked in 4), vs
  ``da.maximum(a @ b + bias, 0)``; goal ≤ 0.8×. The same with the result 16× larger (16384×1024 @ 1024×4096,
  K in 4 chunks), where nvdispatch concatenates K per block instead of tree-reducing it, timed also with the
  K tree forced (``array.chunk-size`` below the panels);
* fft2 of an 8192×8192 complex64 array in 4×4 blocks: ``nvdispatch.fft.fftn`` (pencil stages, no user
  action) vs ``da.fft.fft2`` after the hand rechunk it needs (both axes whole); goal ≤ 1.0×. The hand-written
  pencil (``da.fft.fft`` along one axis, rechunk, along the other) is timed too, for reference.

GPU (``--gpu``): the same on CuPy chunks on one GPU (synchronous scheduler, or ``--scheduler cuda-cluster``
for a one-GPU ``dask_cuda.LocalCUDACluster``), against the single-array nvdispatch call on the same data;
goal ≤ 1.1×.

    python benchmarks/dask_bench.py [--repeats 5] [--quick] [--only matmul|fft] [--gpu]
                                    [--scheduler sync|cuda-cluster] [--out DIR]

Writes ``DIR/dask_bench[_gpu][_matmul|_fft].json`` and ``.png``. On the CPU cluster each case also records,
from Dask's task stream of its last timed run, the seconds its tasks spent computing and transferring,
by task kind (where a graph loses: block calls, sums, data movement), and the load average before and after
(other processes on the machine skew every figure). Needs ``nvdispatch[dask,bench]`` (``dask-cuda`` and CuPy
for ``--gpu``).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time

import numpy as np
from _bench import RESULTS, cannot_run, output_dir, parser, progress, require, save_plot

try:  # main() says what is missing
    import dask
    import dask.array as da
except ImportError:
    dask = da = None

import nvdispatch
import nvdispatch.fft as F
from nvdispatch import Epilog


def _shapes(quick: bool):
    """``((m, k, n), (m, k, n) of the wide-result case, fft side)``"""
    if quick:
        return (512, 256, 128), (512, 128, 256), 512
    return (16384, 4096, 1024), (16384, 1024, 4096), 8192


def _k_form(a, b, bias) -> str:
    """What ``explain()`` says of the chunked K (concatenated per block or tree-reduced, and why)."""
    e = nvdispatch.explain(a, b, epilog=Epilog.RELU_BIAS, epilog_inputs={"bias": bias})
    return next((s for s in e.steps if s.startswith("K in ")), "")


def _timer(run, repeats: int, desc: str, sync=None) -> list[float]:
    run()  # warm-up: plans on the workers, imports
    if sync:
        sync()
    samples = []
    for _ in progress(range(repeats), desc):
        t0 = time.perf_counter()
        run()
        if sync:
            sync()
        samples.append(time.perf_counter() - t0)
    return samples


def _stream_summary(data) -> dict:
    """Seconds of compute and transfer per task kind (Dask's ``key_split``) in a task stream."""
    from dask.utils import key_split

    out: dict = {}
    for t in data:
        row = out.setdefault(key_split(t["key"]), {"tasks": 0, "compute_s": 0.0, "transfer_s": 0.0})
        row["tasks"] += 1
        for s in t["startstops"]:
            row["compute_s" if s["action"] == "compute" else "transfer_s"] += s["stop"] - s["start"]
    return {k: {n: round(v, 3) if isinstance(v, float) else v for n, v in r.items()} for k, r in out.items()}


def cpu_cases(client, quick: bool, streams: dict):
    from distributed import get_task_stream, wait

    (m, k, n), (m2, k2, n2), side = _shapes(quick)
    rng = da.random.default_rng(0)
    a = rng.standard_normal((m, k), chunks=(m // 4, k // 4), dtype=np.float32).persist()
    b = rng.standard_normal((k, n), chunks=(k // 4, n // 4), dtype=np.float32).persist()
    bias = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    a2 = rng.standard_normal((m2, k2), chunks=(m2 // 4, k2 // 4), dtype=np.float32).persist()
    b2 = rng.standard_normal((k2, n2), chunks=(k2 // 4, n2 // 4), dtype=np.float32).persist()
    bias2 = np.random.default_rng(2).standard_normal(n2).astype(np.float32)
    x = (
        (
            rng.standard_normal((side, side), chunks=side // 4, dtype=np.float32)
            + 1j * rng.standard_normal((side, side), chunks=side // 4, dtype=np.float32)
        )
        .astype(np.complex64)
        .persist()
    )
    wait([a, b, a2, b2, x])

    rep = iter(range(1, 1 << 30))

    def run(make, label):
        """Time ``make(i)`` persisted on the workers; ``i`` differs per run, so every run has new keys (a result
        of the same keys still held from the run before would be reused, not recomputed). The task stream of
        the last run is kept in ``streams[label]``."""

        def go():
            x = make(next(rep))
            with get_task_stream(client) as ts:
                r = x.persist()
                wait(r)
            del r
            streams[label] = _stream_summary(ts.data)

        return go

    def bias_(i, bias=bias):
        return bias + np.float32(i)

    def k_tree(*args, **kwargs):
        """nvdispatch with the K tree forced: Dask's chunk-size below the K panels (read when the graph is built)."""
        with dask.config.set({"array.chunk-size": "1MiB"}):
            return nvdispatch.matmul(*args, **kwargs)

    def x_(i):
        return x * np.complex64(1 + i * 2**-20)

    # correctness of what is timed, on a corner of the result
    got = nvdispatch.matmul(a, b, epilog=Epilog.RELU_BIAS, epilog_inputs={"bias": bias})[:64, :64].compute()
    want = da.maximum(a @ b + bias, 0)[:64, :64].compute()
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
    for make in (nvdispatch.matmul, k_tree):
        got = make(a2, b2, epilog=Epilog.RELU_BIAS, epilog_inputs={"bias": bias2})[:64, :64].compute()
        want = da.maximum(a2 @ b2 + bias2, 0)[:64, :64].compute()
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
    forms = {"narrow": _k_form(a, b, bias), "wide": _k_form(a2, b2, bias2)}
    got = F.fftn(x)[:64, :64].compute()
    want = da.fft.fft2(x.rechunk({0: -1, 1: -1}))[:64, :64].compute()
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-2 * float(np.abs(want).max()))

    mm = f"RELU_BIAS fp32 {m}x{k}x{n}, 4x4 blocks"
    mm2 = f"RELU_BIAS fp32 {m2}x{k2}x{n2}, 4x4 blocks"
    ft = f"fft2 c64 {side}x{side}, 4x4 blocks"
    print(f"{mm}: {forms['narrow']}\n{mm2}: {forms['wide']}")
    return [
        (
            mm,
            {
                "nvdispatch": run(
                    lambda i: nvdispatch.matmul(a, b, epilog=Epilog.RELU_BIAS, epilog_inputs={"bias": bias_(i)}),
                    f"{mm}: nvdispatch",
                ),
                "dask.array": run(lambda i: da.maximum(a @ b + bias_(i), 0), f"{mm}: dask.array"),
            },
            "dask.array",
            0.8,
            forms["narrow"],
        ),
        (
            mm2,
            {
                "nvdispatch": run(
                    lambda i: nvdispatch.matmul(
                        a2, b2, epilog=Epilog.RELU_BIAS, epilog_inputs={"bias": bias_(i, bias2)}
                    ),
                    f"{mm2}: nvdispatch",
                ),
                "nvdispatch, K tree forced": run(
                    lambda i: k_tree(a2, b2, epilog=Epilog.RELU_BIAS, epilog_inputs={"bias": bias_(i, bias2)}),
                    f"{mm2}: nvdispatch, K tree forced",
                ),
                "dask.array": run(lambda i: da.maximum(a2 @ b2 + bias_(i, bias2), 0), f"{mm2}: dask.array"),
            },
            "dask.array",
            0.8,
            forms["wide"],
        ),
        (
            ft,
            {
                "nvdispatch": run(lambda i: F.fftn(x_(i)), f"{ft}: nvdispatch"),
                "dask.array": run(lambda i: da.fft.fft2(x_(i).rechunk({0: -1, 1: -1})), f"{ft}: dask.array"),
                "dask.array hand pencil": run(
                    lambda i: da.fft.fft(
                        da.fft.fft(x_(i).rechunk({0: "auto", 1: -1}), axis=1).rechunk({0: -1, 1: "auto"}), axis=0
                    ),
                    f"{ft}: dask.array hand pencil",
                ),
            },
            "dask.array",
            1.0,
            "",
        ),
    ]


def gpu_cases(quick: bool, scheduler: str):
    import cupy

    shapes = _shapes(quick)
    side = shapes[2]
    rng = cupy.random.default_rng(0)
    x0 = (
        rng.standard_normal((side, side), dtype=cupy.float32)
        + 1j * rng.standard_normal((side, side), dtype=cupy.float32)
    ).astype(cupy.complex64)
    x = da.from_array(x0, chunks=side // 4, asarray=False)
    operands = []  # (m, k, n), a0, b0, bias, a, b
    for m, k, n in shapes[:2]:
        a0 = rng.standard_normal((m, k), dtype=cupy.float32)
        b0 = rng.standard_normal((k, n), dtype=cupy.float32)
        bias = rng.standard_normal(n, dtype=cupy.float32)
        a = da.from_array(a0, chunks=(m // 4, k // 4), asarray=False)
        b = da.from_array(b0, chunks=(k // 4, n // 4), asarray=False)
        operands.append([(m, k, n), a0, b0, bias, a, b])
    sync = cupy.cuda.runtime.deviceSynchronize
    lazy = [x] + [o[4] for o in operands] + [o[5] for o in operands]
    if scheduler == "cuda-cluster":
        from dask_cuda import LocalCUDACluster
        from distributed import Client, wait

        cluster = LocalCUDACluster(n_workers=1, dashboard_address=None)
        client = Client(cluster)
        lazy = client.persist(lazy)
        wait(lazy)

        def run_dask(make):
            def go():
                r = make().persist()
                wait(r)
                del r

            return go
    else:
        lazy = dask.persist(*lazy, scheduler="sync")

        def run_dask(make):
            return lambda: make().persist(scheduler="sync")

    x = lazy[0]
    for i, o in enumerate(operands):
        o[4], o[5] = lazy[1 + i], lazy[1 + len(operands) + i]
    cases = []
    for (m, k, n), a0, b0, bias, a, b in operands:
        kw = {"epilog": Epilog.RELU_BIAS, "epilog_inputs": {"bias": bias}}
        lazy_result = nvdispatch.matmul(a, b, **kw)  # on the cluster's workers, or here (sync)
        got = lazy_result.compute() if scheduler == "cuda-cluster" else lazy_result.compute(scheduler="sync")
        cupy.testing.assert_allclose(got, nvdispatch.matmul(a0, b0, **kw), rtol=1e-2, atol=1e-2)
        cases.append(
            (
                f"RELU_BIAS fp32 m{m} k{k} n{n}, CuPy 4x4 blocks ({scheduler})",
                {
                    "nvdispatch on Dask": run_dask(lambda a=a, b=b, kw=kw: nvdispatch.matmul(a, b, **kw)),
                    "nvdispatch single array": lambda a0=a0, b0=b0, kw=kw: nvdispatch.matmul(a0, b0, **kw),
                },
                "nvdispatch single array",
                1.1,
                _k_form(a, b, bias),
            )
        )
    cases.append(
        (
            f"fft2 c64 {side}x{side}, CuPy 4x4 blocks ({scheduler})",
            {
                "nvdispatch on Dask": run_dask(lambda: F.fftn(x)),
                "nvdispatch single array": lambda: F.fftn(x0),
            },
            "nvdispatch single array",
            1.1,
            "",
        )
    )
    return cases, sync


def main():
    ap = parser(__doc__, out=False)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", metavar="DIR", default=RESULTS, help="folder for the JSON and the plot")
    ap.add_argument("--quick", action="store_true", help="small shapes: checks the script runs")
    ap.add_argument("--only", choices=("matmul", "fft"), help="time one of the two cases")
    ap.add_argument("--gpu", action="store_true", help="CuPy chunks on one GPU against the single-array call")
    ap.add_argument("--scheduler", default="sync", choices=("sync", "cuda-cluster"), help="for --gpu")
    args = ap.parse_args()
    if dask is None:
        cannot_run("needs dask (pip install 'nvdispatch[dask]')")
    if args.gpu:
        if require("cupy", "pip install 'nvdispatch[cupy]'").cuda.runtime.getDeviceCount() < 1:
            cannot_run("--gpu needs an NVIDIA GPU (none found)")
        if args.scheduler == "cuda-cluster":
            require("dask_cuda", "pip install dask-cuda")
    else:
        require("distributed", "pip install 'nvdispatch[dask]'")
    out = output_dir(args.out)
    load_start = os.getloadavg()
    client = cluster = None
    sync = None
    streams: dict = {}
    if args.gpu:
        cases, sync = gpu_cases(args.quick, args.scheduler)
        setting = f"one GPU, {args.scheduler} scheduler"
    else:
        from distributed import Client, LocalCluster

        cluster = LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, memory_limit="6GiB", dashboard_address=None
        )
        client = Client(cluster)
        cases = cpu_cases(client, args.quick, streams)
        setting = "LocalCluster, 2 worker processes x 1 thread"
    if args.only:
        cases = [case for case in cases if case[0].startswith("RELU_BIAS" if args.only == "matmul" else "fft2")]
    results = []
    for label, fns, baseline, goal, k_form in cases:
        medians = {}
        for name, fn in fns.items():
            samples = _timer(fn, args.repeats, f"{label}: {name}", sync)
            medians[name] = statistics.median(samples)
        ratio = medians["nvdispatch" if "nvdispatch" in medians else "nvdispatch on Dask"] / medians[baseline]
        results.append(
            {
                "case": label,
                "median_s": medians,
                "baseline": baseline,
                "ratio": ratio,
                "goal": goal,
                "met": ratio <= goal,
                "k_form": k_form,
                "task_stream_last_run": {k: streams[f"{label}: {k}"] for k in medians if f"{label}: {k}" in streams},
            }
        )
        print(
            f"{label}: "
            + ", ".join(f"{k} {v:.3f} s" for k, v in medians.items())
            + f"; ratio {ratio:.2f} (goal <= {goal})"
        )
    if client is not None:
        client.close()
        cluster.close()
    name = ("dask_bench_gpu" if args.gpu else "dask_bench") + (f"_{args.only}" if args.only else "")
    record = {
        "setting": setting,
        "repeats": args.repeats,
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        "dask": dask.__version__,
        "quick": args.quick,
        "loadavg_1_5_15_start": load_start,
        "loadavg_1_5_15_end": os.getloadavg(),
        "results": results,
    }
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump(record, f, indent=2)
    print(f"wrote {os.path.join(out, name + '.json')}")

    def draw(plt):
        fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4))
        for ax, r in zip(np.atleast_1d(axes), results):
            names = list(r["median_s"])
            ax.bar(range(len(names)), [r["median_s"][k] for k in names], color=["tab:green"] + ["tab:gray"] * 3)
            ax.set_xticks(range(len(names)), names, rotation=15, fontsize=8)
            ax.set_ylabel("median seconds")
            ax.set_title(f"{r['case']}\nratio {r['ratio']:.2f} (goal <= {r['goal']})", fontsize=8)
        fig.suptitle(f"nvdispatch on Dask ({setting})", fontsize=9)
        fig.tight_layout()

    save_plot(draw, os.path.join(out, f"{name}.png"))


if __name__ == "__main__":
    main()
