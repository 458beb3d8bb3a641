# ruff: noqa: B023
"""GPU FFT benchmark (H200): nvdispatch vs torch.fft, cupy.fft and nvmath-python's FFT (stateless and
stateful), timed with CUDA events over back-to-back launches on one stream (median of repeats).

    python benchmarks/fft_gpu.py [--out DIR]   # writes DIR/fft_gpu.{json,png}

Needs a GPU, ``pip install 'nvdispatch[torch,cupy,bench]'``; nvmath-python is timed when installed.
"""

from __future__ import annotations

import json
import os
import sys

from _bench import cuda_event_seconds, output_dir, parser, progress, require, require_cuda_torch, save_plot

torch = None  # main() imports it, or says it is missing

CASES = [  # (label, kind, batch, n)
    ("c2c c64 4096x1024", "c2c", 4096, 1024),
    ("c2c c64 65536x128", "c2c", 65536, 128),
    ("c2c c64 64x65536", "c2c", 64, 65536),
    ("r2c f32 4096x1024", "r2c", 4096, 1024),
]


BUSY_CYCLES = 200_000  # per queued call: ~100 us of busy-wait at ~2 GHz, more than a call's host time


def timeit(fn, reps=9, inner=50):
    """Median seconds per call, the GPU timed behind a busy-wait (the transforms here take 10-50 us: a
    stateless call's host cost, which differs between hosts, would otherwise be what is measured)."""
    return cuda_event_seconds(fn, torch, reps, inner, warmup=5, busy_cycles=BUSY_CYCLES)


def main():
    ap = parser(__doc__)
    args = ap.parse_args()
    global torch
    torch = require_cuda_torch()
    cupy = require("cupy", "pip install 'nvdispatch[cupy]'")
    out = output_dir(args.out)

    import nvdispatch
    import nvdispatch.fft as F

    try:
        import nvmath

        nvmath_version = nvmath.__version__
    except Exception:  # noqa: BLE001
        nvmath = None
        nvmath_version = None
    results = []
    for label, kind, batch, n in progress(CASES, "FFT cases"):
        g = torch.Generator(device="cuda").manual_seed(0)
        xr = torch.randn((batch, n), device="cuda", generator=g)
        xt = torch.complex(xr, torch.randn_like(xr)) if kind == "c2c" else xr
        xc = cupy.asarray(xt)
        tf = torch.fft.fft if kind == "c2c" else torch.fft.rfft
        cf = cupy.fft.fft if kind == "c2c" else cupy.fft.rfft
        nf = F.fft if kind == "c2c" else F.rfft
        row = {"case": label, "bytes": xt.numel() * xt.element_size()}
        row["executor"] = nvdispatch.explain(nf, xt).executor
        row["torch.fft"] = timeit(lambda: tf(xt))
        row["cupy.fft"] = timeit(lambda: cf(xc))
        row["nvdispatch(torch)"] = timeit(lambda: nf(xt))
        row["nvdispatch(cupy)"] = timeit(lambda: nf(xc))
        with F.FFT(xt, axes=(1,)) as st:
            st.plan()
            row["nvdispatch FFT stateful"] = timeit(lambda: st.execute())
        if nvmath is not None:
            try:
                sf = nvmath.fft.fft if kind == "c2c" else nvmath.fft.rfft
                row["nvmath stateless"] = timeit(lambda: sf(xt, axes=[1]), reps=5, inner=10)
                with nvmath.fft.FFT(xt, axes=[1]) as nst:
                    nst.plan()
                    row["nvmath FFT stateful"] = timeit(lambda: nst.execute())
            except Exception as exc:  # noqa: BLE001
                row["nvmath error"] = repr(exc)
        # ratios (<= 1.02 is the goal against the frameworks)
        row["ratio nvdispatch/torch"] = row["nvdispatch(torch)"] / row["torch.fft"]
        row["ratio nvdispatch/cupy"] = row["nvdispatch(cupy)"] / row["cupy.fft"]
        if "nvmath FFT stateful" in row:
            row["ratio nvdispatch stateful/nvmath stateful"] = (
                row["nvdispatch FFT stateful"] / row["nvmath FFT stateful"]
            )
            row["ratio nvdispatch/nvmath stateless"] = row["nvdispatch(torch)"] / row["nvmath stateless"]
        row["nvdispatch GB/s"] = 2 * row["bytes"] / row["nvdispatch(torch)"] / 1e9
        results.append(row)
        print(json.dumps(row), flush=True)
    meta = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cupy": cupy.__version__,
        "nvmath": nvmath_version,
        "timing": "CUDA events around 50 back-to-back calls queued behind a GPU busy-wait; median of 9 "
        "(nvmath stateless: 10 x 5)",
        "python": sys.version.split()[0],
    }
    with open(os.path.join(out, "fft_gpu.json"), "w") as fh:
        json.dump({"meta": meta, "results": results}, fh, indent=1)
    save_plot(lambda plt: plot(results, meta, plt), os.path.join(out, "fft_gpu.png"))


def plot(results: list, meta: dict, plt) -> None:
    keys = ["torch.fft", "cupy.fft", "nvdispatch(torch)", "nvdispatch(cupy)", "nvdispatch FFT stateful"]
    keys += [k for k in ("nvmath stateless", "nvmath FFT stateful") if any(k in r for r in results)]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    w = 0.8 / len(keys)
    for i, k in enumerate(keys):
        ax.bar([j + i * w for j in range(len(results))], [r.get(k, 0) * 1e6 for r in results], w, label=k)
    ax.set_xticks([j + 0.4 - w / 2 for j in range(len(results))], [r["case"] for r in results])
    ax.set_ylabel("µs per transform (CUDA events)")
    ax.set_yscale("log")
    ax.set_title(f"FFT on {meta['device']}")
    ax.legend(fontsize=7)
    fig.tight_layout()


if __name__ == "__main__":
    main()
