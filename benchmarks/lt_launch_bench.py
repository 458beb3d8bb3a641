"""Host time of cuBLASLt launches: ``cublasLtMatmul`` called directly through ``nvdispatch._hotpath`` against the
same call through ctypes, in one process, the two launchers taking turns round by round.

Cases (16x16 float32, the host-bound size): our cuBLASLt plan's ``execute`` (RELU_BIAS), a stateless CuPy
RELU_BIAS call (cuBLASLt), a stateless FP8 RELU_BIAS call with device scales (compute capability 8.9+); peers
``torch.matmul`` and ``cupy.matmul`` for ratios. Per round and case: 20 warm calls, then 200 timed back to back
(synchronised outside the timing); medians over rounds.

Run on the GPU machine:  python benchmarks/lt_launch_bench.py [--out DIR] [--rounds N]
Plot a written JSON again (anywhere):  python benchmarks/lt_launch_bench.py [--out DIR] --replot JSON
Needs an NVIDIA GPU, ``pip install 'nvdispatch[torch,cuda]'`` and the compiled extension (a C compiler at install).
"""

from __future__ import annotations

import json
import os
import statistics
import time

from _bench import cannot_run, output_dir, parser, progress, require_cuda_torch, save_plot

LAUNCHERS = ("ctypes", "direct")


def plot(out: dict, path: str) -> bool:
    """Bars of each case's host time per launcher (µs)."""
    cases = [k for k, v in out.items() if isinstance(v, dict) and "direct" in v]

    def draw(plt):
        fig, ax = plt.subplots(figsize=(8, 3.5))
        for i, tag in enumerate(LAUNCHERS):
            ax.barh([j + 0.4 * i for j in range(len(cases))], [out[c][tag]["us"] for c in cases], height=0.4,
                    label=f"cublasLtMatmul via {tag}")
        ax.set_yticks([j + 0.2 for j in range(len(cases))], cases)
        ax.set_xlabel("host µs per call, 16x16")
        ax.set_title(f"cuBLASLt launch, {out['device']}")
        ax.legend()
        fig.tight_layout()
        return fig

    return save_plot(draw, path)


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--replot", metavar="JSON", help="only plot this written JSON again")
    args = ap.parse_args()
    if args.replot:
        with open(args.replot) as f:
            plot(json.load(f), os.path.join(output_dir(args.out), "lt_launch_bench.png"))
        return
    torch = require_cuda_torch()
    import nvdispatch
    from nvdispatch._cuda import cublaslt as lt

    a, b, bias = (torch.randn(*s, device="cuda") for s in ((16, 16), (16, 16), (16,)))
    with nvdispatch.set_backend("cuda"):
        mm = nvdispatch.Matmul(a, b)
        mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    plan, ops = mm._plan, mm._operands()
    peers = {"torch.matmul": lambda: torch.matmul(a, b)}
    cases = {"cuBLASLt plan.execute, RELU_BIAS": lambda: plan.execute(ops)}
    try:
        import cupy

        ca, cb, cbias = cupy.asarray(a), cupy.asarray(b), cupy.asarray(bias)
        peers["cupy.matmul"] = lambda: cupy.matmul(ca, cb)
        cases["stateless CuPy RELU_BIAS"] = lambda: nvdispatch.matmul(ca, cb, epilog="RELU_BIAS",
                                                                      epilog_inputs={"bias": cbias})
    except ImportError:
        print("cupy not installed: its cases are skipped")
    if torch.cuda.get_device_capability() >= (8, 9):
        e4m3 = torch.float8_e4m3fn
        a8, b8 = a.to(e4m3), b.t().to(e4m3).contiguous().t()
        kw = {"epilog": "RELU_BIAS", "epilog_inputs": {"bias": bias.to(torch.bfloat16)},
              "quantization_scales": {"a": torch.tensor(0.5, device="cuda"), "b": torch.tensor(2.0, device="cuda")},
              "options": {"result_type": "bfloat16"}}
        cases["stateless FP8 RELU_BIAS, device scales"] = lambda: nvdispatch.matmul(a8, b8, **kw)
    launchers = {"ctypes": lt.lib().cublasLtMatmul, "direct": lt.matmul_call()}
    if launchers["direct"] is launchers["ctypes"]:
        cannot_run("nvdispatch._hotpath is not built here (no C compiler at install): nothing to compare")
    samples: dict[str, list[float]] = {}

    def timed(name, fn):
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(200):
            fn()
        samples.setdefault(name, []).append((time.perf_counter() - t0) / 200)
        torch.cuda.synchronize()

    original = lt.matmul_call
    try:
        for _ in progress(range(args.rounds), "rounds"):
            for name, fn in peers.items():
                timed(name, fn)
            for tag, launcher in launchers.items():
                lt.matmul_call = lambda launcher=launcher: launcher  # the plans look the launcher up per launch
                for name, fn in cases.items():
                    timed(f"{name} [{tag}]", fn)
    finally:
        lt.matmul_call = original
    us = {k: statistics.median(v) * 1e6 for k, v in samples.items()}
    out: dict = {"device": torch.cuda.get_device_name(), "us": us}
    for name in cases:
        peer = "cupy.matmul" if "CuPy" in name else "torch.matmul"
        out[name] = {tag: {"us": us[f"{name} [{tag}]"], f"x {peer}": us[f"{name} [{tag}]"] / us[peer]}
                     for tag in launchers}
        print(f"{name:45s} ctypes {us[f'{name} [ctypes]']:6.2f} us  direct {us[f'{name} [direct]']:6.2f} us")
    path = os.path.join(output_dir(args.out), "lt_launch_bench.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print("wrote", path)
    plot(out, os.path.join(output_dir(args.out), "lt_launch_bench.png"))


if __name__ == "__main__":
    main()
