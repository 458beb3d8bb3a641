# ruff: noqa: B023 - the lambdas are timed at once
"""Host wall time of small cached GPU transforms: ``nvdispatch.fft.fft``/``fft2``/``ifft2`` of 16×16 complex64
and the stateful ``FFT.execute`` against ``torch.fft`` (Torch CUDA tensors) and ``cupy.fft`` (CuPy arrays).

A 16×16 transform's GPU time is a few microseconds: what the caller waits for is the host's work per call
(the route, the allocation, the launch). Each case runs ``--loops`` loops of ``--number`` calls; the loops of all
cases take turns (so every ratio comes from the same moments of the machine), the GPU is synchronised between
loops, outside the timing (the launch queue never fills), and each case's best loop is its host time per call.
Ratios are taken against the peer's call of the same transform in the same run. Diagnostic cases show the
parts: the cuFFT plan's direct call alone, the Python route, the Python launch (what an install without the
compiled extension runs).

    python benchmarks/gpu_fft_host_bench.py [--loops 5] [--number 2000] [--out DIR]

Writes ``DIR/gpu_fft_host.json`` (and ``gpu_fft_host.png`` with matplotlib). Needs an NVIDIA GPU and a CUDA
build of Torch (exit status 2 otherwise); CuPy is timed when installed.
"""

from __future__ import annotations

import json
import os
import platform
import time
from unittest import mock

import numpy as np
from _bench import output_dir, parser, progress, require_cuda_torch, save_plot

#: (nvdispatch case, peer case) -> the ratio's name; the goals of issue #30 item 3
RATIOS = {
    ("nvdispatch.fft.fft2 (torch)", "torch.fft.fft2"): "fft2 torch",
    ("nvdispatch.fft.fft (torch)", "torch.fft.fft"): "fft torch",
    ("nvdispatch.fft.ifft2 (torch)", "torch.fft.ifft2"): "ifft2 torch (norm scaling)",
    ("FFT.execute (torch, axes (0, 1))", "torch.fft.fft2"): "FFT.execute / torch.fft.fft2",
    ("FFT.execute (torch, axes (1,))", "torch.fft.fft"): "FFT.execute / torch.fft.fft",
    ("nvdispatch.fft.fft2 (cupy)", "cupy.fft.fft2"): "fft2 cupy",
    ("nvdispatch.fft.fft (cupy)", "cupy.fft.fft"): "fft cupy",
    ("FFT.execute (cupy, axes (0, 1))", "cupy.fft.fft2"): "FFT.execute / cupy.fft.fft2",
}


def best_host_times(cases: dict, torch, loops: int, number: int) -> dict:
    """Each case's best loop: host seconds per call (the GPU synchronised between loops, outside the timing)."""
    for fn in cases.values():
        for _ in range(200):
            fn()
    best = {name: float("inf") for name in cases}
    for _ in progress(range(loops), "loops"):
        for name, fn in cases.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            best[name] = min(best[name], (time.perf_counter() - t0) / number)
    torch.cuda.synchronize()
    return best


def _torch_cases(torch, nvdispatch, x: np.ndarray) -> tuple[dict, list, dict]:
    from nvdispatch.executors import cuda_fft
    from nvdispatch.fft import _route

    nf = nvdispatch.fft
    t = torch.from_numpy(x).cuda()
    f2 = nf.FFT(t, axes=(0, 1)).plan()
    f1 = nf.FFT(t, axes=(1,)).plan()
    cases = {
        "torch.fft.fft2": lambda: torch.fft.fft2(t),
        "nvdispatch.fft.fft2 (torch)": lambda: nf.fft2(t),
        "torch.fft.fft": lambda: torch.fft.fft(t),
        "nvdispatch.fft.fft (torch)": lambda: nf.fft(t),
        "torch.fft.ifft2": lambda: torch.fft.ifft2(t),
        "nvdispatch.fft.ifft2 (torch)": lambda: nf.ifft2(t),
        "FFT.execute (torch, axes (0, 1))": f2.execute,
        "FFT.execute (torch, axes (1,))": f1.execute,
    }
    nf.fft2(t)
    plan = f2._holds["forward"].plan  # the plan fft2's calls run (the same problem, one cached plan)
    cases["cuFFT plan.direct alone (torch)"] = lambda: plan.direct(t)
    cases["Python route call_transform fft2 (torch)"] = lambda: _route.call_transform(
        "fftn", t, None, -1, None, (-2, -1), "backward", None, None
    )
    if isinstance(plan, cuda_fft.CudaFFTPlan) and plan.direct is not None:
        with mock.patch.object(cuda_fft, "hotpath", lambda: None):  # as an install without the extension makes it
            launch = plan._direct_call()
        cases["cuFFT Python launch (no extension)"] = lambda: launch(t)
    want = np.fft.fft2(x.astype(np.complex128))
    checks = [(nf.fft2(t).cpu().numpy(), want), (f2.execute().cpu().numpy(), want), (plan.direct(t).cpu().numpy(),
              want), (nf.fft(t).cpu().numpy(), np.fft.fft(x.astype(np.complex128))),
              (nf.ifft2(t).cpu().numpy(), np.fft.ifft2(x.astype(np.complex128)))]  # fmt: skip
    info = {
        "plan": list(plan.steps),
        "fft2 route": str(nvdispatch.explain(nf.fft2, t)).splitlines()[:1],
        "compiled_direct": type(getattr(plan, "direct", None)).__name__ == "builtin_function_or_method",
        "_keep": (f1, f2),
    }
    return cases, checks, info


def _cupy_cases(nvdispatch, x: np.ndarray) -> tuple[dict, list]:
    try:
        import cupy
    except ImportError as exc:
        print("cupy unavailable:", exc)
        return {}, []
    nf = nvdispatch.fft
    c = cupy.asarray(x)
    f2 = nf.FFT(c, axes=(0, 1)).plan()
    cases = {
        "cupy.fft.fft2": lambda: cupy.fft.fft2(c),
        "nvdispatch.fft.fft2 (cupy)": lambda: nf.fft2(c),
        "cupy.fft.fft": lambda: cupy.fft.fft(c),
        "nvdispatch.fft.fft (cupy)": lambda: nf.fft(c),
        "FFT.execute (cupy, axes (0, 1))": f2.execute,
    }
    checks = [(cupy.asnumpy(nf.fft2(c)), np.fft.fft2(x.astype(np.complex128))),
              (cupy.asnumpy(f2.execute()), np.fft.fft2(x.astype(np.complex128)))]  # fmt: skip
    cases["_keep"] = f2
    return cases, checks


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__)
    ap.add_argument("--loops", type=int, default=5, help="timed loops per case (the best is kept)")
    ap.add_argument("--number", type=int, default=2000, help="calls per loop")
    ap.add_argument("--size", type=int, default=16, help="the transforms' side (size x size complex64)")
    args = ap.parse_args(argv)
    torch = require_cuda_torch()
    import nvdispatch
    from nvdispatch.fft import _route

    rng = np.random.default_rng(0)
    x = (rng.standard_normal((args.size, args.size)) + 1j * rng.standard_normal((args.size, args.size))).astype(
        np.complex64
    )
    cases, checks, info = _torch_cases(torch, nvdispatch, x)
    keep = info.pop("_keep")
    cupy_cases, cupy_checks = _cupy_cases(nvdispatch, x)
    keep = (keep, cupy_cases.pop("_keep", None))
    cases.update(cupy_cases)
    for got, want in checks + cupy_checks:
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    times = best_host_times(cases, torch, args.loops, args.number)
    ratios = {name: times[ours] / times[peer] for (ours, peer), name in RATIOS.items() if ours in times}
    result = {
        "device": torch.cuda.get_device_name(),
        "machine": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "size": args.size,
        "loops": args.loops,
        "number": args.number,
        "compiled_front": _route.transform_front is not _route.call_transform,
        **info,
        "host_us": {k: v * 1e6 for k, v in times.items()},
        "ratios": ratios,
    }
    del keep
    out = output_dir(args.out)
    path = os.path.join(out, "gpu_fft_host.json")
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=1)
    for name, us in result["host_us"].items():
        print(f"  {name:46s} {us:8.2f} us")
    for name, r in ratios.items():
        print(f"  ratio {name:40s} {r:6.3f}")
    print(f"compiled front {result['compiled_front']}, compiled cuFFT launch {result['compiled_direct']}; wrote {path}")

    def draw(plt):
        fig, ax = plt.subplots(figsize=(8, 4))
        names = list(ratios)
        ax.bar(range(len(names)), [ratios[n] for n in names])
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhline(1.05, color="tab:red", ls="--", lw=0.8)
        ax.set_xticks(range(len(names)), names, rotation=20, fontsize=7, ha="right")
        ax.set_ylabel("host time per call / peer's (lower is better)")
        ax.set_title(f"{args.size}x{args.size} complex64 transforms on {result['device']}")
        fig.tight_layout()

    save_plot(draw, os.path.join(out, "gpu_fft_host.png"))


if __name__ == "__main__":
    main()
