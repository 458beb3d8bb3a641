"""Host time of MLP training steps (GPU): how long the Python side of a step takes to queue it, per contender of
``compiled_mlp_bench`` (the same models and step), and where that time goes.

For each contender: the host time per step (``time.perf_counter`` around ``--steps`` steps, no synchronisation
inside; the median of ``--repeats``), the wall time per step (CUDA events, as the benchmark times), and with
``--profile`` a cProfile of 20 steps (own time, the top rows). ``--per-gemm-route`` adds FusedMLP contenders
(eager, compile) whose kernels run every GEMM through the public ``nvdispatch.matmul`` (a call key per GEMM, the
compiled front), for a same-process comparison with the prepared chain (``linalg.prepare_call`` patched to hand
out such calls).
``--graph-logs`` turns on Torch's cudagraphs/perf-hints logs and prints dynamo's counters after the warm-up of
each reduce-overhead contender (a CUDA graph skipped says why there).

    python benchmarks/probes/mlp_host_steps.py --contenders "torch eager" "fused eager" --profile
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
from _bench import require_cuda_torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

CONTENDERS = {
    "torch eager": ("plain", None),
    "torch compile": ("plain", "default"),
    "torch reduce-overhead": ("plain", "reduce-overhead"),
    "fused eager": ("fused", None),
    "fused compile": ("fused", "default"),
    "fused reduce-overhead": ("fused", "reduce-overhead"),
}


def per_gemm_route():
    """Patch ``linalg.prepare_call`` to hand out calls of the public ``matmul`` (the route before the prepared
    chain); returns the undo."""
    import nvdispatch
    from nvdispatch import linalg

    prepare = linalg.prepare_call

    def routed(a, b, epilog=None, epilog_inputs=None):
        hold = linalg.hold_call_plan(a, b, epilog, epilog_inputs)
        names = tuple(epilog_inputs or ())

        def call(a, b, *inputs):
            return nvdispatch.matmul(a, b, epilog=epilog, epilog_inputs=dict(zip(names, inputs)) or None)

        return hold, call

    linalg.prepare_call = routed
    nvdispatch.plan_cache.clear()

    def undo():
        linalg.prepare_call = prepare
        nvdispatch.plan_cache.clear()

    return undo


def host_us(step, x, steps: int, repeats: int) -> float:
    import torch

    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(steps):
            step(x)
        samples.append((time.perf_counter() - t) / steps * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def profile_text(step, x, rows: int) -> str:
    import torch

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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--activation", default="relu", choices=["relu", "gelu"])
    ap.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=list(CONTENDERS))
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--profile", action="store_true", help="cProfile 20 steps of each contender")
    ap.add_argument("--rows", type=int, default=25, help="profile rows printed")
    ap.add_argument("--per-gemm-route", action="store_true", help="also FusedMLP with a matmul call per GEMM")
    ap.add_argument("--graph-logs", action="store_true", help="cudagraphs/perf-hints logs, dynamo counters")
    ap.add_argument("--out", default=None, help="JSON of the figures")
    args = ap.parse_args(argv)
    torch = require_cuda_torch()

    if args.graph_logs:
        torch._logging.set_logs(perf_hints=True, cudagraphs=True, graph_breaks=True, recompiles=True)
    plain, fused, _, _ = B.make_models(torch, args.width, 4, args.activation, torch.bfloat16)
    models = {"plain": plain, "fused": fused}
    x = torch.randn(args.batch, args.width, device="cuda", dtype=torch.bfloat16)
    routed = ("fused eager", "fused compile") if args.per_gemm_route else ()
    runs = [(name, r) for name in args.contenders for r in (False, True) if not r or name in routed]
    results = {}
    reference = None
    for name, routed in tqdm(runs, desc="contenders"):
        label = name + (" (matmul per GEMM)" if routed else "")
        model, mode = CONTENDERS[name]
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()  # (compiled_mlp_bench imported torch._dynamo)
        undo = per_gemm_route() if routed else None
        try:
            step = B.make_step(torch, models[model], mode)
            t0 = time.perf_counter()
            for _ in range(6):
                step(x)
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            grads = [g.clone() for g in B._weights(models[model])]
            if reference is None:
                reference = grads
            error = max(float((p - q).abs().max() / p.abs().max().clamp_min(1e-30)) for p, q in zip(reference, grads))
            if model == "fused" and not routed:
                from nvdispatch.integrations import torch_activation_grad as one_pass

                print(f"{label}: backward forms chosen {sorted(set(one_pass.choices().values()))}", flush=True)
            if args.graph_logs and mode == "reduce-overhead":
                counters = {k: dict(v) for k, v in torch._dynamo.utils.counters.items() if v}
                print(f"{label}: counters {counters}", flush=True)
            host = host_us(step, x, args.steps, args.repeats)
            wall = statistics.median(B.time_step(torch, step, x, 10, args.repeats, 2)) * 1e6
            results[label] = {"host_us": host, "wall_us": wall, "warmup_s": first, "grad_rel_error": error}
            print(f"{label}: host {host:.0f} us/step, wall {wall:.0f} us/step (warm-up {first:.1f} s, weight "
                  f"gradients vs the first contender's: max rel error {error:.2g})", flush=True)  # fmt: skip
            if args.profile:
                print(profile_text(step, x, args.rows), flush=True)
            if args.out:
                with open(args.out, "w") as f:
                    json.dump({"args": vars(args), "results": results}, f, indent=1)
        finally:
            if undo is not None:
                undo()
    return 0


if __name__ == "__main__":
    sys.exit(main())
