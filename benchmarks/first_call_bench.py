"""The first call of a fresh process: the README's quick start through nvdispatch against ``np.matmul``'s first call.

Issue #30 item 1. Each sample is a new Python process that imports NumPy, makes the README's operands (x 8192x256,
w 256x1024, bias 1024, float32) and times its first call (and its second); the kinds of process take turns, round
by round, so that load on the machine weighs on all alike:

``numpy``
    ``np.matmul(x, w)`` (the floor: the product alone, no epilog), then ``np.maximum(x @ w + bias, 0)``.
``calibrated``
    ``nvdispatch.matmul(x, w, epilog=RELU_BIAS, ...)`` in a process whose cache directory holds this machine's
    calibration (made once, before the rounds: ``nvdispatch.calibrate`` of the quick start's shape, or the
    full ``python -m nvdispatch calibrate`` with ``--full``). Goal: at most 1.2x + 10 ms of numpy's first call.
``first-ever``
    the same call in a process whose cache directory is new and empty, as on a machine where nvdispatch never
    ran. Goal: at most 150 ms beyond numpy's first call.

nvdispatch's import is timed apart (as NumPy's is): the goals are about the call. The processes find their cache
directory as a user's would (``platformdirs``, here under a temporary ``XDG_CACHE_HOME``; Linux).

Bytecode: an installed package runs from compiled bytecode (pip compiles a wheel's modules when it installs it, and
Python caches what it imports), and NumPy's first call here is timed that way. So that both sides run alike, the
processes cache bytecode under a temporary ``PYTHONPYCACHEPREFIX`` (even where ``PYTHONDONTWRITEBYTECODE`` is
set, as on the machines this is developed on, or the source is an editable checkout), and one discarded round of
each kind fills it before the timed rounds. ``--source-only`` keeps the environment as it is instead: with
``PYTHONDONTWRITEBYTECODE`` set and no bytecode next to the sources, every process compiles the modules its first
call imports. Writes JSON (medians, ratios, every sample, the bytecode condition) and a PNG.

    python benchmarks/first_call_bench.py [--rounds 15] [--out benchmarks/results] [--full] [--quick] [--source-only]
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from _bench import output_dir, parser, progress, save_plot

_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
imported_numpy = time.perf_counter() - t0
m, k, n = (int(v) for v in sys.argv[2:5])
rng = np.random.default_rng(0)
x = rng.random((m, k), dtype=np.float32)
w = rng.random((k, n), dtype=np.float32)
bias = rng.random(n, dtype=np.float32)
got = {"import_numpy": imported_numpy}
if sys.argv[1] == "numpy":
    t0 = time.perf_counter(); np.matmul(x, w); got["first"] = time.perf_counter() - t0
    t0 = time.perf_counter(); np.maximum(x @ w + bias, 0); got["with_epilog"] = time.perf_counter() - t0
    t0 = time.perf_counter(); np.matmul(x, w); got["second"] = time.perf_counter() - t0
else:
    t0 = time.perf_counter()
    import nvdispatch
    from nvdispatch import Epilog
    got["import_nvdispatch"] = time.perf_counter() - t0
    kw = {"epilog": Epilog.RELU_BIAS, "epilog_inputs": {"bias": bias}}
    t0 = time.perf_counter(); y = nvdispatch.matmul(x, w, **kw); got["first"] = time.perf_counter() - t0
    t0 = time.perf_counter(); nvdispatch.matmul(x, w, **kw); got["second"] = time.perf_counter() - t0
    assert np.allclose(y, np.maximum(x @ w + bias, 0), rtol=1e-4, atol=1e-3)
    got["order"] = nvdispatch.explain(x, w, **kw).steps[-1]
print(json.dumps(got))
"""


#: the children's bytecode cache (``PYTHONPYCACHEPREFIX``), or None to keep the environment's condition
_BYTECODE: list[str | None] = [None]


def _env(cache: str) -> dict:
    """The child's environment: the user cache directory (platformdirs' XDG_CACHE_HOME) in ``cache``, no
    NVDISPATCH_CACHE_DIR, so that nvdispatch finds its calibration as in a user's process, and the bytecode
    condition of the run."""
    env = dict(os.environ, XDG_CACHE_HOME=cache)
    env.pop("NVDISPATCH_CACHE_DIR", None)
    if _BYTECODE[0] is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = _BYTECODE[0]
    return env


def _run(kind: str, shape: tuple[int, int, int], cache: str) -> dict:
    env = _env(cache)
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, kind, *map(str, shape)], capture_output=True, text=True, env=env, timeout=600
    )
    if done.returncode:
        raise RuntimeError(f"{kind} process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _calibrate(cache: str, shape: tuple[int, int, int], full: bool) -> float:
    env = _env(cache)
    m, k, n = shape
    if full:
        cmd = [sys.executable, "-m", "nvdispatch", "calibrate"]
    else:
        code = f"from nvdispatch.calibration import calibrate; print(calibrate([({m}, {k}, {n})], quick=True))"
        cmd = [sys.executable, "-c", code]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if done.returncode:
        raise RuntimeError(f"calibration failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - t0


def measure(rounds: int, shape: tuple[int, int, int], full: bool, source_only: bool = False) -> dict:
    calibrated = tempfile.mkdtemp(prefix="nvdispatch-first-call-")
    _BYTECODE[0] = None if source_only else tempfile.mkdtemp(prefix="nvdispatch-first-call-bytecode-")
    try:
        calibration_seconds = _calibrate(calibrated, shape, full)
        samples: dict[str, list[dict]] = {"numpy": [], "calibrated": [], "first-ever": []}
        if not source_only:  # one discarded round: the bytecode of every module the timed processes import
            warm = tempfile.mkdtemp(prefix="nvdispatch-first-ever-")
            for kind, cache in (("numpy", calibrated), ("nvdispatch", calibrated), ("nvdispatch", warm)):
                _run(kind, shape, cache)
            shutil.rmtree(warm, ignore_errors=True)
        for _ in progress(range(rounds), "fresh processes (numpy, calibrated, first-ever)"):
            samples["numpy"].append(_run("numpy", shape, calibrated))
            samples["calibrated"].append(_run("nvdispatch", shape, calibrated))
            empty = tempfile.mkdtemp(prefix="nvdispatch-first-ever-")
            try:
                samples["first-ever"].append(_run("nvdispatch", shape, empty))
            finally:
                shutil.rmtree(empty, ignore_errors=True)
    finally:
        shutil.rmtree(calibrated, ignore_errors=True)
        if _BYTECODE[0] is not None:
            shutil.rmtree(_BYTECODE[0], ignore_errors=True)

    def med(kind: str, what: str) -> float:
        return statistics.median(s[what] for s in samples[kind])

    np_first = med("numpy", "first")
    cal, ever = med("calibrated", "first"), med("first-ever", "first")
    return {
        "shape": dict(zip("mkn", shape)),
        "rounds": rounds,
        "calibration": {"full": full, "seconds": calibration_seconds},
        "bytecode": (
            "as the environment has it (source only: compiled by every process where PYTHONDONTWRITEBYTECODE is set)"
            if source_only
            else "cached ahead under a temporary PYTHONPYCACHEPREFIX, as an installed package runs"
        ),
        "median_seconds": {
            "numpy first np.matmul": np_first,
            "numpy first maximum(x @ w + bias, 0)": med("numpy", "with_epilog"),
            "numpy second np.matmul": med("numpy", "second"),
            "nvdispatch first call, calibrated machine": cal,
            "nvdispatch first call, first ever": ever,
            "nvdispatch second call, calibrated machine": med("calibrated", "second"),
            "import numpy": med("numpy", "import_numpy"),
            "import nvdispatch": med("calibrated", "import_nvdispatch"),
        },
        "goals": {
            "calibrated first / numpy first": cal / np_first,
            "calibrated allowance used (goal <= 1: at most 1.2x + 10 ms)": cal / (1.2 * np_first + 0.010),
            "first ever - numpy first, ms (goal <= 150)": (ever - np_first) * 1e3,
        },
        "order": {kind: samples[kind][0].get("order") for kind in ("calibrated", "first-ever")},
        "samples": samples,
    }


def plot(results: dict, plt) -> None:
    med = results["median_seconds"]
    names = [n for n in med if not n.startswith("import")]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    colors = ["#76b900" if n.startswith("nvdispatch") else "#888" for n in names]
    ax.barh(names, [med[n] * 1e3 for n in names], color=colors)
    np_first = med["numpy first np.matmul"] * 1e3
    ax.axvline(1.2 * np_first + 10, color="r", lw=0.8, ls="--", label="goal, calibrated: 1.2x + 10 ms")
    ax.axvline(np_first + 150, color="r", lw=0.8, ls=":", label="goal, first ever: + 150 ms")
    ax.invert_yaxis()
    s = results["shape"]
    ax.set_xlabel("ms (median over fresh processes)")
    ax.set_title(f"first call of a fresh process: RELU_BIAS fp32 {s['m']}x{s['k']} @ {s['k']}x{s['n']}")
    ax.legend(loc="lower right")
    fig.tight_layout()


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--rounds", type=int, default=15, help="fresh processes of each kind")
    ap.add_argument("--full", action="store_true", help="calibrate with the full python -m nvdispatch calibrate")
    ap.add_argument("--quick", action="store_true", help="a small shape and 2 rounds: checks the script runs")
    ap.add_argument(
        "--source-only",
        action="store_true",
        help="keep the environment's bytecode condition (no bytecode cache made ahead: see above)",
    )
    args = ap.parse_args()
    out = output_dir(args.out)
    shape = (256, 64, 128) if args.quick else (8192, 256, 1024)
    results = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load": os.getloadavg()},
        "first_call": measure(2 if args.quick else args.rounds, shape, args.full, args.source_only),
    }
    with open(os.path.join(out, "first_call.json"), "w") as fh:
        json.dump(results, fh, indent=1)
    save_plot(lambda plt: plot(results["first_call"], plt), os.path.join(out, "first_call.png"))
    f = results["first_call"]
    print(json.dumps({k: round(v * 1e3, 2) for k, v in f["median_seconds"].items()}, indent=1), "(ms)")
    print("bytecode:", f["bytecode"])
    for goal, value in f["goals"].items():
        print(f"{goal}: {value:.3f}")


if __name__ == "__main__":
    main()
