# ruff: noqa: B023
"""FFT convolution on the GPU (H200): ``ifft(fft(x) * h)`` over a batch of signals, nvdispatch's fused paths
against CuPy, Torch and nvmath-python 1.0 with an LTO epilog, timed with CUDA events over back-to-back
calls on one stream (median of repeats), each result checked against a float64 reference.

    python benchmarks/fft_callbacks_bench.py [--batch 65536] [--n 1024] [--out DIR]
    # writes DIR/fft_callbacks_bench.{json,png}

Variants (same input, same filter ``h`` of shape ``(n,)``):

* ``nvdispatch convolve``: ``nvdispatch.fft.convolve(x, h)``, the strategy its timed choice keeps (at
  1024 points the one generated kernel: FFT, multiply in registers, inverse FFT; ``explain`` in the JSON says
  which; ``convolve_bench.py`` compares every size);
* ``nvdispatch fft(epilog) + ifft``: ``ifft(fft(x, epilog=v*h[i%n]))`` (fused epilog, then the inverse);
* ``cupy``: ``cp.fft.ifft(cp.fft.fft(x) * h)``; ``torch``: the same with ``torch.fft``;
* ``nvmath LTO epilog``: stateful ``nvmath.fft.FFT`` forward with the multiply (and 1/n) as an LTO epilog,
  then its in-place inverse.

Needs a GPU, torch, cupy, numba-cuda; nvmath-python is timed when installed.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
from _bench import cuda_event_seconds, output_dir, parser, progress, require, require_cuda_torch, save_plot

torch = None  # main() imports it, or says it is missing


def timeit(fn, reps=7, inner=20):
    """Median seconds per call: ``inner`` calls between two CUDA events on the current stream."""
    return cuda_event_seconds(fn, torch, reps, inner, warmup=3)


def main():
    ap = parser(__doc__)
    ap.add_argument("--batch", type=int, default=65536)
    ap.add_argument("--n", type=int, default=1024)
    args = ap.parse_args()
    global torch
    torch = require_cuda_torch()
    cupy = require("cupy", "pip install 'nvdispatch[cupy]'")
    out = output_dir(args.out)

    import nvdispatch
    import nvdispatch.fft as F

    B, n = args.batch, args.n
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.complex(
        torch.randn(B, n, device="cuda", generator=g), torch.randn(B, n, device="cuda", generator=g)
    ).contiguous()
    h = torch.complex(torch.randn(n, device="cuda", generator=g), torch.randn(n, device="cuda", generator=g))
    xc, hc = cupy.asarray(x), cupy.asarray(h)
    # float64 reference on a sample of rows
    rows = torch.arange(0, B, max(1, B // 64), device="cuda")
    xs = x[rows].cpu().numpy().astype(np.complex128)
    ref = np.fft.ifft(np.fft.fft(xs, axis=-1) * h.cpu().numpy().astype(np.complex128), axis=-1)

    def error(result):
        r = torch.as_tensor(result, device="cuda")[rows].cpu().numpy()
        return float(np.abs(r - ref).max() / np.abs(ref).max())

    def times_filter(v, i, hh):
        return v * hh[i % hh.shape[0]]

    variants = {
        "nvdispatch convolve (one kernel)": lambda: F.convolve(x, h),
        "nvdispatch fft(epilog) + ifft": lambda: F.ifft(F.fft(x, epilog=times_filter, epilog_data=(h,))),
        "cupy ifft(fft(x)*h)": lambda: cupy.fft.ifft(cupy.fft.fft(xc, axis=-1) * hc, axis=-1),
        "torch ifft(fft(x)*h)": lambda: torch.fft.ifft(torch.fft.fft(x) * h),
    }
    explain = {
        "nvdispatch convolve (one kernel)": str(nvdispatch.explain(F.convolve, x, h)),
        "nvdispatch fft(epilog) + ifft": str(nvdispatch.explain(F.fft, x, epilog=times_filter, epilog_data=(h,))),
    }
    nvmath_version = None
    try:
        import nvmath

        nvmath_version = nvmath.__version__
        scale = np.float32(1.0 / n)

        def nvmath_epilog(data_out, offset, data, user_info, unused):
            data_out[offset] = data * user_info[offset % n] * scale

        t0 = time.perf_counter()
        ltoir = nvmath.fft.compile_epilog(nvmath_epilog, "complex64", "complex64")
        fwd = nvmath.fft.FFT(x, axes=[-1])
        fwd.plan(epilog={"ltoir": ltoir, "data": h.data_ptr()})
        y0 = fwd.execute(direction="forward")
        inv = nvmath.fft.FFT(y0, axes=[-1], options={"inplace": True})
        inv.plan()
        plan_s = time.perf_counter() - t0

        def nvmath_run():
            y = fwd.execute(direction="forward")
            inv.reset_operand(y)
            return inv.execute(direction="inverse")

        variants["nvmath 1.0 LTO epilog + inplace ifft"] = nvmath_run
        explain["nvmath 1.0 LTO epilog + inplace ifft"] = f"plan + LTO compile {plan_s:.2f} s"
    except Exception as exc:  # noqa: BLE001 - report and go on
        print(f"nvmath not timed: {type(exc).__name__}: {exc}", file=sys.stderr)

    results = {}
    for name, fn in progress(variants.items(), "variants", total=len(variants)):
        t_first = time.perf_counter()
        first = fn()
        torch.cuda.synchronize()
        first_s = time.perf_counter() - t_first
        err = error(first)
        seconds = timeit(fn)
        results[name] = {"us": seconds * 1e6, "max_rel_error": err, "first_call_s": first_s}
        print(f"{name:42s} {seconds * 1e6:9.1f} us  err {err:.2e}  first call {first_s:.2f} s", flush=True)
    fused = results["nvdispatch convolve (one kernel)"]["us"]
    ratios = {name: r["us"] / fused for name, r in results.items()}
    bytes_moved = 2 * x.numel() * x.element_size()  # one read, one write of the signal
    summary = {
        "device": torch.cuda.get_device_name(),
        "batch": B,
        "n": n,
        "dtype": "complex64",
        "nvmath": nvmath_version,
        "results": results,
        "speedup_of_fused_over": ratios,
        "fused_effective_TBps": bytes_moved / (fused * 1e-6) / 1e12,
        "explain": explain,
    }
    path = os.path.join(out, "fft_callbacks_bench.json")
    with open(path, "w") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps({k: v for k, v in summary.items() if k != "explain"}, indent=2))
    print(f"wrote {path}")

    def draw(plt):
        names = list(results)
        fig, ax = plt.subplots(figsize=(9, 4))
        ax.barh(names, [results[k]["us"] for k in names], color=["C2" if "nvdispatch" in k else "C0" for k in names])
        for i, k in enumerate(names):
            ax.text(results[k]["us"], i, f" {results[k]['us']:.0f} us ({ratios[k]:.2f}x)", va="center")
        ax.set_xlabel("microseconds per convolution (median)")
        ax.set_title(f"ifft(fft(x) * h), {B} x {n} complex64, {summary['device']}")
        ax.invert_yaxis()
        fig.tight_layout()

    save_plot(draw, os.path.join(out, "fft_callbacks_bench.png"))


if __name__ == "__main__":
    main()
