"""Host time of ``fft.convolve``'s Numba-kernel strategies per call: their kernels launched by ``cuLaunchKernel``
with parameters packed at plan time (the compiled extension, what plans do where they can) against Numba's
launch of the same kernels (what they did before, and do without the extension), on one GPU, in one process.

Cells (``--cells``): the issue's table, c64 with one filter row: ``65536x1024`` and ``8192x4096``
(``device-fused``), ``1024x16384`` and ``256x65536`` (``four-step``). For each cell the strategy's plan is made
twice (the second with the prepared launch marked unavailable, so Numba launches: nothing else differs); the
``unfused`` strategy's plan (cuFFT, the prepared multiply, cuFFT), Torch's and CuPy's ``ifft(fft(x) * h)`` are
timed alongside; with ``--variants`` the four-step's other configurations too (prepared launches;
``fft_four_step.four_step_variants``, what the timed choice tries). ``--budget`` seconds bounds the run: the
cells left when it is spent are skipped (the first plan of a cell compiles its kernels, seconds each). Reported
per variant:

* host us per call: the best of ``--loops`` loops of ``--number`` calls (the GPU synchronised between loops,
  outside the timing), of ``plan.execute`` and of the launches alone (the plan's launcher on its pointers);
* us per call of a long burst: ``--number`` back-to-back calls timed with CUDA events, the median of ``--loops``
  (what a caller calling in a loop waits for: the larger of the host's and the GPU's time);
* the share of the HBM floor: a device-to-device copy of ``x`` (one read, one write) over the strategy's time;
* the results: equal bit for bit between the two launches, the largest error against float64 NumPy on a few
  rows.

    python benchmarks/convolve_launch_host.py [--cells 65536x1024,1024x16384] [--loops 5] [--number 50]
        [--budget 100] [--variants]

Writes ``DIR/convolve_launch_host.json`` after every cell. Needs an NVIDIA GPU, Torch with CUDA and numba-cuda
(exit status 2 otherwise). The first plan of a cell compiles its kernels (seconds each).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from unittest import mock

import numpy as np
from _bench import output_dir, parser, progress, require_cuda_torch, require_numba_gpu

CELLS = {
    "65536x1024": (65536, 1024, "device-fused"),
    "1024x16384": (1024, 16384, "four-step"),
    "256x65536": (256, 65536, "four-step"),
    "8192x4096": (8192, 4096, "device-fused"),
}
CHECK_ROWS = 3


def best_host_us(fn, torch, loops: int, number: int) -> float:
    """The best loop's host microseconds per call (the GPU synchronised before each loop, outside the timing)."""
    best = float("inf")
    for _ in range(loops):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    torch.cuda.synchronize()
    return best * 1e6


def burst_us(fn, torch, loops: int, number: int) -> float:
    """The median over ``loops`` bursts of ``number`` calls of the microseconds per call, by CUDA events."""
    times = []
    for _ in range(loops):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(number):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3 / number)
    return statistics.median(times)


def _plans(strategy: str, problem):
    from nvdispatch.executors import cuda_fft_convolve as op
    from nvdispatch.executors import cuda_numba_launch

    t0 = time.perf_counter()
    prepared = op.plan(problem, strategy)
    compile_s = time.perf_counter() - t0
    with mock.patch.object(cuda_numba_launch, "unavailable", lambda: "the benchmark launches by Numba"):
        by_numba = op.plan(problem, strategy)
    return prepared, by_numba, compile_s


def _launch_only(plan, operands, torch):
    """The plan's launches alone, on the pointers of ``x``, a result-sized buffer, ``h`` and scratch."""
    x, h = operands["x"], operands["h"]
    out = torch.empty_like(x)
    scratch = torch.empty(getattr(plan, "scratch_bytes", 16), dtype=torch.uint8, device=x.device)
    s = torch.cuda.current_stream().cuda_stream
    base = scratch.data_ptr()
    if hasattr(plan, "scratch_bytes"):  # the four-step: intermediate, permuted filter, dummy
        ptrs = (
            x.data_ptr(),
            out.data_ptr(),
            h.data_ptr(),
            base,
            base + plan.filter_offset,
            base + plan.scratch_bytes - 16,
        )
    else:
        ptrs = (x.data_ptr(), out.data_ptr(), h.data_ptr())
    return lambda: plan.launcher(s, ptrs), (out, scratch)


def _cupy():
    try:
        import cupy
    except ImportError:
        return None
    return cupy


def _variant_plans(strategy: str, problem) -> dict:
    """``label -> plan`` of the four-step's configurations after the default one (none for other strategies)."""
    if strategy != "four-step":
        return {}
    from nvdispatch.device.fft_four_step import four_step_variants
    from nvdispatch.executors.cuda_fft_convolve import MOST_FOUR_STEP
    from nvdispatch.executors.cuda_fft_convolve_four_step import FourStepConvolvePlan

    f = problem.forward
    variants = four_step_variants(f.lengths[0], f.real_dtype, MOST_FOUR_STEP)[1:]
    plans = {}
    for v in variants:
        try:
            plans[f"four-step {v.label} cuLaunchKernel"] = FourStepConvolvePlan(problem, "four-step", v)
        except Exception as exc:  # noqa: BLE001 - a configuration the GPU refuses (shared memory) is left out
            print(f"four-step {v.label}: left out ({type(exc).__name__}: {exc})", flush=True)
    return plans


def run_cell(name: str, torch, loops: int, number: int, variants: bool = False) -> dict:
    from nvdispatch._fft_convolve import prepare
    from nvdispatch.executors import cuda_fft_convolve as op

    rows, n, strategy = CELLS[name]
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((rows, n), np.float32) + 1j * rng.standard_normal((rows, n), np.float32)).astype(
        np.complex64
    )
    hn = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(np.complex64)
    xt, ht = torch.from_numpy(x).cuda(), torch.from_numpy(hn).cuda()
    problem, operands = prepare(xt, ht, None, -1)
    prepared, by_numba, compile_s = _plans(strategy, problem)
    launch_prepared, keep1 = _launch_only(prepared, operands, torch)
    launch_numba, keep2 = _launch_only(by_numba, operands, torch)
    unfused = op.plan(problem, "unfused")
    cases = {
        f"{strategy} cuLaunchKernel": lambda: prepared.execute(operands),
        f"{strategy} Numba launch": lambda: by_numba.execute(operands),
        "launches alone cuLaunchKernel": launch_prepared,
        "launches alone Numba": launch_numba,
        "unfused (prepared multiply)": lambda: unfused.execute(operands),
        "torch ifft(fft(x)*h)": lambda: torch.fft.ifft(torch.fft.fft(xt) * ht),
    }
    others = _variant_plans(strategy, problem) if variants else {}
    for label, plan in others.items():
        cases[label] = lambda plan=plan: plan.execute(operands)
    copy_dst = torch.empty_like(xt)
    cases["d2d copy of x (the HBM floor)"] = lambda: copy_dst.copy_(xt)
    cupy = _cupy()
    if cupy is not None:
        xc, hc = cupy.asarray(x), cupy.asarray(hn)
        cases["cupy ifft(fft(x)*h)"] = lambda: cupy.fft.ifft(cupy.fft.fft(xc) * hc)
    for fn in cases.values():  # warm up: allocator pools, cuFFT plans, Numba's dispatch caches
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    if cupy is not None:
        cupy.cuda.Device().synchronize()
    host = {k: best_host_us(fn, torch, loops, number) for k, fn in progress(cases.items(), f"{name} host")}
    burst = {k: burst_us(fn, torch, loops, number) for k, fn in progress(cases.items(), f"{name} burst")}
    a, b = prepared.execute(operands), by_numba.execute(operands)
    checked = {strategy: a, "unfused": unfused.execute(operands)}
    checked.update({label: plan.execute(operands) for label, plan in others.items()})
    torch.cuda.synchronize()
    want = np.fft.ifft(np.fft.fft(x[:CHECK_ROWS].astype(np.complex128)) * hn.astype(np.complex128))
    err = {
        label: float(np.abs(r[:CHECK_ROWS].cpu().numpy() - want).max() / np.abs(want).max())
        for label, r in checked.items()
    }
    del keep1, keep2
    return {
        "cell": name,
        "strategy": strategy,
        "plan_and_compile_s": round(compile_s, 1),
        "launch": [prepared.launcher.how, by_numba.launcher.how],
        "host_us_per_call": {k: round(v, 1) for k, v in host.items()},
        "burst_us_per_call": {k: round(v, 1) for k, v in burst.items()},
        "host_ratio_numba_over_prepared": round(
            host[f"{strategy} Numba launch"] / host[f"{strategy} cuLaunchKernel"], 2
        ),
        "burst_speedup": {
            f"{mine} vs {peer}": round(burst[peer] / burst[mine], 2)
            for mine in (
                f"{strategy} cuLaunchKernel",
                f"{strategy} Numba launch",
                "unfused (prepared multiply)",
                *others,
            )
            for peer in ("torch ifft(fft(x)*h)", "cupy ifft(fft(x)*h)")
            if peer in burst
        },
        "hbm_floor_share": round(burst["d2d copy of x (the HBM floor)"] / burst[f"{strategy} cuLaunchKernel"], 2),
        "bitwise_equal": bool(torch.equal(a, b)),
        "max_rel_error_vs_numpy": err,
    }


def launch_parser(doc: str, cells) -> argparse.ArgumentParser:
    """The launch-host scripts' options: ``--out``, ``--cells`` (among ``cells``), ``--loops``, ``--number``."""
    ap = parser(doc)
    ap.add_argument("--cells", default=",".join(cells), help="comma-separated cells (default: %(default)s)")
    ap.add_argument("--loops", type=int, default=5, help="timed loops or bursts per case (default: %(default)s)")
    ap.add_argument("--number", type=int, default=50, help="calls per loop (default: %(default)s)")
    return ap


def chosen_cells(ap: argparse.ArgumentParser, args, cells) -> list[str]:
    """The cells ``--cells`` names, in its order; a usage error for one not among ``cells``."""
    names = [c for c in args.cells.split(",") if c]
    unknown = [c for c in names if c not in cells]
    if unknown:
        ap.error(f"unknown cells {unknown}; choose from {list(cells)}")
    return names


def main(argv: list[str] | None = None) -> None:
    ap = launch_parser(__doc__, CELLS)
    ap.add_argument("--budget", type=float, default=100.0, help="seconds for the run (default: %(default)s)")
    ap.add_argument("--variants", action="store_true", help="time the four-step's other configurations too")
    args = ap.parse_args(argv)
    names = chosen_cells(ap, args, CELLS)
    torch = require_cuda_torch()
    require_numba_gpu()
    out_path = os.path.join(output_dir(args.out), "convolve_launch_host.json")
    results = {"gpu": torch.cuda.get_device_name(0), "loops": args.loops, "number": args.number, "cells": []}
    start = time.perf_counter()
    for name in names:
        if time.perf_counter() - start > args.budget:
            results["cells"].append({"cell": name, "skipped": "budget"})
            continue
        cell = run_cell(name, torch, args.loops, args.number, args.variants)
        results["cells"].append(cell)
        print(json.dumps(cell, indent=1), flush=True)
        with open(out_path, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=1)
    print("wrote", out_path)


if __name__ == "__main__":
    main()
