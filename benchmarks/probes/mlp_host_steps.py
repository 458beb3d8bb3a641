"""Host time of MLP training steps (GPU): how long the Python side of a step takes to queue it, per contender of
``compiled_mlp_bench`` (the same models and step), and where that time goes.

Every contender gets a model of its own (the same weights), is warmed up (compiled, its CUDA graphs recorded),
then all are timed **in turns**, ``--rounds`` rounds (a slow or noisy host then biases no contender): per round
and contender a few warm-up steps, the host time per step (``time.perf_counter`` around ``--steps`` steps, no
synchronisation inside) and the wall time per step (CUDA events around ``--steps`` steps, as the benchmark
times). Medians are reported, with ratios to ``torch eager`` and to the best Torch mode, and the share of a core
other processes used meanwhile. ``--kernels``: the GPU time per step of each contender (the sum of its CUDA
kernels, torch.profiler). ``--profile``: a cProfile of 20 steps of each (own time, the top ``--rows`` rows).
``--per-gemm-route`` adds FusedMLP contenders (eager, compile) whose kernels run every GEMM through the public
``nvdispatch.matmul`` (a call key per GEMM, the compiled front; ``linalg.prepare_call`` patched to hand out such
calls, the plan cache cleared whenever the route changes). ``--graph-logs`` turns on Torch's cudagraphs and
perf-hints logs and prints dynamo's counters after each reduce-overhead contender's warm-up. ``--backward-nodes``:
the host time of each contender's backward per autograd node (torch.profiler CPU events: the engine's
``evaluate_function`` of the compiled backward, each AccumulateGrad, the loss's nodes) and the ATen ops under
AccumulateGrad (a copy there: a gradient not taken as it came) and under the compiled backward (copies: CUDA-graph
inputs into static buffers).

    python benchmarks/probes/mlp_host_steps.py --contenders "torch eager" "fused eager" --rounds 7 --kernels
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import compiled_mlp_bench as B  # noqa: E402
from _bench import ForeignLoad, require_cuda_torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

CONTENDERS = {
    "torch eager": ("plain", None),
    "torch compile": ("plain", "default"),
    "torch reduce-overhead": ("plain", "reduce-overhead"),
    "fused eager": ("fused", None),
    "fused compile": ("fused", "default"),
    "fused reduce-overhead": ("fused", "reduce-overhead"),
}
ROUTED = " (matmul per GEMM)"


class Route:
    """Which calls ``linalg.prepare_call`` hands out: the prepared direct calls (``routed`` False) or calls of the
    public ``matmul`` per GEMM; the plan cache is cleared on every change (the chains prepare anew)."""

    def __init__(self):
        from nvdispatch import linalg

        self.linalg, self.prepare, self.routed = linalg, linalg.prepare_call, False

    def set(self, routed: bool) -> None:
        import nvdispatch

        if routed == self.routed:
            return
        self.linalg.prepare_call = self._routed if routed else self.prepare
        self.routed = routed
        nvdispatch.plan_cache.clear()

    def _routed(self, a, b, epilog=None, epilog_inputs=None):
        import nvdispatch

        hold = self.linalg.hold_call_plan(a, b, epilog, epilog_inputs)
        names = tuple(epilog_inputs or ())

        def call(a, b, *inputs):
            return nvdispatch.matmul(a, b, epilog=epilog, epilog_inputs=dict(zip(names, inputs)) or None)

        return hold, call


def host_and_wall(torch, step, x, steps: int) -> tuple[float, float]:
    """(host µs per step, wall µs per step) of ``steps`` steps each, after 3 warm-up steps."""
    for _ in range(3):
        step(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        step(x)
    host = (time.perf_counter() - t) / steps * 1e6
    torch.cuda.synchronize()
    return host, B.time_step(torch, step, x, steps, 1, 0)[0] * 1e6


def profile_text(torch, step, x, rows: int) -> str:
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(20):
        step(x)
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(rows)
    return s.getvalue()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--activation", default="relu", choices=["relu", "gelu"])
    ap.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=list(CONTENDERS))
    ap.add_argument("--steps", type=int, default=30, help="steps per sample")
    ap.add_argument("--rounds", type=int, default=5, help="samples per contender, taken in turns")
    ap.add_argument("--kernels", action="store_true", help="GPU time per step of each contender (torch.profiler)")
    ap.add_argument("--profile", action="store_true", help="cProfile 20 steps of each contender")
    ap.add_argument("--rows", type=int, default=25, help="profile rows printed")
    ap.add_argument("--per-gemm-route", action="store_true", help="also FusedMLP with a matmul call per GEMM")
    ap.add_argument("--graph-logs", action="store_true", help="cudagraphs/perf-hints logs, dynamo counters")
    ap.add_argument("--backward-nodes", action="store_true", help="host time per backward node (torch.profiler)")
    ap.add_argument("--out", default=None, help="JSON of the figures")
    args = ap.parse_args(argv)
    torch = require_cuda_torch()
    from nvdispatch.integrations import torch_activation_grad as one_pass

    if args.graph_logs:
        torch._logging.set_logs(perf_hints=True, cudagraphs=True, graph_breaks=True, recompiles=True)
    routed = ("fused eager", "fused compile") if args.per_gemm_route else ()
    labels = [name + r for name in args.contenders for r in ("", ROUTED) if not r or name in routed]
    x = torch.randn(args.batch, args.width, device="cuda", dtype=torch.bfloat16)
    route = Route()
    steps, results = {}, {}
    reference = None
    for label in tqdm(labels, desc="warm-up"):
        name = label.removesuffix(ROUTED)
        kind, mode = CONTENDERS[name]
        plain, fused, _, _ = B.make_models(torch, args.width, 4, args.activation, torch.bfloat16)
        model = plain if kind == "plain" else fused
        route.set(label.endswith(ROUTED))
        torch._dynamo.utils.counters.clear()
        step = steps[label] = B.make_step(torch, model, mode)
        t0 = time.perf_counter()
        for _ in range(6):
            step(x)
        torch.cuda.synchronize()
        grads = [g.float() for g in B._weights(model)]
        reference = grads if reference is None else reference
        error = max(float((p - q).abs().max() / p.abs().max().clamp_min(1e-30)) for p, q in zip(reference, grads))
        results[label] = {"warmup_s": time.perf_counter() - t0, "grad_rel_error": error, "host": [], "wall": []}
        print(f"{label}: warm-up {results[label]['warmup_s']:.1f} s, weight gradients vs {labels[0]}'s: max rel "
              f"error {error:.2g}", flush=True)  # fmt: skip
        if args.graph_logs and mode == "reduce-overhead":
            counters = {k: dict(v) for k, v in torch._dynamo.utils.counters.items() if v}
            print(f"{label}: counters {counters}", flush=True)
    print(f"backward forms chosen: {sorted(set(one_pass.choices().values()))}", flush=True)
    with ForeignLoad() as load:
        for _ in tqdm(range(args.rounds), desc="rounds"):
            for label in labels:
                route.set(label.endswith(ROUTED))
                host, wall = host_and_wall(torch, steps[label], x, args.steps)
                results[label]["host"].append(host)
                results[label]["wall"].append(wall)
    summary = {label: {k: statistics.median(r[k]) for k in ("host", "wall")} for label, r in results.items()}
    torch_modes = [label for label in summary if label.startswith("torch")]
    best_torch = min((summary[label]["wall"], label) for label in torch_modes) if torch_modes else None
    print(f"\nmedians of {args.rounds} rounds taken in turns ({args.steps} steps each; other processes used "
          f"{load.share if load.share is None else round(load.share, 2)} of a core meanwhile):")  # fmt: skip
    for label, s in summary.items():
        ratio = "" if best_torch is None else f", wall / best Torch ({best_torch[1]}) {s['wall'] / best_torch[0]:.3f}"
        print(f"  {label:36s} host {s['host']:7.0f} us/step, wall {s['wall']:7.0f} us/step{ratio}", flush=True)
    if args.kernels:
        sys.path.insert(0, os.path.dirname(__file__))
        from _profile import kernel_table

        print("\nGPU time per step (sum of kernels, 5 steps):", flush=True)
        for label in labels:
            route.set(label.endswith(ROUTED))
            for _ in range(3):
                steps[label](x)
            total, rows = kernel_table(lambda: steps[label](x), 5)  # noqa: B023 - called at once
            results[label]["gpu_us"] = total
            print(f"  {label:36s} {total:7.0f} us ({sum(r[1] for r in rows)} launches)", flush=True)
            for us, n, name in rows[:6]:
                print(f"      {us:7.1f} us {n:3d}x  {name}", flush=True)
    if args.backward_nodes:
        sys.path.insert(0, os.path.dirname(__file__))
        from _profile import backward_nodes

        print("\nbackward host time per autograd node (torch.profiler CPU events, 5 steps):", flush=True)
        for label in labels:
            route.set(label.endswith(ROUTED))
            for _ in range(3):
                steps[label](x)
            got = results[label]["backward_nodes"] = backward_nodes(lambda: steps[label](x), 5)  # noqa: B023
            print(f"  {label}:", flush=True)
            for node, (us, count) in got["nodes"].items():
                print(f"      {us:8.1f} us {count:4.1f}x  {node}", flush=True)
            print(f"      under AccumulateGrad: {got['accumulate']}", flush=True)
            print(f"      under the compiled backward: {got['in_backward']}", flush=True)
    if args.profile:
        for label in labels:
            route.set(label.endswith(ROUTED))
            print(f"\n== {label}\n{profile_text(torch, steps[label], x, args.rows)}", flush=True)
    route.set(False)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "foreign_load": load.share, "summary": summary, "results": results}, f,
                      indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
