"""What the GPU probes measure alike: the CUDA kernels some calls run (torch.profiler), and a training step's
time (CUDA events, through ``compiled_mlp_bench.time_step``). The probes put ``benchmarks/`` on ``sys.path``."""

from __future__ import annotations

import collections
import statistics
from collections.abc import Callable

import compiled_mlp_bench as B
import torch
from torch.profiler import ProfilerActivity, profile


def kernel_table(run: Callable[[], object], n: int, name_width: int = 90) -> tuple[float, list]:
    """Over ``n`` calls of ``run()``: (GPU µs per call of all kernels, [(µs per call, launches per call, kernel
    name)] slowest first)."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            run()
        torch.cuda.synchronize()
    agg = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type.name == "CUDA":
            k = agg[e.name[:name_width]]
            k[0] += 1
            k[1] += e.device_time
    total = sum(v[1] for v in agg.values()) / n
    return total, sorted(((v[1] / n, v[0] // n, k) for k, v in agg.items()), reverse=True)


def step_us(step, x, steps: int = 10) -> float:
    """µs per step: the median of 3 samples of ``steps`` back-to-back steps."""
    return statistics.median(B.time_step(torch, step, x, steps, 3, 0)) * 1e6
