"""CPU FFT benchmark: nvdispatch.fft vs scipy.fft on all cores and on one thread (its default) and numpy.fft,
same process, interleaved, median over repeats. Large transforms (where all cores win) and small batched / 2-D
ones (where waking threads costs more than the transform: nvdispatch measures which, per shape).

    python benchmarks/fft_cpu.py [--repeats 15] [--out DIR] [--quick]   # writes DIR/fft_cpu.{json,png}

Needs SciPy (``pip install 'nvdispatch[scipy]'``), and ``nvdispatch[bench]`` for the plot and progress bars.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import numpy as np
from _bench import cannot_run, output_dir, parser, progress, save_plot

try:  # main() says what is missing
    import scipy.fft
except ImportError:
    scipy = None

import nvdispatch.fft as F


def cases(quick: bool = False):
    rng = np.random.default_rng(0)
    rows, n, cube = (64, 128, 16) if quick else (4096, 1024, 256)
    c = (rng.standard_normal((rows, n)) + 1j * rng.standard_normal((rows, n))).astype(np.complex64)
    r = rng.standard_normal((cube, cube, cube)).astype(np.float32)
    small = {
        side: (rng.standard_normal((side, side)) + 1j * rng.standard_normal((side, side))).astype(np.complex64)
        for side in (16, 64, 256)
    }
    return [
        (
            f"c2c c64 {rows}x{n} fft(axis=-1)",
            {
                "nvdispatch": lambda: F.fft(c),
                "scipy.fft workers=-1": lambda: scipy.fft.fft(c, workers=-1),
                "scipy.fft workers=1": lambda: scipy.fft.fft(c, workers=1),
                "numpy.fft": lambda: np.fft.fft(c),
            },
        ),
        (
            f"r2c f32 {cube}^3 rfftn",
            {
                "nvdispatch": lambda: F.rfftn(r),
                "scipy.fft workers=-1": lambda: scipy.fft.rfftn(r, workers=-1),
                "scipy.fft workers=1": lambda: scipy.fft.rfftn(r, workers=1),
                "numpy.fft": lambda: np.fft.rfftn(r),
            },
        ),
        *(
            (
                f"c2c c64 {side}x{side} fft2",
                {
                    "nvdispatch": lambda x=x: F.fft2(x),
                    "scipy.fft workers=-1": lambda x=x: scipy.fft.fft2(x, workers=-1),
                    "scipy.fft workers=1": lambda x=x: scipy.fft.fft2(x, workers=1),
                    "numpy.fft": lambda x=x: np.fft.fft2(x),
                },
            )
            for side, x in small.items()
        ),
        (
            "c2c c64 64x64 fft(axis=-1)",
            {
                "nvdispatch": lambda: F.fft(small[64]),
                "scipy.fft workers=-1": lambda: scipy.fft.fft(small[64], workers=-1),
                "scipy.fft workers=1": lambda: scipy.fft.fft(small[64], workers=1),
                "numpy.fft": lambda: np.fft.fft(small[64]),
            },
        ),
    ]


def main():
    ap = parser(__doc__)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="tiny shapes: checks the script runs")
    args = ap.parse_args()
    if scipy is None:
        cannot_run("needs SciPy (pip install 'nvdispatch[scipy]')")
    out = output_dir(args.out)
    results = []
    for label, fns in cases(args.quick):
        for fn in fns.values():
            fn()  # warm-up (plans, caches)
        t0 = time.perf_counter()
        fns["nvdispatch"]()
        number = max(1, int(1e-3 / (time.perf_counter() - t0)))  # calls per sample: ~1 ms of them
        samples = {k: [] for k in fns}
        for _ in progress(range(args.repeats), label):
            for k, fn in fns.items():  # interleaved so drift hits all alike
                t0 = time.perf_counter()
                for _ in range(number):
                    fn()
                samples[k].append((time.perf_counter() - t0) / number)
        row = {"case": label, **{k: statistics.median(v) for k, v in samples.items()}}
        best_scipy = min(row["scipy.fft workers=-1"], row["scipy.fft workers=1"])
        row["ratio nvdispatch/scipy"] = row["nvdispatch"] / row["scipy.fft workers=-1"]
        row["ratio nvdispatch/scipy default (workers=1)"] = row["nvdispatch"] / row["scipy.fft workers=1"]
        row["ratio nvdispatch/faster scipy setting"] = row["nvdispatch"] / best_scipy
        row["ratio nvdispatch/numpy.fft"] = row["nvdispatch"] / row["numpy.fft"]
        results.append(row)
        print(json.dumps(row), flush=True)
    meta = {
        "cpu_count": os.cpu_count(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "repeats": args.repeats,
        "timing": "time.perf_counter over ~1 ms of calls per sample, interleaved, median",
    }
    with open(os.path.join(out, "fft_cpu.json"), "w") as fh:
        json.dump({"meta": meta, "results": results}, fh, indent=1)
    save_plot(lambda plt: plot(results, plt), os.path.join(out, "fft_cpu.png"))


def plot(results: list, plt) -> None:
    keys = ["nvdispatch", "scipy.fft workers=-1", "scipy.fft workers=1", "numpy.fft"]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    w = 0.8 / len(keys)
    for i, k in enumerate(keys):  # relative to nvdispatch: cases span four orders of magnitude
        ax.bar([j + i * w for j in range(len(results))], [r[k] / r["nvdispatch"] for r in results], w, label=k)
    ax.set_xticks([j + 1.5 * w for j in range(len(results))], [r["case"] for r in results], rotation=20, fontsize=7)
    ax.set_ylabel("time / nvdispatch's (median)")
    ax.set_yscale("log")
    ax.set_title(f"CPU FFT ({os.cpu_count()} cores)")
    ax.legend()
    fig.tight_layout()


if __name__ == "__main__":
    main()
