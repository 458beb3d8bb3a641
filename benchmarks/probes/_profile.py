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


def backward_nodes(run: Callable[[], object], n: int) -> dict:
    """Host time of a training step's backward, per autograd node, over ``n`` calls of ``run()`` (torch.profiler,
    CPU events, whichever thread runs them): ``{"nodes": {node: (µs per call, evaluations per call)}, "accumulate":
    {op under AccumulateGrad: count per call}, "in_backward": {op under a compiled backward: count per call}}``.
    An AccumulateGrad with only ``aten::detach`` under it took the gradient as it came; ``aten::clone``/``copy_``
    there means a copy made to meet the parameter's layout (or a gradient still referenced elsewhere); copies under
    a compiled backward are CUDA-graph inputs copied into their static buffers."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(n):
            run()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    prefix = "autograd::engine::evaluate_function: "
    nodes = collections.defaultdict(lambda: [0.0, 0])
    accumulate: collections.Counter = collections.Counter()
    in_backward: collections.Counter = collections.Counter()
    for e in prof.events():
        if not e.name.startswith(prefix):
            continue
        node = e.name[len(prefix):]
        nodes[node][0] += e.cpu_time_total
        nodes[node][1] += 1
        if "AccumulateGrad" in node:
            accumulate.update(c.name for c in _descendants(e) if c.name.startswith("aten::"))
        elif "Compiled" in node:
            in_backward.update(c.name for c in _descendants(e) if c.name in _COPIES)
    return {
        "nodes": {k: (v[0] / n, v[1] / n) for k, v in sorted(nodes.items(), key=lambda kv: -kv[1][0])},
        "accumulate": {k: v / n for k, v in accumulate.items()},
        "in_backward": {k: v / n for k, v in in_backward.items()},
    }


_COPIES = ("aten::copy_", "aten::_foreach_copy_", "aten::clone", "aten::_to_copy")


def _descendants(event):
    for child in event.cpu_children:
        yield child
        yield from _descendants(child)
