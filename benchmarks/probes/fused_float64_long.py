"""Could the one-kernel convolution (``device-fused``) take double-precision signals longer than 4096 points?

Since an H200 run (commit 3fc82b4) the device engine stops float64 Block FFTs at 4096 points
(``nvdispatch.device.fft_config.MAX_SIZE_FLOAT64``): 8192-point blocks "ran out of registers at launch". That run
launched user kernels built without launch bounds; the convolution's generated kernel is compiled with
``launch_bounds`` (the compiler keeps each thread within what the block may have, spilling if it must), so the
limit may be the user kernels', not the convolution's. This probe lifts the limit **in its own process only**
and, for each length, complex/real signal and elements per thread, reports: registers per thread, local memory
per thread (spills), shared memory per block, whether the kernel launches, its largest error against float64
NumPy on a few rows, and its GPU time per call (CUDA events, median of bursts) beside the strategies the route
offers without it (``unfused``, ``cufft-lto``/``cufft-lto-load``) and Torch's ``ifft(fft(x) * h)``. One line per
configuration; ``--out`` writes the JSON.

If a configuration launches, matches NumPy and beats the route's other strategies, the limit for the convolution
could become a per-configuration rule (registers at launch) instead of a length; if none does, the limit stands
and the GPU tests' cases must not ask for it (they do not: ``tests/fft/convolve_cases.py``).

    python benchmarks/probes/fused_float64_long.py [--lengths 8192] [--dtypes complex128 float64] [--rows 2048]
        [--out DIR]

Needs an NVIDIA GPU, Torch with CUDA and numba-cuda.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _bench import cuda_event_seconds  # noqa: E402


def per_signature(value) -> int | None:
    """A Numba dispatcher's per-kernel figure (an int, or a dict by signature: the largest)."""
    if isinstance(value, dict):
        return max(value.values()) if value else None
    return value


def gpu_seconds(torch, fn, rounds: int = 5, target_s: float = 2e-2) -> float:
    """Median seconds per call of ``fn`` over ``rounds`` bursts of about ``target_s`` of GPU time each."""
    once = cuda_event_seconds(fn, torch, reps=1, inner=1, warmup=1)
    burst = max(1, min(200, round(target_s / max(once, 1e-6))))
    return cuda_event_seconds(fn, torch, reps=rounds, inner=burst, warmup=0)


def probe_case(torch, dtype: str, n: int, rows: int, g, records: list) -> bool:
    """Every elements-per-thread configuration of ``device-fused`` for ``rows`` signals of ``n`` points of
    ``dtype`` (one filter row), beside the route's other strategies and Torch; appends to ``records``. False when
    a kernel fault ended the GPU context."""
    import numpy as np

    from nvdispatch._fft_convolve import prepare
    from nvdispatch.device.fft_config import valid_elements_per_thread
    from nvdispatch.executors import cuda_fft_convolve as op

    real = dtype == "float64"
    if real:
        x = torch.randn(rows, n, device="cuda", dtype=torch.float64, generator=g)
    else:
        x = torch.complex(
            torch.randn(rows, n, device="cuda", dtype=torch.float64, generator=g),
            torch.randn(rows, n, device="cuda", dtype=torch.float64, generator=g),
        )
    m = n // 2 + 1 if real else n
    h = torch.randn(m, device="cuda", dtype=torch.complex128, generator=g)
    problem, operands = prepare(x, h, None, -1)
    checked = [0, rows // 2, rows - 1]
    xs, hs = x[checked].cpu().numpy(), h.cpu().numpy()
    want = np.fft.irfft(np.fft.rfft(xs) * hs, n) if real else np.fft.ifft(np.fft.fft(xs) * hs)

    def peer():
        return torch.fft.irfft(torch.fft.rfft(x) * h, n) if real else torch.fft.ifft(torch.fft.fft(x) * h)

    base = {"torch": gpu_seconds(torch, peer)}
    for strategy in [s for s in op.strategies(problem) if s not in ("timed", "device-fused")]:
        plan = op.plan(problem, strategy)
        try:
            base[strategy] = gpu_seconds(torch, lambda plan=plan: plan.execute(operands))
        finally:
            plan.release()
    best = min(base, key=base.get)
    said = ", ".join(f"{k} {v * 1e6:.1f}" for k, v in base.items())
    print(f"{dtype} {rows}x{n}: without device-fused (us): {said}", flush=True)
    for ept in valid_elements_per_thread(n, "r2c" if real else "c2c"):
        rec = {"dtype": dtype, "rows": rows, "n": n, "ept": ept, "baseline_us": {k: v * 1e6 for k, v in base.items()}}
        records.append(rec)
        label = f"{dtype} {rows}x{n} device-fused ept={ept}"
        t0 = time.perf_counter()
        try:
            plan = op.FusedConvolvePlan(problem, "device-fused", ept)
            disp = plan.kernel.kernel
            rec.update(
                compile_s=time.perf_counter() - t0,
                threads=int(np.prod(plan.kernel.block_dim)),
                regs=per_signature(disp.get_regs_per_thread()),
                local_bytes=per_signature(disp.get_local_mem_per_thread()),
                shared_bytes=plan.kernel.shared_memory_size,
            )
            got = plan.execute(operands)
            torch.cuda.synchronize()
            rec["max_rel_error"] = float(np.abs(got[checked].cpu().numpy() - want).max() / np.abs(want).max())
            rec["us"] = gpu_seconds(torch, lambda plan=plan: plan.execute(operands)) * 1e6
            rec["vs_best_other"] = base[best] * 1e6 / rec["us"]
            print(
                f"{label}: {rec['threads']} threads, {rec['regs']} regs, {rec['local_bytes']} B local (spills), "
                f"{rec['shared_bytes']} B shared; err {rec['max_rel_error']:.1e}; {rec['us']:.1f} us = "
                f"{rec['vs_best_other']:.2f}x {best}; compiled in {rec['compile_s']:.1f} s",
                flush=True,
            )
        except Exception as exc:  # noqa: BLE001 - the probe's answer for this configuration
            rec["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            print(f"{label}: FAILED {rec['error']}", flush=True)
            try:
                torch.cuda.synchronize()
            except Exception as after:  # noqa: BLE001 - a kernel fault ends the context: stop here
                print(f"the GPU context did not survive ({after}); stopping", flush=True)
                return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[8192], help="signal lengths (default: %(default)s)")
    ap.add_argument(
        "--dtypes", nargs="+", default=["complex128", "float64"], choices=["complex128", "float64"], help="x dtypes"
    )
    ap.add_argument("--rows", type=int, default=2048, help="signals per batch (default: %(default)s)")
    ap.add_argument("--out", default=None, metavar="DIR", help="write fused_float64_long.json there")
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("fused_float64_long.py: cannot run here: needs an NVIDIA GPU and Torch with CUDA", file=sys.stderr)
        return 2
    from nvdispatch.device import fft_config

    limit = fft_config.MAX_SIZE_FLOAT64
    fft_config.MAX_SIZE_FLOAT64 = max(limit, *args.lengths)  # this process only: the probe's question
    print(f"{torch.cuda.get_device_name()}: float64 Block limit lifted from {limit} to {fft_config.MAX_SIZE_FLOAT64}")
    g = torch.Generator(device="cuda").manual_seed(0)
    records: list[dict] = []
    cases = [(dtype, n) for dtype in args.dtypes for n in args.lengths]
    for dtype, n in cases:
        if not probe_case(torch, dtype, n, args.rows, g, records):
            break  # a kernel fault ended the GPU context
        torch.cuda.empty_cache()
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "fused_float64_long.json")
        with open(path, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "limit_was": limit, "records": records}, fh, indent=2)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
