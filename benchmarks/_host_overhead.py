"""What the host-overhead benchmarks (``host_overhead_cpu.py``, ``host_overhead_wrapped.py``, ``mlp_host_cpu.py``,
``jax_staged_cost.py``) share: their command line, timing repeated cached calls against their peers, the same
measurement under several nvdispatch source trees in
alternating child processes, and the report (JSON, a table, a plot)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np
from _bench import output_dir, progress, save_plot

_KEYS = ("nvdispatch_us", "peer_us", "ratio")


def parser(
    doc: str, script: str, rounds: int, number: int, repeats: int, unit: str = "calls"
) -> argparse.ArgumentParser:
    """The scripts' shared options (``--rounds``, ``--number``, ``--out``, ``--quick``, ``--compare``, ``--repeats``)
    with each script's defaults; a script adds its own before parsing."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--number", type=int, default=number, help=f"{unit} per timed sample")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(script), "results"))
    ap.add_argument("--quick", action="store_true", help=f"a smoke test: few rounds and {unit}")
    ap.add_argument("--compare", nargs="+", metavar="SRC", help="nvdispatch source trees to compare")
    ap.add_argument("--repeats", type=int, default=repeats, help="child runs per source tree with --compare")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return ap


def measure(cases: dict, rounds: int, number: int, warmup: int, desc: str) -> dict:
    """``cases``: name -> ``(ours, peer)`` calls. Interleaved round by round; each sample is the calling thread's
    CPU time over ``number`` calls; the medians per call and their ratio, per case."""
    import nvdispatch

    samples = {name: ([], []) for name in cases}
    for ours, peer in cases.values():  # warm-up: plans cached (and whatever the peers compile)
        for _ in range(warmup):
            ours()
            peer()
    for _ in progress(range(rounds), desc):
        for name, (ours, peer) in cases.items():
            for fn, out in ((ours, samples[name][0]), (peer, samples[name][1])):
                t0 = time.thread_time()
                for _ in range(number):
                    fn()
                out.append((time.thread_time() - t0) / number)
    result = {}
    for name, (ours, peer) in samples.items():
        o, p = statistics.median(ours), statistics.median(peer)
        result[name] = {"nvdispatch_us": o * 1e6, "peer_us": p * 1e6, "ratio": o / p}
    return {"nvdispatch": os.path.dirname(os.path.dirname(nvdispatch.__file__)), "cases": result}


def compare(script: str, sources: list[str], repeats: int, rounds: int, number: int) -> dict:
    """Run ``script --child`` under each source tree (``PYTHONPATH=SRC``) in alternating child processes,
    ``repeats`` times; each case's medians per tree."""
    runs: dict[str, list] = {src: [] for src in sources}
    order = [src for _ in range(repeats) for src in sources]
    for src in progress(order, "compare", total=len(order)):
        env = dict(os.environ, PYTHONPATH=src)
        cmd = [sys.executable, script, "--child", "--rounds", str(rounds), "--number", str(number)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        runs[src].append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {
        src: {name: {k: statistics.median(r["cases"][name][k] for r in results) for k in _KEYS}
              for name in results[0]["cases"]}
        for src, results in runs.items()
    }  # fmt: skip


def run(args, script: str, measure_here: Callable[[int, int], dict], name: str, plot_value: str, ylabel: str,
        log_scale: bool = False) -> None:  # fmt: skip
    """The scripts' main after parsing: a child prints its measurement; otherwise measure (or ``--compare``),
    write ``<name>.json``, print the table and plot ``plot_value`` of each case per source tree."""
    if args.child:
        print(json.dumps(measure_here(args.rounds, args.number)))
        return
    meta = {"machine": platform.processor() or platform.machine(), "python": platform.python_version()}
    meta.update(rounds=args.rounds, number=args.number, numpy=np.__version__)
    if args.compare:
        results = {"compare": compare(script, args.compare, args.repeats, args.rounds, args.number),
                   "repeats": args.repeats}  # fmt: skip
    else:
        results = measure_here(args.rounds, args.number)
    out = output_dir(args.out)
    path = os.path.join(out, f"{name}.json")
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({**meta, **results}, fh, indent=1)
    table = results["compare"] if args.compare else {results["nvdispatch"]: results["cases"]}
    for src, cases in table.items():
        print(f"nvdispatch from {src}")
        for case, r in cases.items():
            print(f"  {case:36s} {r['nvdispatch_us']:8.2f} us  peer {r['peer_us']:7.2f} us  ratio {r['ratio']:.3f}")
    print(f"wrote {path}")

    def draw(plt):
        fig, ax = plt.subplots(figsize=(8, 4))
        names = list(next(iter(table.values())))
        width = 0.8 / len(table)
        for i, (src, cases) in enumerate(table.items()):
            xs = [j + i * width for j in range(len(names))]
            ax.bar(xs, [cases[n][plot_value] for n in names], width, label=src)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names, rotation=15, fontsize=7)
        ax.set_ylabel(ylabel)
        if log_scale:
            ax.set_yscale("log")
        ax.legend(fontsize=6)
        fig.tight_layout()

    save_plot(draw, os.path.join(out, f"{name}.png"))
