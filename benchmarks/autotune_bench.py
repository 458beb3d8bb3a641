# ruff: noqa: B023 - the lambdas are timed at once, inside the loop
"""Autotuned cuBLASLt matmuls vs Torch's best single call, over a grid of shapes, dtypes and epilogs; plus
the host overhead of a cached 16x16 RELU_BIAS call (ratio to ``torch.matmul`` in the same run).

Per cell: Torch's best single call (``torch.matmul`` / ``torch.addmm`` / ``torch._addmm_activation``; for
GELU_AUX_BIAS, which Torch cannot fuse, ``addmm`` + GELU), nvdispatch's stateless call on cuBLASLt with the
heuristic's first algorithm, then ``Matmul.autotune()`` (strategies; heuristic top-N, smaller-workspace and
split-K variants) and the same stateless call again (it picks the recorded choice up), timed in turns with
Torch's best call. GPU times by CUDA events around back-to-back launches behind a GPU busy-wait, median of
rounds, all in one process.

Run on the GPU machine:  python benchmarks/autotune_bench.py [--out DIR] [--budget SECONDS] [--shapes MxNxK,...]
[--dtypes bfloat16,...] (cells are skipped once the budget is spent; the JSON says which ran; --shapes and
--dtypes keep part of the grid). Draw the PNG of a written JSON again (anywhere):  --plot JSON
Needs an NVIDIA GPU and ``pip install 'nvdispatch[torch,cuda,bench]'`` (a CUDA build of Torch).
"""

from __future__ import annotations

import json
import statistics
import time

import gpu_matmul_bench as gmb
from _bench import cuda_event_seconds, gemm_shapes, output_dir, parser, progress, require_cuda_torch, save_plot

SHAPES = [
    (16384, 4096, 512),
    (4096, 4096, 4096),
    (8192, 8192, 1024),
    (1024, 512, 2048),
    (512, 512, 512),
    (4096, 11008, 4096),
    (4096, 4096, 11008),
    (11008, 4096, 4096),
]
DTYPES = ["bfloat16", "float16", "float32", "tf32"]
EPILOGS = ["DEFAULT", "RELU_BIAS", "GELU_BIAS", "GELU_AUX_BIAS"]
TURNS = 5  # samples of Torch's best call and of the autotuned call, taken in turns


def torch_best(torch, a, b, bias, epilog):
    F = torch.nn.functional
    if epilog == "DEFAULT":
        return lambda: torch.matmul(a, b)
    if epilog == "RELU_BIAS":
        return lambda: torch._addmm_activation(bias, a, b)
    if epilog == "GELU_BIAS":
        return lambda: torch._addmm_activation(bias, a, b, use_gelu=True)

    def gelu_aux():
        pre = torch.addmm(bias, a, b)
        return F.gelu(pre, approximate="tanh"), pre

    return gelu_aux


def in_turns(calls: dict, torch, turns: int = TURNS) -> dict[str, float]:
    """Median GPU seconds per call of each of ``calls``, timed in turns (one sample of each per turn, as
    gpu_time takes them), so that clocks drifting over the run weigh on every contender alike."""
    samples = {name: [] for name in calls}
    for fn in calls.values():
        fn()  # warm-up
    for _ in range(turns):
        for name, fn in calls.items():
            samples[name].append(
                cuda_event_seconds(fn, torch, reps=1, inner=gmb.REPS, warmup=0, busy_cycles=20_000_000 // gmb.REPS)
            )
    return {name: statistics.median(v) for name, v in samples.items()}


def run(out_dir: str, budget: float, shapes=SHAPES, dtypes=DTYPES) -> dict:
    import torch

    import nvdispatch

    gmb.REPS, gmb.ROUNDS = 10, 3
    out_dir = output_dir(out_dir)
    from nvdispatch._cuda import lt_autotune

    results = {"device": torch.cuda.get_device_name(), "environment": lt_autotune.environment(0), "cells": []}
    t_start = time.perf_counter()
    cells = [(s, d) for s in shapes for d in dtypes]
    skipped = []
    for (m, n, k), dtype in progress(cells, "shapes x dtypes"):
        if time.perf_counter() - t_start > budget:
            skipped.append([m, n, k, dtype])
            continue
        tf32 = dtype == "tf32"
        dt = torch.float32 if tf32 else getattr(torch, dtype)
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a = torch.randn(m, k, device="cuda", dtype=dt)
        b = torch.randn(k, n, device="cuda", dtype=dt)
        bias = torch.randn(n, device="cuda", dtype=dt)
        opts = {"compute_type": "COMPUTE_32F_FAST_TF32"} if tf32 else None
        for ep in EPILOGS:
            kw = {"options": opts}
            if ep != "DEFAULT":
                kw |= {"epilog": ep, "epilog_inputs": {"bias": bias}}
            cell = {"m": m, "n": n, "k": k, "dtype": dtype, "epilog": ep}
            best_call = torch_best(torch, a, b, bias, ep)
            with nvdispatch.set_backend("cuda"):  # cuBLASLt by name (the default leaves plain products to Torch)
                call = lambda: nvdispatch.matmul(a, b, **kw)
                cell["heuristic"] = gmb.gpu_time(call, torch)
                mm = nvdispatch.Matmul(a, b, options=opts)
                mm.plan(epilog=kw.get("epilog"), epilog_inputs=kw.get("epilog_inputs"))
                try:
                    mm.autotune(iterations=3)
                    cell["strategy"], cell["choice"] = mm.strategy, mm._plan.tuning()
                except Exception as exc:  # noqa: BLE001
                    cell["autotune_error"] = repr(exc)[:200]
                paired = in_turns({"torch_best": best_call, "autotuned": call}, torch)
                cell.update(paired)
                mm.free()
            best = min(cell["heuristic"], cell["autotuned"])
            cell["ratio_autotuned_vs_torch"] = cell["autotuned"] / cell["torch_best"]
            cell["ratio_best_vs_torch"] = best / cell["torch_best"]
            cell["gain_autotune"] = cell["heuristic"] / cell["autotuned"]
            results["cells"].append(cell)
            label = (cell.get("choice") or {}).get("label", cell.get("autotune_error", ""))
            print(
                f"{m}x{n}x{k} {dtype:8s} {ep:13s} torch {cell['torch_best'] * 1e6:8.1f}  heur "
                f"{cell['heuristic'] * 1e6:8.1f}  tuned {cell['autotuned'] * 1e6:8.1f}  "
                f"x{cell['ratio_autotuned_vs_torch']:.3f}"
                f"  [{cell.get('strategy', '')} {label}]",
                flush=True,
            )
        a = b = bias = None
        nvdispatch.plan_cache.clear()
        torch.cuda.empty_cache()
    torch.backends.cuda.matmul.allow_tf32 = False
    results["skipped_for_budget"] = skipped
    ratios = [c["ratio_autotuned_vs_torch"] for c in results["cells"]]
    if ratios:
        results["summary"] = {
            "cells": len(ratios),
            "cells_at_or_below_1.00": sum(r <= 1.0 for r in ratios),
            "median_ratio": statistics.median(ratios),
            "geomean_ratio": statistics.geometric_mean(ratios),
            "worst_ratio": max(ratios),
            "median_autotune_gain": statistics.median(c["gain_autotune"] for c in results["cells"]),
        }
    results["host_overhead"] = host_overhead(torch, nvdispatch)
    print(json.dumps(results.get("summary"), indent=1), json.dumps(results["host_overhead"], indent=1), flush=True)
    path = f"{out_dir}/autotune_bench.json"
    with open(path, "w") as fh:
        json.dump(results, fh, indent=1, default=str)
    plot(path)
    return results


def host_overhead(torch, nvdispatch) -> dict:
    """Host seconds per cached 16x16 RELU_BIAS stateless call (the default route, the FP8 options now in the
    call's path) vs torch.matmul."""
    a = torch.randn(16, 16, device="cuda")
    b = torch.randn(16, 16, device="cuda")
    bias = torch.randn(16, device="cuda")
    cases = {
        "torch.matmul": lambda: torch.matmul(a, b),
        "torch._addmm_activation": lambda: torch._addmm_activation(bias, a, b),
        "nvdispatch.matmul plain": lambda: nvdispatch.matmul(a, b),
        "nvdispatch.matmul RELU_BIAS": lambda: nvdispatch.matmul(
            a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}
        ),
    }
    t = gmb.host_times(cases, torch, n=200, rounds=30)
    t["ratio_relu_bias_vs_torch_matmul"] = t["nvdispatch.matmul RELU_BIAS"] / t["torch.matmul"]
    t["ratio_relu_bias_vs_torch_addmm_activation"] = t["nvdispatch.matmul RELU_BIAS"] / t["torch._addmm_activation"]
    t["ratio_plain_vs_torch_matmul"] = t["nvdispatch.matmul plain"] / t["torch.matmul"]
    return t


def plot(path: str) -> None:
    with open(path) as fh:
        data = json.load(fh)
    save_plot(lambda plt: _draw(data, plt), path.replace(".json", ".png"), dpi=130)


def _draw(data: dict, plt) -> None:
    cells = data["cells"]
    labels = [f"{c['m']}x{c['n']}x{c['k']} {c['dtype']} {c['epilog']}" for c in cells]
    fig, ax = plt.subplots(figsize=(max(12, len(cells) * 0.18), 6))
    xs = range(len(cells))
    ax.scatter(xs, [c["heuristic"] / c["torch_best"] for c in cells], s=10, label="heuristic / torch best")
    ax.scatter(xs, [c["ratio_autotuned_vs_torch"] for c in cells], s=14, label="autotuned / torch best")
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, rotation=90, fontsize=4)
    ax.set_ylabel("time ratio (lower is better)")
    ax.set_title(f"nvdispatch autotuned cuBLASLt vs Torch's best single call on {data.get('device', 'GPU')}")
    ax.legend()
    fig.tight_layout()


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__)
    ap.add_argument("--budget", type=float, default=1e9, metavar="SECONDS", help="cells after this are skipped")
    ap.add_argument("--shapes", type=gemm_shapes, default=SHAPES, metavar="MxNxK,...", help="part of the grid's shapes")
    ap.add_argument("--dtypes", default=",".join(DTYPES), metavar="DTYPE,...", help="part of the grid's dtypes")
    ap.add_argument("--plot", metavar="JSON", help="only draw the PNG of a written JSON (runs anywhere)")
    args = ap.parse_args(argv)
    if args.plot:
        plot(args.plot)
        return
    require_cuda_torch()
    run(args.out, args.budget, args.shapes, args.dtypes.split(","))


if __name__ == "__main__":
    main()
