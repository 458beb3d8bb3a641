# ruff: noqa: B023 - the lambdas are timed at once, inside the loop
"""FP8 matmul benchmark (H200 / any compute capability 8.9+ GPU): RELU_BIAS with a bf16 bias and a bf16 result,
e4m3 x e4m3, in cuBLASLt's default FP8 accumulation and in its fast accumulation mode, all peers in one process.

Two runs:

``python benchmarks/fp8_bench.py [--out DIR]``
    the overview: nvdispatch FP8 (b column-major, b C-ordered, autotuned) against bf16 nvdispatch,
    ``torch._scaled_mm`` followed by Torch's bias/ReLU (bias fused by ``_scaled_mm`` + an in-place ReLU, and
    fully separate) and nvmath-python's FP8 ``Matmul``; each in both accumulation modes, like with like.
    Writes ``fp8_bench.json`` and ``.png``.
``python benchmarks/fp8_bench.py [--out DIR] --vs-scaled-mm``
    exactly the comparison of issue #30 item 5: a stateless ``nvdispatch.matmul`` FP8 RELU_BIAS -> bf16 call
    against ``torch.relu_(torch._scaled_mm(..., bias=, use_fast_accum=...))``, both accumulation modes, every
    shape. The peers are timed in turns within each round (so clocks, power and temperature drift alike for
    all), medians over rounds, and the ratio is also taken per round. Besides the issue's pair it times what
    tells causes apart: Python-number and device scales; the autotuned plan; our plan with the bias-only
    epilogue plus ``relu_`` (Torch's form on our kernel choice); our algorithm launched with Torch's 32 MiB
    workspace; ``_scaled_mm`` alone. It records the kernels each runs (``torch.profiler``), our algorithms'
    configurations against the heuristic's first answer for Torch's form, and the SM clock and power after
    each sample where NVML is there. ``--regime sustained`` heats the GPU with each peer before its sample
    (power-limited clocks), ``burst`` (the default) samples after an idle hold. Writes ``fp8_vs_scaled_mm.json``
    and ``.png``.

GPU times: CUDA events around back-to-back launches queued behind a GPU busy-wait (the host's overhead hidden).
``--plot JSON`` redraws a figure from its JSON (anywhere). Needs an NVIDIA GPU of compute capability 8.9+ and
``pip install 'nvdispatch[torch,cuda,bench]'``; nvmath-python is timed when installed.
"""

from __future__ import annotations

import json
import statistics

from _bench import cannot_run, gemm_shapes, output_dir, parser, progress, require_cuda_torch, save_plot
from gpu_matmul_bench import gpu_time

SHAPES = [(16384, 4096, 512), (8192, 8192, 8192), (4096, 4096, 4096)]
#: the goal of issue #30 item 5: nvdispatch at most this fraction of torch._scaled_mm + ReLU's time
GOAL = 0.97


def run(out_dir: str, shapes=SHAPES) -> dict:
    import torch

    import nvdispatch

    try:
        import nvmath
        from nvmath.linalg.advanced import Matmul as NvMatmul
        from nvmath.linalg.advanced import MatmulEpilog
    except Exception as exc:  # noqa: BLE001
        NvMatmul = None
        print("nvmath unavailable:", exc)
    out_dir = output_dir(out_dir)
    results = {"device": torch.cuda.get_device_name(), "cells": []}
    e4m3, bf16 = torch.float8_e4m3fn, torch.bfloat16
    for m, n, k in progress(shapes, "shapes"):
        g = torch.Generator(device="cuda").manual_seed(0)
        a16 = torch.randn(m, k, device="cuda", dtype=bf16, generator=g)
        b16 = torch.randn(k, n, device="cuda", dtype=bf16, generator=g)
        bias = torch.randn(n, device="cuda", dtype=bf16, generator=g)
        a8 = a16.to(e4m3)
        b8_col = b16.t().to(e4m3).contiguous().t()  # column-major (k, n): torch._scaled_mm's layout
        b8_row = b16.to(e4m3)  # C-ordered: nvdispatch transposes it per call
        sa = torch.tensor(0.5, device="cuda")
        sb = torch.tensor(0.5, device="cuda")
        scales = {"a": 0.5, "b": 0.5}
        kw = {"epilog": "RELU_BIAS", "epilog_inputs": {"bias": bias}}
        fp8kw = {**kw, "quantization_scales": scales, "options": {"result_type": "bfloat16"}}
        cell = {"m": m, "n": n, "k": k, "flop": 2 * m * n * k}
        cell["explain"] = str(nvdispatch.explain(a8, b8_col, **fp8kw))
        t = {}
        t["nvdispatch fp8 (b column-major)"] = gpu_time(lambda: nvdispatch.matmul(a8, b8_col, **fp8kw), torch)
        t["nvdispatch fp8 (b row-major, transposed per call)"] = gpu_time(
            lambda: nvdispatch.matmul(a8, b8_row, **fp8kw), torch
        )
        mm = nvdispatch.Matmul(a8, b8_col, quantization_scales=scales, options={"result_type": "bfloat16"})
        mm.plan(**kw)
        mm.autotune(iterations=5)
        cell["fp8_tuning"] = mm._plan.tuning()
        t["nvdispatch fp8 autotuned (stateless call)"] = gpu_time(lambda: nvdispatch.matmul(a8, b8_col, **fp8kw), torch)
        fastkw = {**fp8kw, "options": {"result_type": "bfloat16", "fast_accumulation": True}}
        cell["explain_fast"] = str(nvdispatch.explain(a8, b8_col, **fastkw))
        t["nvdispatch fp8 fast accumulation"] = gpu_time(lambda: nvdispatch.matmul(a8, b8_col, **fastkw), torch)
        mmf = nvdispatch.Matmul(a8, b8_col, quantization_scales=scales, options=fastkw["options"])
        mmf.plan(**kw)
        mmf.autotune(iterations=5)
        cell["fp8_fast_tuning"] = mmf._plan.tuning()
        t["nvdispatch fp8 fast accumulation autotuned (stateless call)"] = gpu_time(
            lambda: nvdispatch.matmul(a8, b8_col, **fastkw), torch
        )
        t["nvdispatch bf16"] = gpu_time(lambda: nvdispatch.matmul(a16, b16, **kw), torch)
        t["torch._scaled_mm(bias=) + relu_"] = gpu_time(
            lambda: torch.relu_(torch._scaled_mm(a8, b8_col, scale_a=sa, scale_b=sb, bias=bias, out_dtype=bf16)),
            torch,
        )
        t["torch._scaled_mm + separate bias/relu"] = gpu_time(
            lambda: torch.relu(torch._scaled_mm(a8, b8_col, scale_a=sa, scale_b=sb, out_dtype=bf16) + bias), torch
        )
        t["torch._scaled_mm alone"] = gpu_time(
            lambda: torch._scaled_mm(a8, b8_col, scale_a=sa, scale_b=sb, out_dtype=bf16), torch
        )
        fast = {"scale_a": sa, "scale_b": sb, "out_dtype": bf16, "use_fast_accum": True}
        t["torch._scaled_mm(bias=, fast accum) + relu_"] = gpu_time(
            lambda: torch.relu_(torch._scaled_mm(a8, b8_col, bias=bias, **fast)), torch
        )
        t["torch._scaled_mm alone (fast accum)"] = gpu_time(lambda: torch._scaled_mm(a8, b8_col, **fast), torch)
        if NvMatmul is not None:
            try:
                bias_m = torch.randn(m, 1, device="cuda", dtype=bf16)  # nvmath takes the bias along M
                nm = NvMatmul(
                    a8, b8_col, quantization_scales={"a": 0.5, "b": 0.5},
                    options={"result_type": nvmath.CudaDataType.CUDA_R_16BF},
                )  # fmt: skip
                nm.plan(epilog=MatmulEpilog.RELU_BIAS, epilog_inputs={"bias": bias_m})
                t["nvmath fp8 Matmul (stateful)"] = gpu_time(nm.execute, torch)
                nm.free()
                nm = NvMatmul(
                    a8, b8_col, quantization_scales={"a": 0.5, "b": 0.5},
                    options={"result_type": nvmath.CudaDataType.CUDA_R_16BF, "fast_accumulation": True},
                )  # fmt: skip
                nm.plan(epilog=MatmulEpilog.RELU_BIAS, epilog_inputs={"bias": bias_m})
                t["nvmath fp8 Matmul fast accumulation (stateful)"] = gpu_time(nm.execute, torch)
                nm.free()
            except Exception as exc:  # noqa: BLE001
                cell["nvmath_error"] = repr(exc)[:300]
        cell["seconds"] = t
        ours = min(t["nvdispatch fp8 (b column-major)"], t["nvdispatch fp8 autotuned (stateless call)"])
        cell["speedup_vs_bf16"] = t["nvdispatch bf16"] / ours
        cell["ratio_vs_scaled_mm_fused_bias"] = ours / t["torch._scaled_mm(bias=) + relu_"]
        cell["ratio_vs_scaled_mm_separate"] = ours / t["torch._scaled_mm + separate bias/relu"]
        if "nvmath fp8 Matmul (stateful)" in t:
            cell["ratio_vs_nvmath"] = ours / t["nvmath fp8 Matmul (stateful)"]
        cell["fp8_tflops"] = cell["flop"] / ours / 1e12
        fast_ours = min(
            t["nvdispatch fp8 fast accumulation"], t["nvdispatch fp8 fast accumulation autotuned (stateless call)"]
        )
        cell["fast_speedup_vs_bf16"] = t["nvdispatch bf16"] / fast_ours
        cell["fast_ratio_vs_scaled_mm_fused_bias"] = fast_ours / t["torch._scaled_mm(bias=, fast accum) + relu_"]
        if "nvmath fp8 Matmul fast accumulation (stateful)" in t:
            cell["fast_ratio_vs_nvmath"] = fast_ours / t["nvmath fp8 Matmul fast accumulation (stateful)"]
        cell["fast_fp8_tflops"] = cell["flop"] / fast_ours / 1e12
        results["cells"].append(cell)
        for name, v in t.items():
            print(f"{m}x{n}x{k} {name:52s} {v * 1e6:9.1f} us", flush=True)
        figures = ("speedup", "ratio", "fp8_tf", "fast_")
        print({key: v for key, v in cell.items() if key.startswith(figures)}, flush=True)
        a16 = b16 = a8 = b8_col = b8_row = mm = mmf = None
        nvdispatch.plan_cache.clear()
        torch.cuda.empty_cache()
    path = f"{out_dir}/fp8_bench.json"
    with open(path, "w") as fh:
        json.dump(results, fh, indent=1, default=str)
    plot(path)
    return results


# -- the comparison: nvdispatch vs torch._scaled_mm + ReLU, in turns ---------------------------------
OURS = "nvdispatch.matmul (host scales)"
THEIRS = "torch.relu_(torch._scaled_mm(bias=))"


class _Nvml:
    """SM clock (MHz), power (W) and temperature (C) of GPU 0 through NVML, or nothing where it is missing."""

    def __init__(self):
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nv, self._h = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # noqa: BLE001 - nvidia-ml-py is optional
            self._nv = None

    def read(self) -> dict | None:
        if self._nv is None:
            return None
        nv, h = self._nv, self._h
        return {
            "sm_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            "power_w": nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "temp_c": nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
        }


def _sample(fn, torch, inner: int, hold_cycles: int, heat: int, nvml: _Nvml) -> tuple[float, dict | None]:
    """Seconds per call of ``inner`` back-to-back calls of ``fn`` (CUDA events), queued behind a GPU busy-wait;
    ``heat`` untimed calls first (sustained regime). Returns (seconds, NVML reading while the calls run)."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(hold_cycles)
    for _ in range(heat):
        fn()
    start.record()
    for _ in range(inner):
        fn()
    stop.record()
    reading = nvml.read()  # the GPU is still running the queued calls
    stop.synchronize()
    return start.elapsed_time(stop) * 1e-3 / inner, reading


def _kernels(fn, torch) -> list[str]:
    """The GPU kernels one call of ``fn`` runs, with their durations (torch.profiler; CUPTI sees ours too)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [f"{e.name} ({e.time_range.elapsed_us():.1f} us)" for e in prof.events() if e.device_type.name == "CUDA"]


def _peers(a8, b8, bias, fast: bool, scales: tuple[str, ...], autotune: bool, torch, nvdispatch) -> tuple[dict, dict]:
    """The peers of one cell (name -> call) and what the record says of our plans."""
    from nvdispatch._cuda import lt_autotune
    from nvdispatch._cuda.lt_fp8 import Fp8LtPlan

    bf16 = torch.bfloat16
    sa, sb = torch.tensor(0.5, device="cuda"), torch.tensor(0.5, device="cuda")
    host, device = {"a": 0.5, "b": 0.5}, {"a": sa, "b": sb}
    opts = {"result_type": "bfloat16", "fast_accumulation": fast}
    relu_bias = {"epilog": "RELU_BIAS", "epilog_inputs": {"bias": bias}, "options": opts}
    peers = {
        THEIRS: lambda: torch.relu_(
            torch._scaled_mm(a8, b8, scale_a=sa, scale_b=sb, bias=bias, out_dtype=bf16, use_fast_accum=fast)
        ),
        "torch._scaled_mm(bias=) alone": lambda: torch._scaled_mm(
            a8, b8, scale_a=sa, scale_b=sb, bias=bias, out_dtype=bf16, use_fast_accum=fast
        ),
    }
    if "host" in scales:
        peers[OURS] = lambda: nvdispatch.matmul(a8, b8, quantization_scales=host, **relu_bias)
    if "device" in scales:
        peers["nvdispatch.matmul (device scales)"] = lambda: nvdispatch.matmul(
            a8, b8, quantization_scales=device, **relu_bias
        )
    for fn in list(peers.values()):  # the stateless calls' plans, cached before autotune records a choice
        fn()
    record: dict = {}
    # private plans of the same problem (the stateless calls' cached plans keep the heuristic's first answer)
    mm = nvdispatch.Matmul(a8, b8, quantization_scales=device, options=opts)
    mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    ops = mm._operands()
    problem = mm._plan.problem
    record["explain"] = str(nvdispatch.explain(a8, b8, quantization_scales=device, **relu_bias))
    record["heuristic (device scales)"] = lt_autotune.configuration(mm._plan.algorithm)
    (form, torch_form), *_ = mm._plan.core.related() or [(None, None)]
    if torch_form is not None:
        first = torch_form.algorithms(mm._plan.handle, 256)
        record[f"heuristic of the {form} (torch's choice)"] = lt_autotune.configuration(first[0]) if first else None
    wide = Fp8LtPlan(problem)  # our algorithm, launched with torch's workspace size
    widened = type(wide.algorithm)()
    widened.algo, widened.workspaceSize, widened.state = wide.algorithm.algo, 32 << 20, 0
    wide.algorithm = widened
    peers["nvdispatch, launched with a 32 MiB workspace"] = lambda: wide.execute(ops)
    bias_only = nvdispatch.Matmul(a8, b8, quantization_scales=device, options=opts)
    bias_only.plan(epilog="BIAS", epilog_inputs={"bias": bias})
    record["heuristic of our bias-only plan"] = lt_autotune.configuration(bias_only._plan.algorithm)
    peers["nvdispatch BIAS epilogue + relu_ (torch's form, our choice)"] = lambda: torch.relu_(bias_only.execute())
    if autotune:
        tuned = Fp8LtPlan(problem)
        tuned.execute(ops)
        timings = tuned.autotune(ops, iterations=5)
        record["autotune candidates"] = len(timings)
        record["autotuned"] = {**(tuned.tuning() or {}), "configuration": lt_autotune.configuration(tuned.algorithm)}
        record["related candidates timed"] = sorted(
            (t, label) for label, t in timings if " of the " in label and t != float("inf")
        )[:5]
        peers["nvdispatch, autotuned plan"] = lambda: tuned.execute(ops)
    return peers, record


def compare(
    out_dir: str,
    shapes=SHAPES,
    modes=("default", "fast"),
    scales=("host", "device"),
    rounds: int = 15,
    sample_ms: float = 20.0,
    regime: str = "burst",
    heat_ms: float = 300.0,
    autotune: bool = True,
    profile: bool = True,
) -> dict:
    """nvdispatch FP8 RELU_BIAS -> bf16 against ``torch._scaled_mm`` + ReLU (see the module docstring)."""
    import torch

    import nvdispatch

    out_dir = output_dir(out_dir)
    nvml = _Nvml()
    results = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "goal": GOAL,
        "regime": regime,
        "rounds": rounds,
        "sample_ms": sample_ms,
        "nvml": nvml.read() is not None,
        "cells": [],
    }
    e4m3, bf16 = torch.float8_e4m3fn, torch.bfloat16
    cells = [(shape, mode) for shape in shapes for mode in modes]
    for (m, n, k), mode in progress(cells, "shapes x modes"):
        g = torch.Generator(device="cuda").manual_seed(0)
        a8 = torch.randn(m, k, device="cuda", dtype=bf16, generator=g).to(e4m3)
        b8 = torch.randn(n, k, device="cuda", dtype=bf16, generator=g).to(e4m3).t()  # column-major, as torch's
        bias = torch.randn(n, device="cuda", dtype=bf16, generator=g)
        peers, record = _peers(a8, b8, bias, mode == "fast", scales, autotune, torch, nvdispatch)
        # calls per sample: sample_ms of GPU time; the hold covers the host's queueing of them (100 us a call)
        est = {}
        for name, fn in peers.items():
            fn()
            est[name], _ = _sample(fn, torch, 3, 20_000_000, 0, nvml)
        inner = {name: max(3, int(sample_ms * 1e-3 / t)) for name, t in est.items()}
        heat = {name: int(heat_ms * 1e-3 / t) if regime == "sustained" else 0 for name, t in est.items()}
        hold = {name: int(2e9 * min(0.5, 100e-6 * (inner[name] + heat[name]))) for name in peers}  # ~2 GHz cycles
        samples: dict[str, list[float]] = {name: [] for name in peers}
        readings: dict[str, list] = {name: [] for name in peers}
        names = list(peers)
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:  # a rotating order: none always first
                t, reading = _sample(peers[name], torch, inner[name], hold[name], heat[name], nvml)
                samples[name].append(t)
                readings[name].append(reading)
        cell = {"m": m, "n": n, "k": k, "mode": mode, "flop": 2 * m * n * k, **record}
        cell["median_seconds"] = {name: statistics.median(v) for name, v in samples.items()}
        cell["samples"] = samples
        if nvml.read() is not None:
            cell["nvml"] = {
                name: {key: statistics.median(x[key] for x in v if x) for key in ("sm_mhz", "power_w", "temp_c")}
                for name, v in readings.items()
            }
        base = cell["median_seconds"][THEIRS]
        cell["ratio_vs_scaled_mm_relu"] = {
            name: t / base for name, t in cell["median_seconds"].items() if name.startswith("nvdispatch")
        }
        cell["median_round_ratio_vs_scaled_mm_relu"] = {
            name: statistics.median(x / y for x, y in zip(v, samples[THEIRS]))
            for name, v in samples.items()
            if name.startswith("nvdispatch")
        }
        if profile:
            cell["kernels"] = {name: _kernels(fn, torch) for name, fn in peers.items()}
        results["cells"].append(cell)
        print(f"{m}x{n}x{k} {mode} accumulation", flush=True)
        for name, t in cell["median_seconds"].items():
            ratio = cell["ratio_vs_scaled_mm_relu"].get(name)
            shown = f"  {ratio:.3f}x" if ratio is not None else ""
            print(f"  {name:60s} {t * 1e6:9.1f} us{shown}", flush=True)
        peers = record = None
        nvdispatch.plan_cache.clear()
        torch.cuda.empty_cache()
    met = [c["ratio_vs_scaled_mm_relu"].get(OURS, float("inf")) <= GOAL for c in results["cells"]]
    results["goal_met_everywhere"] = all(met) if met else None
    path = f"{out_dir}/fp8_vs_scaled_mm.json"
    with open(path, "w") as fh:
        json.dump(results, fh, indent=1, default=str)
    plot(path)
    return results


# -- plots -----------------------------------------------------------------------------------------------------
def plot(path: str) -> None:
    with open(path) as fh:
        data = json.load(fh)
    draw = _draw_comparison if data.get("cells") and "mode" in data["cells"][0] else _draw
    save_plot(lambda plt: draw(data, plt), path.replace(".json", ".png"))


def _draw(data: dict, plt) -> None:
    cells = data["cells"]
    fig, axes = plt.subplots(1, len(cells), figsize=(7 * len(cells), 5), squeeze=False)
    for ax, cell in zip(axes[0], cells):
        names = list(cell["seconds"])
        vals = [cell["seconds"][nm] * 1e6 for nm in names]
        colors = ["tab:green" if nm.startswith("nvdispatch fp8") else "tab:gray" for nm in names]
        ax.barh(names, vals, color=colors)
        ax.set_xlabel("microseconds (lower is better)")
        ax.set_title(f"RELU_BIAS {cell['m']}x{cell['n']}x{cell['k']}, bf16 out", fontsize=9)
        ax.tick_params(axis="y", labelsize=7)
    fig.suptitle(f"FP8 e4m3 matmul on {data.get('device', 'GPU')}")
    fig.tight_layout()


def _draw_comparison(data: dict, plt) -> None:
    cells = data["cells"]
    names = sorted({name for c in cells for name in c["ratio_vs_scaled_mm_relu"]})
    labels = [f"{c['m']}x{c['n']}x{c['k']}\n{c['mode']}" for c in cells]
    fig, ax = plt.subplots(figsize=(max(10, 1.6 * len(cells) * max(1, len(names)) / 3 + 4), 5.5))
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(cells))]
        ax.bar(xs, [c["ratio_vs_scaled_mm_relu"].get(name, 0) for c in cells], width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(data.get("goal", GOAL), color="tab:red", linestyle="--", linewidth=0.8, label=f"goal {GOAL}x")
    ax.set_xticks(range(len(cells)), labels, fontsize=8)
    ax.set_ylabel("time / torch.relu_(torch._scaled_mm(bias=)) (lower is better)")
    ax.set_title(
        f"FP8 e4m3 RELU_BIAS -> bf16 on {data.get('device', 'GPU')}: nvdispatch / torch, median of "
        f"{data.get('rounds')} rounds in turns ({data.get('regime')})",
        fontsize=9,
    )
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()


def main(argv=None) -> None:
    ap = parser(__doc__)
    ap.add_argument("--plot", metavar="JSON", help="redraw the figure of a results file, then exit")
    ap.add_argument("--vs-scaled-mm", action="store_true", help="the issue's comparison (see above)")
    ap.add_argument("--shapes", type=gemm_shapes, default=SHAPES, help="MxNxK,... (default: %(default)s)")
    ap.add_argument("--modes", default="default,fast", help="accumulation modes (default: %(default)s)")
    ap.add_argument("--scales", default="host,device", help="scale forms of our call (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=15, help="rounds of samples in turns (default: %(default)s)")
    ap.add_argument("--sample-ms", type=float, default=20.0, help="GPU time per sample (default: %(default)s)")
    ap.add_argument("--regime", choices=("burst", "sustained"), default="burst", help="see above")
    ap.add_argument("--heat-ms", type=float, default=300.0, help="sustained regime: heating per sample")
    ap.add_argument("--no-autotune", action="store_true", help="skip the autotuned plan")
    ap.add_argument("--no-profile", action="store_true", help="skip recording the kernels")
    args = ap.parse_args(argv)
    if args.plot:
        plot(args.plot)
        return
    torch = require_cuda_torch()
    if torch.cuda.get_device_capability() < (8, 9):
        cannot_run(f"needs a GPU of compute capability 8.9+ for FP8, {torch.cuda.get_device_name()} is not")
    if not args.vs_scaled_mm:
        run(args.out, args.shapes)
        return
    compare(
        args.out,
        shapes=args.shapes,
        modes=tuple(args.modes.split(",")),
        scales=tuple(args.scales.split(",")),
        rounds=args.rounds,
        sample_ms=args.sample_ms,
        regime=args.regime,
        heat_ms=args.heat_ms,
        autotune=not args.no_autotune,
        profile=not args.no_profile,
    )


if __name__ == "__main__":
    main()
