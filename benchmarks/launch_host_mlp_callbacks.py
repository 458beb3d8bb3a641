"""Host time per call of the two other places that launch generated Numba kernels: FusedMLP's one-pass backward
(``torch_activation_grad.activation_backward``: two kernels) and the device-fused FFT with callbacks (one kernel,
its data arrays as arguments), their launches prepared (``cuLaunchKernel`` with parameters packed at plan time,
what plans do where they can) against Numba's launch of the same kernels (what they did before), with Torch's
unfused form of the same work alongside, on one GPU, in one process.

Cells (``--cells``): ``relu-256x1024``, ``gelu-8192x4096`` (bfloat16 one-pass backward, ``M x N``), ``cb-64x1024``,
``cb-8192x1024`` (c64 ``fft`` of ``rows x n`` with a prolog multiplying by a filter ``h[i % n]``). Reported per
case: host us per call (the best of ``--loops`` loops of ``--number`` calls, the GPU synchronised between loops
outside the timing), us per call of a burst of ``--number`` calls by CUDA events (median of ``--loops``), the
host ratio Numba / prepared, and whether the two launches give the same bits.

    python benchmarks/launch_host_mlp_callbacks.py [--cells relu-256x1024,cb-64x1024] [--loops 5] [--number 50]

Writes ``DIR/launch_host_mlp_callbacks.json`` after every cell. Needs an NVIDIA GPU, Torch with CUDA and numba-cuda
(exit status 2 otherwise). The first plan of a cell compiles its kernels (seconds each).
"""

from __future__ import annotations

import json
import os
from unittest import mock

import numpy as np
from _bench import output_dir, progress, require_cuda_torch, require_numba_gpu
from convolve_launch_host import best_host_us, burst_us, chosen_cells, launch_parser

CELLS = {
    "relu-256x1024": ("relu", 256, 1024),
    "gelu-8192x4096": ("gelu", 8192, 4096),
    "cb-64x1024": ("callbacks", 64, 1024),
    "cb-8192x1024": ("callbacks", 8192, 1024),
}


def _by_numba(make):
    from nvdispatch.executors import cuda_numba_launch

    with mock.patch.object(cuda_numba_launch, "unavailable", lambda: "the benchmark launches by Numba"):
        return make()


def one_pass_cases(kind: str, m: int, n: int, torch) -> tuple[dict, tuple, list[str]]:
    from nvdispatch.executors import cuda_activation_grad as executor
    from nvdispatch.integrations import torch_activation_grad as one_pass

    g = torch.randn(m, n, device="cuda").to(torch.bfloat16)
    z = torch.randn(m, n, device="cuda").to(torch.bfloat16)
    saved = torch.relu(z) if kind == "relu" else z
    prepared = one_pass.activation_backward(kind, g, saved)  # makes the cached plan
    index = torch.cuda.current_device()
    numba_plan = _by_numba(lambda: executor.ActivationGradPlan(kind, m, n, None, index, False))
    cached = one_pass.plan_for(kind, m, n, None, index)

    def by_numba():  # activation_backward's steps, by the plan launching through Numba (no cache lookup)
        dz = torch.empty_like(g)
        partials = torch.empty((numba_plan.partial_rows, n), device=g.device, dtype=torch.float32)
        sums = torch.empty((n,), device=g.device, dtype=torch.bfloat16)
        stream = torch.cuda.current_stream(g.device).cuda_stream
        numba_plan(stream, g.data_ptr(), saved.data_ptr(), dz.data_ptr(), partials.data_ptr(), sums.data_ptr())
        return dz, sums

    def torch_unfused():
        if kind == "relu":
            dz = g * (saved > 0)
        else:
            dz = torch.ops.aten.gelu_backward(g, z, approximate="tanh")
        return dz, dz.sum(0)

    cases = {
        "one-pass cuLaunchKernel": lambda: one_pass.activation_backward(kind, g, saved),
        "one-pass Numba launch": by_numba,
        "torch unfused (derivative, then sum)": torch_unfused,
    }
    a, b = prepared, by_numba()
    torch.cuda.synchronize()
    return cases, (torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])), [cached.launcher.how, numba_plan.launcher.how]


def times_filter(v, i, h):
    return v * h[i % h.shape[0]]


def callback_cases(rows: int, n: int, torch) -> tuple[dict, bool, list[str]]:
    from nvdispatch._fft_callbacks import prepare
    from nvdispatch.executors import cuda_fft_callbacks as op

    rng = np.random.default_rng(0)
    x = (rng.standard_normal((rows, n)) + 1j * rng.standard_normal((rows, n))).astype(np.complex64)
    xt = torch.from_numpy(x).cuda()
    h = torch.randn(n, device="cuda")
    problem, operands = prepare("fft", xt, None, -1, None, None, "backward", times_filter, None, (h,), None)
    prepared = op.plan(problem, "device-fused")
    numba_plan = _by_numba(lambda: op.plan(problem, "device-fused"))
    cases = {
        "device-fused cuLaunchKernel": lambda: prepared.execute(operands),
        "device-fused Numba launch": lambda: numba_plan.execute(operands),
        "torch fft(x * h)": lambda: torch.fft.fft(xt * h),
    }
    a, b = prepared.execute(operands), numba_plan.execute(operands)
    torch.cuda.synchronize()
    return cases, bool(torch.equal(a, b)), [prepared.launcher.how, numba_plan.launcher.how]


def run_cell(name: str, torch, loops: int, number: int) -> dict:
    what, m, n = CELLS[name]
    cases, equal, how = callback_cases(m, n, torch) if what == "callbacks" else one_pass_cases(what, m, n, torch)
    for fn in cases.values():  # warm up: allocator pools, cuFFT plans, Numba's dispatch caches
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    host = {k: best_host_us(fn, torch, loops, number) for k, fn in progress(cases.items(), f"{name} host")}
    burst = {k: burst_us(fn, torch, loops, number) for k, fn in progress(cases.items(), f"{name} burst")}
    labels = list(cases)
    return {
        "cell": name,
        "launch": how,
        "host_us_per_call": {k: round(v, 1) for k, v in host.items()},
        "burst_us_per_call": {k: round(v, 1) for k, v in burst.items()},
        "host_ratio_numba_over_prepared": round(host[labels[1]] / host[labels[0]], 2),
        "burst_speedup_vs_torch": round(burst[labels[2]] / burst[labels[0]], 2),
        "bitwise_equal": bool(equal),
    }


def main(argv: list[str] | None = None) -> None:
    ap = launch_parser(__doc__, CELLS)
    args = ap.parse_args(argv)
    names = chosen_cells(ap, args, CELLS)
    torch = require_cuda_torch()
    require_numba_gpu()
    out_path = os.path.join(output_dir(args.out), "launch_host_mlp_callbacks.json")
    results = {"gpu": torch.cuda.get_device_name(0), "loops": args.loops, "number": args.number, "cells": []}
    for name in names:
        cell = run_cell(name, torch, args.loops, args.number)
        results["cells"].append(cell)
        print(json.dumps(cell, indent=1), flush=True)
        with open(out_path, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=1)
    print("wrote", out_path)


if __name__ == "__main__":
    main()
