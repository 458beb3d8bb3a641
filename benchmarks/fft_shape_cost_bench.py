"""What a CPU FFT costs per new shape and per repeated call: SciPy's own ``scipy.fft`` against nvdispatch as its
backend (and ``nvdispatch.fft`` called directly), 1-D ``rfft`` around 1000 points.

Issue #30 item 2: a transform of a length not seen before must take at most 1.2x SciPy's own time for it, a
repeated one at most 1.1x. *New length*: each sample is the first call of a length no one in the process has
transformed (pocketfft keeps its own plans per length, shared by SciPy and nvdispatch: each contender gets
lengths of its own, each round of consecutive lengths dealt in a random order). What a plan costs varies with
the length's factors far more than the contenders differ, so each sample is divided by a reference time of its
own length: SciPy's own call of it after the dealing, when pocketfft has long dropped the length's plan (it
keeps 16), so the reference makes the plan again. The ratio to SciPy's own is the median of a contender's
per-length ratios over SciPy's. *Repeated*: seconds per call over a loop of the same 1000-point transform, the
fastest of several loops, the contenders in turns. Writes JSON and a PNG.

    python benchmarks/fft_shape_cost_bench.py [--lengths 400] [--repeats 9] [--out benchmarks/results] [--quick]
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time

import numpy as np
from _bench import output_dir, parser, progress, require, save_plot

import nvdispatch.fft

sfft = None  # scipy.fft, imported by main() (without SciPy the script says so)
CONTENDERS = ("scipy.fft (SciPy's own backend)", "scipy.fft (nvdispatch backend)", "nvdispatch.fft")


class _Backend:
    """``scipy.fft`` with nvdispatch as its backend while inside (``with _Backend(): ...``)."""

    def __enter__(self):
        self._ctx = sfft.set_backend(nvdispatch.fft)
        self._ctx.__enter__()

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)


def _contenders() -> dict:
    """name -> (function, context to call it in)."""
    import contextlib

    return {
        CONTENDERS[0]: (sfft.rfft, contextlib.nullcontext),
        CONTENDERS[1]: (sfft.rfft, _Backend),
        CONTENDERS[2]: (nvdispatch.fft.rfft, contextlib.nullcontext),
    }


def new_lengths(count: int, start: int = 1001) -> dict:
    """Median seconds of a first call of a new length, per contender (each round of lengths dealt in a random order)."""
    calls = _contenders()
    for fn, within in calls.values():  # imports, the route's first-use costs: not what a new length costs
        with within():
            fn(np.ones(16))
    samples: dict[str, list[tuple[int, float]]] = {name: [] for name in calls}
    rng = np.random.default_rng(0)
    length = start
    names = list(calls)
    for _ in progress(range(count), "new lengths"):
        # each round deals the next lengths to the contenders in a random order: a length's factors decide what
        # pocketfft's plan costs, and any periodic order gives each contender lengths of fixed residues (a
        # rotation of 3 contenders gives one of them every multiple of 9, the cheapest plans)
        for k in rng.permutation(len(names)):
            name = names[k]
            fn, within = calls[name]
            x = rng.standard_normal(length)
            length += 1
            with within():
                t0 = time.perf_counter()
                fn(x)
                samples[name].append((x.shape[0], time.perf_counter() - t0))
    reference = _reference_times(samples)
    relative = {name: statistics.median(t / reference[n] for n, t in v) for name, v in samples.items()}
    med = {name: statistics.median(t for _, t in v) for name, v in samples.items()}
    return {
        "lengths": [start, length - 1],
        "median_seconds": med,
        "median_relative_to_reference": relative,
        "ratio_to_scipy": {name: r / relative[CONTENDERS[0]] for name, r in relative.items()},
        "ratio_of_medians": {name: t / med[CONTENDERS[0]] for name, t in med.items()},
    }


def _reference_times(samples: dict) -> dict:
    """length -> seconds of SciPy's own first call of it again, every length dealt, in turn (each one's plan made
    again: pocketfft keeps the last 16)."""
    rng = np.random.default_rng(2)
    reference = {}
    for n in progress(sorted(n for v in samples.values() for n, _ in v), "reference"):
        x = rng.standard_normal(n)
        t0 = time.perf_counter()
        sfft.rfft(x)
        reference[n] = time.perf_counter() - t0
    return reference


def repeated(repeats: int, n: int = 1000, loop: int = 2000) -> dict:
    """Seconds per call of the same transform (fastest loop of ``repeats``, contenders in turns)."""
    calls = _contenders()
    x = np.random.default_rng(1).standard_normal(n)
    best = dict.fromkeys(calls, float("inf"))
    for _ in progress(range(repeats), "repeated calls"):
        for name, (fn, within) in calls.items():
            with within():
                best[name] = min(best[name], _loop(fn, x, loop))
    base = best[CONTENDERS[0]]
    return {"n": n, "seconds_per_call": best, "ratio_to_scipy": {name: t / base for name, t in best.items()}}


def _loop(fn, x, count: int) -> float:
    fn(x)
    t0 = time.perf_counter()
    for _ in range(count):
        fn(x)
    return (time.perf_counter() - t0) / count


def plot(results: dict, plt) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8))
    colors = ["#888", "#76b900", "#b0d080"]
    for ax, (what, key, goal) in zip(
        axes, (("new length", "new_length", 1.2), ("repeated call", "repeated", 1.1))
    ):
        ratios = results[key]["ratio_to_scipy"]
        ax.barh(list(ratios), list(ratios.values()), color=colors)
        ax.axvline(goal, color="r", lw=0.8, ls="--", label=f"goal {goal}x")
        ax.axvline(1.0, color="k", lw=0.8)
        ax.invert_yaxis()
        ax.set_xlabel("time / SciPy's own (lower is better)")
        ax.set_title(f"rfft, {what}")
        ax.legend()
    fig.tight_layout()


def main() -> None:
    global sfft
    ap = parser(__doc__)
    ap.add_argument("--lengths", type=int, default=400, help="new lengths per contender")
    ap.add_argument("--repeats", type=int, default=9, help="loops of repeated calls per contender")
    ap.add_argument("--quick", action="store_true", help="few lengths and loops: checks the script runs")
    args = ap.parse_args()
    sfft = require("scipy.fft", "pip install 'nvdispatch[scipy]'")
    out = output_dir(args.out)
    results = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load": os.getloadavg()},
        "new_length": new_lengths(10 if args.quick else args.lengths),
        "repeated": repeated(2 if args.quick else args.repeats, loop=50 if args.quick else 2000),
    }
    with open(os.path.join(out, "fft_shape_cost.json"), "w") as fh:
        json.dump(results, fh, indent=1)
    save_plot(lambda plt: plot(results, plt), os.path.join(out, "fft_shape_cost.png"))
    for key in ("new_length", "repeated"):
        print(key, {k: round(v, 3) for k, v in results[key]["ratio_to_scipy"].items()})


if __name__ == "__main__":
    main()
