"""CPU matmul benchmarks: fused RELU_BIAS against NumPy and Torch, and the dispatch overhead of a tiny call.

All contenders run in one process, interleaved round by round, and we report medians and ratios from the
same run (the machine is noisy; ratios are what carry over). Writes JSON and a PNG.

    python benchmarks/cpu_matmul_bench.py [--rounds 31] [--out benchmarks/results] [--quick]

Needs ``pip install 'nvdispatch[bench]'`` for the plot and progress bars (the JSON is written without them);
Torch, when installed, is timed too.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import timeit

import numpy as np
from _bench import output_dir, progress, save_plot

try:  # imported up front: the NumPy executor's Torch engine is a candidate only in processes using Torch
    import torch  # noqa: F401
except ImportError:
    pass

import nvdispatch
from nvdispatch import Epilog
from nvdispatch.executors import numpy_matmul_calibration


def fused_relu_bias(rounds: int, m: int = 8192, n: int = 1024, k: int = 256) -> dict:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    kwargs = {"epilog": Epilog.RELU_BIAS, "epilog_inputs": {"bias": bias}}
    numpy_matmul_calibration.clear()
    t0 = time.perf_counter()
    default = nvdispatch.explain(a, b, **kwargs)  # the first call of this class calibrates it
    calibration_seconds = time.perf_counter() - t0
    mm = nvdispatch.Matmul(a, b)
    mm.plan(**kwargs)
    tuned = mm.autotune(iterations=5)
    contenders = {
        "np.matmul alone": lambda: np.matmul(a, b),
        "numpy naive maximum(a@b+bias, 0)": lambda: np.maximum(a @ b + bias, 0),
        "nvdispatch.matmul RELU_BIAS": lambda: nvdispatch.matmul(a, b, **kwargs),
        "nvdispatch.Matmul (autotuned)": mm.execute,
    }
    engines = {}
    for strategy in default.strategies:  # every strategy (and its engine) the NumPy executor offers here
        forced = nvdispatch.explain(a, b, **kwargs, preferences={"strategy": strategy})
        engine = next((s.split("engine '")[1].split("'")[0] for s in forced.steps if "engine '" in s), "numpy")
        name = f"strategy {strategy} (engine {engine})"
        engines[name] = {"strategy": strategy, "engine": engine, "steps": list(forced.steps)}
        prefs = {"strategy": strategy}
        contenders[name] = lambda prefs=prefs: nvdispatch.matmul(a, b, **kwargs, preferences=prefs)
    try:
        import torch

        ta, tb, tbias = (torch.from_numpy(v) for v in (a, b, bias))
        contenders["torch relu(addmm)"] = lambda: torch.relu(torch.addmm(tbias, ta, tb))
        contenders["torch _addmm_activation"] = lambda: torch._addmm_activation(tbias, ta, tb)
    except ImportError:
        pass
    want = np.maximum(a @ b + bias, 0)
    assert np.allclose(nvdispatch.matmul(a, b, **kwargs), want, rtol=1e-4, atol=1e-4)
    samples = {name: [] for name in contenders}
    for fn in contenders.values():  # warm-up
        fn()
    for _ in progress(range(rounds), "fused RELU_BIAS"):
        for name, fn in contenders.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(v) for name, v in samples.items()}
    base = med["np.matmul alone"]
    return {
        "shape": {"m": m, "n": n, "k": k, "dtype": "float32"},
        "median_seconds": med,
        "ratio_to_np_matmul": {name: t / base for name, t in med.items()},
        "nvdispatch_vs_naive_numpy": med["nvdispatch.matmul RELU_BIAS"] / med["numpy naive maximum(a@b+bias, 0)"],
        "nvdispatch_vs_torch_relu_addmm": (
            med["nvdispatch.matmul RELU_BIAS"] / med["torch relu(addmm)"] if "torch relu(addmm)" in med else None
        ),
        "strategies": engines,
        "calibration": {
            "picked": default.strategy,
            "order": list(default.strategies),
            "seconds": calibration_seconds,
            "classes": numpy_matmul_calibration.calibrations(),
        },
        "autotune_choice": {
            "strategy": mm.strategy,
            "plan": mm._plan.tuning(),
            "timings": {str(k): v for k, v in tuned.items()},
        },
        "plan": str(nvdispatch.explain(a, b, **kwargs)),
    }


def dispatch_overhead(rounds: int, size: int = 8, number: int = 20000) -> dict:
    a = np.random.default_rng(0).standard_normal((size, size), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((size, size), dtype=np.float32)
    bias = np.random.default_rng(2).standard_normal(size, dtype=np.float32)
    kwargs = {"epilog": Epilog.RELU_BIAS, "epilog_inputs": {"bias": bias}}
    nvdispatch.matmul(a, b)
    nvdispatch.matmul(a, b, **kwargs)
    contenders = {
        "np.matmul": lambda: np.matmul(a, b),
        "nvdispatch.matmul": lambda: nvdispatch.matmul(a, b),
        "nvdispatch.matmul RELU_BIAS": lambda: nvdispatch.matmul(a, b, **kwargs),
    }
    samples = {name: [] for name in contenders}
    for _ in progress(range(rounds), "dispatch overhead"):
        for name, fn in contenders.items():
            samples[name].append(timeit.timeit(fn, number=number) / number)
    med = {name: statistics.median(v) for name, v in samples.items()}
    return {
        "shape": {"m": size, "n": size, "k": size, "dtype": "float32"},
        "median_seconds_per_call": med,
        "nvdispatch_us_per_call": med["nvdispatch.matmul"] * 1e6,
        "overhead_us_over_np_matmul": (med["nvdispatch.matmul"] - med["np.matmul"]) * 1e6,
        "ratio_to_np_matmul": med["nvdispatch.matmul"] / med["np.matmul"],
        "relu_bias_ratio_to_np_matmul": med["nvdispatch.matmul RELU_BIAS"] / med["np.matmul"],
        "relu_bias_strategy": nvdispatch.explain(a, b, **kwargs).strategy,
    }


def plot(results: dict, plt) -> None:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [3, 1]})
    ratios = results["fused_relu_bias"]["ratio_to_np_matmul"]
    names = list(ratios)
    picked = results["fused_relu_bias"]["calibration"]["picked"]
    colors = [
        "#76b900" if f"strategy {picked} " in n else "#b0d080" if "strategy" in n or "nvdispatch" in n else "#888"
        for n in names
    ]
    ax1.barh(names, [ratios[n] for n in names], color=colors)
    ax1.axvline(1.0, color="k", lw=0.8)
    ax1.axvline(1.1, color="r", lw=0.8, ls="--", label="goal 1.1x")
    ax1.set_xlabel("time / np.matmul alone (lower is better)")
    s = results["fused_relu_bias"]["shape"]
    ax1.set_title(f"RELU_BIAS fp32 {s['m']}x{s['n']}x{s['k']}, CPU (dark green: calibration's pick, {picked})")
    ax1.legend()
    o = results["dispatch_overhead"]["median_seconds_per_call"]
    ax2.bar(
        [n.replace("nvdispatch.matmul", "nvd") for n in o],
        [v * 1e6 for v in o.values()],
        color=["#888", "#76b900", "#76b900"],
    )
    ax2.axhline(2.5 * o["np.matmul"] * 1e6, color="r", lw=0.8, ls="--", label="goal 2.5x np.matmul")
    ax2.set_ylabel("us per call")
    ax2.set_title("8x8 float32 call")
    ax2.legend()
    fig.tight_layout()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    parser.add_argument("--quick", action="store_true", help="tiny shapes and few calls: checks the script runs")
    args = parser.parse_args()
    out = output_dir(args.out)
    fused = {"m": 64, "n": 32, "k": 16} if args.quick else {}
    results = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__},
        "fused_relu_bias": fused_relu_bias(args.rounds, **fused),
        "dispatch_overhead": dispatch_overhead(max(5, args.rounds // 3), number=100 if args.quick else 20000),
    }
    with open(os.path.join(out, "cpu_matmul.json"), "w") as fh:
        json.dump(results, fh, indent=1)
    save_plot(lambda plt: plot(results, plt), os.path.join(out, "cpu_matmul.png"))
    f = results["fused_relu_bias"]
    print(json.dumps({k: round(v, 3) for k, v in f["ratio_to_np_matmul"].items()}, indent=1))
    print(f"vs naive numpy {f['nvdispatch_vs_naive_numpy']:.3f}")
    print(f"vs torch relu(addmm) {f['nvdispatch_vs_torch_relu_addmm']}")
    o = results["dispatch_overhead"]
    print(f"8x8: nvdispatch {o['nvdispatch_us_per_call']:.2f} us/call, {o['ratio_to_np_matmul']:.2f}x np.matmul")
    print(f"8x8 RELU_BIAS: {o['relu_bias_ratio_to_np_matmul']:.2f}x np.matmul (strategy {o['relu_bias_strategy']})")
    print(f"calibration picked {f['calibration']['picked']} (order {f['calibration']['order']})")


if __name__ == "__main__":
    main()
