# ruff: noqa: B023 - the lambdas are timed at once, inside the loop
"""FP8 matmul benchmark (H200 / any compute capability 8.9+ GPU): RELU_BIAS with a bf16 bias and a bf16
result, e4m3 x e4m3, against bf16 nvdispatch, ``torch._scaled_mm`` followed by Torch's bias/ReLU (bias fused
by ``_scaled_mm`` + an in-place ReLU, and fully separate), and nvmath-python's FP8 ``Matmul``; each in
cuBLASLt's default FP8 accumulation and in its fast accumulation mode (``options={"fast_accumulation": True}``,
``use_fast_accum=True``, nvmath's ``fast_accumulation``), compared like with like.

GPU times: CUDA events around back-to-back launches queued behind a GPU busy-wait (``gpu_time`` of
gpu_matmul_bench: host overhead hidden), median of rounds, all peers in one process.
Run on the GPU machine:  python benchmarks/fp8_bench.py [--out DIR]   (writes DIR/fp8_bench.json and .png);
``--plot JSON`` draws the PNG of a written JSON again (anywhere).
Needs an NVIDIA GPU of compute capability 8.9+ and ``pip install 'nvdispatch[torch,cuda,bench]'``.
"""

from __future__ import annotations

import json

from _bench import cannot_run, output_dir, parser, progress, require_cuda_torch, save_plot
from gpu_matmul_bench import gpu_time

SHAPES = [(16384, 4096, 512), (8192, 8192, 8192)]


def run(out_dir: str) -> dict:
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
    for m, n, k in progress(SHAPES, "shapes"):
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


def plot(path: str) -> None:
    with open(path) as fh:
        data = json.load(fh)
    save_plot(lambda plt: _draw(data, plt), path.replace(".json", ".png"))


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


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__)
    ap.add_argument("--plot", metavar="JSON", help="only draw the PNG of a written JSON (runs anywhere)")
    args = ap.parse_args(argv)
    if args.plot:
        plot(args.plot)
        return
    torch = require_cuda_torch()
    if torch.cuda.get_device_capability() < (8, 9):
        cannot_run(f"needs a GPU of compute capability 8.9+ for FP8, {torch.cuda.get_device_name()} is not")
    run(args.out)


if __name__ == "__main__":
    main()
