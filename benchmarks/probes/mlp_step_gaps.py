# ruff: noqa: B023 - the closures are used at once, inside the loop
"""GPU probe (not a benchmark of record): where a FusedMLP training step leaves the GPU idle. For plain Torch and
FusedMLP (eagerly; optionally compiled) at one width: the step time (CUDA events) against the sum of its kernels,
the largest gaps on the CUDA timeline (with the kernels around them and the host-side CUDA API calls overlapping
them), the host API calls that took longest, and the host time of each nvdispatch call inside the step (a call
that blocks the host shows as one long call).
python benchmarks/probes/mlp_step_gaps.py relu 4096 [--compile]"""
import argparse
import collections
import sys
import time

sys.path.insert(0, "benchmarks")

import compiled_mlp_bench as B  # noqa: E402
import torch  # noqa: E402
from _profile import step_us  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from nvdispatch.integrations import torch_activation_grad as one_pass  # noqa: E402
from nvdispatch.integrations import torch_mlp_ops as ops  # noqa: E402


def gaps(label, step, x, steps=3):
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step(x)
        torch.cuda.synchronize()
    ev = list(prof.events())
    gpu = sorted((e for e in ev if e.device_type.name == "CUDA"), key=lambda e: e.time_range.start)
    if not gpu:
        print(f"== {label}: no CUDA events")
        return
    busy = sum(e.time_range.elapsed_us() for e in gpu) / steps
    span = (gpu[-1].time_range.end - gpu[0].time_range.start) / steps
    print(f"== {label}: kernels {busy:.0f} us/step, first-to-last {span:.0f} us/step", flush=True)
    holes = []
    for p, q in zip(gpu, gpu[1:]):
        d = q.time_range.start - p.time_range.end
        if d > 8:
            holes.append((d, p, q))
    holes.sort(key=lambda h: -h[0])
    print(f"   gaps > 8 us: {len(holes) / steps:.1f}/step, {sum(h[0] for h in holes) / steps:.0f} us/step")
    api = [e for e in ev if e.device_type.name == "CPU" and e.name.startswith(("cuda", "cu", "nccl"))]
    for d, p, q in holes[:8]:
        lo, hi = p.time_range.end, q.time_range.start
        over = sorted((e for e in ev if e.device_type.name == "CPU" and e.time_range.end > lo and
                       e.time_range.start < hi and e.time_range.elapsed_us() > 15),
                      key=lambda e: -e.time_range.elapsed_us())[:5]  # fmt: skip
        print(f"   gap {d:7.1f} us after {p.name[:60]!r} before {q.name[:60]!r}")
        for e in over:
            print(f"        host {e.time_range.elapsed_us():8.1f} us  {e.name[:80]}")
    agg = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for e in api:
        a = agg[e.name]
        a[0] += 1
        a[1] += e.time_range.elapsed_us()
        a[2] = max(a[2], e.time_range.elapsed_us())
    print("   host CUDA API calls (count/step, total us/step, max us):")
    for name, (c, t, m) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:12]:
        print(f"      {c / steps:6.1f} {t / steps:9.1f} {m:9.1f}  {name}")


def host_calls(step, x, steps=3):
    """Host time of each nvdispatch call FusedMLP makes (wrapped), per step."""
    times = collections.defaultdict(list)
    wrapped = {}
    for mod, name in ((ops.linalg, "matmul"), (one_pass, "activation_backward"), (ops, "_forward_kernel"),
                      (ops, "_backward_kernel")):  # fmt: skip
        fn = getattr(mod, name)
        wrapped[(mod, name)] = fn

        def timed(*a, _fn=fn, _name=name, **k):
            t = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                times[_name].append((time.perf_counter() - t) * 1e6)

        setattr(mod, name, timed)
    try:
        t0 = time.perf_counter()
        for _ in range(steps):
            step(x)
        host = (time.perf_counter() - t0) / steps * 1e6
        torch.cuda.synchronize()
    finally:
        for (mod, name), fn in wrapped.items():
            setattr(mod, name, fn)
    print(f"   host {host:.0f} us/step (queued, not waited for); per call (count/step, total us/step, max us):")
    for name, t in times.items():
        print(f"      {len(t) / steps:5.1f} {sum(t) / steps:9.1f} {max(t):9.1f}  {name}")


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("activation", choices=["relu", "gelu"])
parser.add_argument("width", type=int)
parser.add_argument("--compile", action="store_true", help="also under torch.compile (default mode)")
args = parser.parse_args()
act, width = args.activation, args.width
plain, fused, _, _ = B.make_models(torch, width, 4, act, torch.bfloat16)
x = torch.randn(8192, width, device="cuda", dtype=torch.bfloat16)
modes = [None] + (["default"] if args.compile else [])
for mode in modes:
    torch._dynamo.reset()
    tstep, fstep = B.make_step(torch, plain, mode), B.make_step(torch, fused, mode)
    for _ in range(3):
        tstep(x)
        fstep(x)
    torch.cuda.synchronize()
    print(f"[{act} {width} mode={mode}] choices: {sorted(set(one_pass.choices().values()))}")
    print(f"   step: torch {step_us(tstep, x):.1f} us, fused {step_us(fstep, x):.1f} us", flush=True)
    gaps(f"torch {mode}", tstep, x)
    gaps(f"fused {mode}", fstep, x)
    host_calls(fstep, x)
