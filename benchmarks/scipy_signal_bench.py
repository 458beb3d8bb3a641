"""SciPy's own signal tests over ``scipy.fft``, with nvdispatch as SciPy's FFT backend and without, in one run.

Issue #30 item 2: a real client of ``scipy.fft`` (fftconvolve, oaconvolve, resample, hilbert, welch/csd/stft,
ShortTimeFFT, czt: SciPy's test modules, installed with SciPy) must take at most 1.15x its time without the
backend. Each repeat runs the same pytest selection in two fresh processes, in turns (off, on, off, on, ...):
``off`` as SciPy ships, ``on`` with ``_scipy_fft_backend_plugin`` (``scipy.fft.set_global_backend(nvdispatch.fft)``
and ``register_backend("scipy")`` for the whole session). Times are pytest's own session times (collection
included) and the processes' wall times; the medians' ratio is the figure. Both must report the same outcome
counts. Writes JSON and a PNG.

    python benchmarks/scipy_signal_bench.py [--repeats 3] [--out benchmarks/results] [--quick]
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time

from _bench import output_dir, parser, progress, require, save_plot

HERE = os.path.dirname(os.path.abspath(__file__))
MODULES = (
    "scipy.signal.tests.test_signaltools",
    "scipy.signal.tests.test_spectral",
    "scipy.signal.tests.test_short_time_fft",
    "scipy.signal.tests.test_czt",
)
_OUTCOMES = re.compile(r"(\d+) (passed|failed|skipped|xfailed|xpassed|errors?|warnings?|deselected)")
_SESSION = re.compile(r" in ([0-9.]+)s")


def _pytest(modules: tuple[str, ...], backend: bool, cache_dir: str | None) -> dict:
    cmd = [sys.executable, "-m", "pytest", "--pyargs", *modules, "-q", "-p", "no:cacheprovider", "-o", "addopts="]
    if backend:
        cmd += ["-p", "_scipy_fft_backend_plugin"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p))
    if cache_dir is not None:
        env["NVDISPATCH_CACHE_DIR"] = cache_dir
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=HERE)
    wall = time.perf_counter() - t0
    tail = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    session = _SESSION.search(tail)
    return {
        "wall_seconds": wall,
        "session_seconds": float(session.group(1)) if session else wall,
        "outcomes": {kind: int(n) for n, kind in _OUTCOMES.findall(tail)},
        "returncode": done.returncode,
        "summary": tail,
    }


def measure(repeats: int, modules: tuple[str, ...], cache_dir: str | None) -> dict:
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    for _ in progress(range(repeats), "SciPy signal tests, without and with the nvdispatch backend"):
        runs["off"].append(_pytest(modules, False, cache_dir))
        runs["on"].append(_pytest(modules, True, cache_dir))
    med = {k: statistics.median(r["session_seconds"] for r in v) for k, v in runs.items()}
    wall = {k: statistics.median(r["wall_seconds"] for r in v) for k, v in runs.items()}
    same = all(r["outcomes"] == runs["off"][0]["outcomes"] for r in runs["on"] + runs["off"])
    return {
        "modules": list(modules),
        "repeats": repeats,
        "median_session_seconds": med,
        "median_wall_seconds": wall,
        "ratio_on_to_off (goal <= 1.15)": med["on"] / med["off"],
        "wall_ratio_on_to_off": wall["on"] / wall["off"],
        "same_outcomes": same,
        "outcomes": {k: v[0]["outcomes"] for k, v in runs.items()},
        "runs": runs,
    }


def plot(results: dict, plt) -> None:
    fig, ax = plt.subplots(figsize=(8, 3.5))
    runs = results["runs"]
    for i, (kind, color) in enumerate((("off", "#888"), ("on", "#76b900"))):
        times = [r["session_seconds"] for r in runs[kind]]
        ax.scatter(times, [i] * len(times), color=color, zorder=3)
        ax.barh(i, results["median_session_seconds"][kind], color=color, alpha=0.5)
    ax.set_yticks([0, 1], ["SciPy's own backend", "nvdispatch backend"])
    ax.set_xlabel("pytest session seconds (bars: medians, dots: repeats)")
    ratio = results["ratio_on_to_off (goal <= 1.15)"]
    ax.set_title(f"SciPy signal tests over scipy.fft: {ratio:.3f}x with nvdispatch (goal <= 1.15x)")
    fig.tight_layout()


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--repeats", type=int, default=3, help="runs of each kind, in turns")
    ap.add_argument("--quick", action="store_true", help="the czt tests only, once: checks the script runs")
    ap.add_argument(
        "--cache-dir",
        help="NVDISPATCH_CACHE_DIR for the test processes (default: as set here; '' runs uncalibrated)",
    )
    args = ap.parse_args()
    require("scipy.signal", "pip install 'nvdispatch[scipy]'")
    require("pytest", "pip install pytest")
    out = output_dir(args.out)
    modules = MODULES[-1:] if args.quick else MODULES
    results = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load": os.getloadavg()},
        "scipy_signal": measure(1 if args.quick else args.repeats, modules, args.cache_dir),
    }
    with open(os.path.join(out, "scipy_signal.json"), "w") as fh:
        json.dump(results, fh, indent=1)
    save_plot(lambda plt: plot(results["scipy_signal"], plt), os.path.join(out, "scipy_signal.png"))
    r = results["scipy_signal"]
    print(f"median session seconds: {r['median_session_seconds']}, wall: {r['median_wall_seconds']}")
    print(f"ratio with nvdispatch: {r['ratio_on_to_off (goal <= 1.15)']:.3f} (wall {r['wall_ratio_on_to_off']:.3f})")
    print(f"outcomes {r['outcomes']}, same: {r['same_outcomes']}")


if __name__ == "__main__":
    main()
