"""``nvdispatch.fft.convolve`` against the unfused peers, CuPy's ``ifft(fft(x) * h)`` and Torch's, on one GPU.

Every cell is a batch of ``batch`` signals of ``n`` points (complex ``x``: c64 or c128; real ``x``: float32 or
float64 with ``rfft``/``irfft``) filtered by one row ``h``. The three variants run in one process on the same
operands and stream, timed with CUDA events: bursts of back-to-back calls, ``--rounds`` rounds in rotating
order, the median per variant. Reported per cell:

* the speed-up of nvdispatch over CuPy and over Torch (their time / nvdispatch's);
* the strategy nvdispatch ran (the timed choice ``explain()`` shows, with its timings) and the first call's
  wall time (which includes compiling the candidates' kernels and timing them);
* the share of the HBM floor: the time one read of ``x`` and one write of the result take at the bandwidth
  of a device-to-device copy measured in the same run, over nvdispatch's time;
* the largest error of each variant on a few rows against float64 NumPy.

Issue #30 item 4 asks for at least 1.5x both peers in every cell (never below 1.0x) and 70% of the HBM floor
at 65536x1024 c64: each cell's line marks ``LOSES`` where nvdispatch is slower than a peer and ``<1.5x`` where it
misses the goal, the next line shows the timings the route's own choice was made on (its candidates' medians),
and the run ends with the list of cells that lose or miss the goal (also in the JSON: ``loses_to``,
``below_goal``, ``route_us``).

Cells (``--quick``: the ``table`` group only): the issue's table (c64, complex: 65536x1024, 8192x4096,
1024x16384, 256x65536: group ``table``), long signals (n = 2^18, 2^20 at batch*n = 2^26 and 2^24: ``long``),
c128 and real signals at the table's sizes and 64x2^20 (``complex128``, ``float32``, ``float64``). ``--groups``
picks groups and their order (put the groups that matter most first). Kernel compilation dominates a fresh
process (the first call of a cell compiles every candidate of the timed choice that earlier cells did not:
up to a minute a cell), so ``--budget`` seconds bounds the run: a cell starts only while the time spent plus
the longest cell so far fits, and the cells left are listed as skipped. ``--resume`` then runs only the cells
the results file does not have yet (skipped, failed or never run) and adds them to it. The JSON is written
after every cell, and the JSON and the PNG when the run ends, is interrupted (Ctrl-C) or terminated (SIGTERM,
as ``timeout`` sends).

    python benchmarks/convolve_bench.py [--quick | --groups table,long] [--budget 450] [--resume] [--out DIR]
    # writes DIR/convolve_bench.json (with --groups: convolve_bench-<groups>.json) and DIR/<same>.png

Needs an NVIDIA GPU, Torch with CUDA, CuPy and numba-cuda; exits with status 2 and one line otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import sys
import time

import numpy as np
from _bench import cannot_run, output_dir, parser, progress, require, require_cuda_torch, require_numba_gpu, save_plot

TABLE = [(65536, 1024), (8192, 4096), (1024, 16384), (256, 65536)]
LONG = [(256, 1 << 18), (64, 1 << 20), (64, 1 << 18), (16, 1 << 20)]
EXTRA_SHAPES = [*TABLE, (64, 1 << 20)]
EXTRA_DTYPES = ["complex128", "float32", "float64"]
CHECK_ROWS = 3
PEERS = ("cupy", "torch")
#: issue #30 item 4: the speed-up over each peer in every cell, and the HBM floor share at 65536x1024 c64
GOAL_SPEEDUP = 1.5
GOAL_FLOOR = (65536, 1024, "complex64", 0.70)


GROUPS = ("table", "long", *EXTRA_DTYPES)


def cells(quick: bool, groups: tuple[str, ...] = GROUPS) -> list[dict]:
    """The cells to run, group by group in the order of ``groups``: ``quick`` keeps the ``table`` group only."""
    out = [{"batch": b, "n": n, "dtype": "complex64", "group": "table"} for b, n in TABLE]
    out += [{"batch": b, "n": n, "dtype": "complex64", "group": "long"} for b, n in LONG]
    for dtype in EXTRA_DTYPES:
        out += [{"batch": b, "n": n, "dtype": dtype, "group": dtype} for b, n in EXTRA_SHAPES]
    chosen = ("table",) if quick else groups
    return [c for g in chosen for c in out if c["group"] == g]


def cell_label(cell: dict) -> str:
    return f"{cell['batch']}x{cell['n']} {cell['dtype']}"


def verdict(result: dict) -> dict:
    """Where a measured cell stands against the issue's goal: the peers it is slower than (``loses_to``), the
    peers it is under :data:`GOAL_SPEEDUP` against (``below_goal``), and at the floor cell its floor share."""
    ratios = {peer: result[f"speedup_over_{peer}"] for peer in PEERS}
    out = {
        "loses_to": [peer for peer, r in ratios.items() if r < 1.0],
        "below_goal": [peer for peer, r in ratios.items() if r < GOAL_SPEEDUP],
    }
    b, n, dtype, share = GOAL_FLOOR
    if (result["batch"], result["n"], result["dtype"]) == (b, n, dtype):
        out["below_floor_goal"] = result["hbm_floor_share"] < share
    return out


def route_timings(explanation) -> dict[str, float]:
    """The medians (us per call) the route's timed choice chose on, from ``explain()``'s first step; empty when
    the choice was not timed (a model's choice, or a single strategy offered)."""
    head = explanation.steps[0] if explanation.steps else ""
    m = re.search(r"median us per call: ([^)]*)\)", head)
    if not m:
        return {}
    out = {}
    for item in m.group(1).split(", "):
        label, _, us = item.rpartition(" ")
        try:
            out[label] = float(us)
        except ValueError:
            continue
    return out


def fits(elapsed: float, longest: float, budget: float | None) -> bool:
    """Whether a cell may start: with no budget always, else while the time spent plus the longest cell so far
    stays within it."""
    return budget is None or elapsed + longest <= budget


def findings(summary: dict) -> list[str]:
    """The closing lines: the cells where nvdispatch loses to a peer or misses the goal, failed and skipped."""
    done = [c for c in summary["cells"] if "error" not in c]
    lines = []
    loses = [c for c in done if c["loses_to"]]
    short = [c for c in done if c["below_goal"] and not c["loses_to"]]
    floor = [c for c in done if "below_floor_goal" in c]

    def said(c):
        ratios = "/".join(f"{c[f'speedup_over_{p}']:.2f}" for p in PEERS)
        return f"{cell_label(c)} ({c['strategy']}, x{ratios} CuPy/Torch)"

    lines.append(f"LOSES to a peer (< 1.0x): {'; '.join(map(said, loses)) if loses else 'none'}")
    lines.append(f"below the {GOAL_SPEEDUP}x goal: {'; '.join(map(said, short)) if short else 'none besides those'}")
    for c in floor:
        met = "NOT met" if c["below_floor_goal"] else "met"
        share, goal = 100 * c["hbm_floor_share"], 100 * GOAL_FLOOR[3]
        lines.append(f"HBM floor at {cell_label(c)}: {share:.0f}% (goal {goal:.0f}%: {met})")
    failed = [cell_label(c) for c in summary["cells"] if "error" in c]
    if failed:
        lines.append(f"failed: {', '.join(failed)}")
    if summary.get("skipped"):
        lines.append(f"skipped (budget or interrupted; --resume runs them): {', '.join(summary['skipped'])}")
    return lines


class Stop(BaseException):
    """SIGTERM, raised where the run is (past the cell's ``except Exception``), so the results so far are
    written."""


def _on_sigterm(signum, frame):
    raise Stop(f"signal {signum}")


def group_list(text: str) -> tuple[str, ...]:
    """``--groups``: comma-separated names of :data:`GROUPS`."""
    names = tuple(g.strip() for g in text.split(",") if g.strip())
    bad = [g for g in names if g not in GROUPS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"expected names among {', '.join(GROUPS)}, got {text!r}")
    return names


def copy_bandwidth(torch, nbytes: int = 1 << 30, reps: int = 10) -> float:
    """Bytes per second a device-to-device copy moves (each byte read once and written once: 2 * nbytes)."""
    src = torch.empty(nbytes // 8, dtype=torch.float64, device="cuda").fill_(1.0)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) * 1e-3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / statistics.median(samples)


def time_rotating(torch, variants: dict, rounds: int, target_s: float = 2e-2) -> dict[str, float]:
    """Median seconds per call of each variant: per round, a burst of back-to-back calls of each (in an order
    rotated every round) between two CUDA events on the current stream. The bursts are long (about ``target_s``
    of GPU time) so that the host's latency before a burst's first launch and the GPU's clock ramp after the
    wait are a small share of each sample."""
    names = list(variants)
    bursts = {}
    for name in names:  # warm-up, and a burst length of about target_s
        variants[name]()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        variants[name]()
        b.record()
        b.synchronize()
        once = max(a.elapsed_time(b) * 1e-3, 1e-6)
        bursts[name] = max(1, min(200, round(target_s / once)))
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(bursts[name]):
                variants[name]()
            b.record()
            b.synchronize()
            samples[name].append(a.elapsed_time(b) * 1e-3 / bursts[name])
    return {name: statistics.median(samples[name]) for name in names}


def chosen_strategy(explanation) -> str:
    head = explanation.steps[0] if explanation.steps else ""
    m = re.match(r"chose (.+?)(?::| by |,)", head)
    if explanation.strategy == "timed" and m:
        return m.group(1)
    if explanation.strategy == "timed":
        return "timed (not chosen yet)"
    return explanation.strategy


def run_cell(cell: dict, torch, cupy, F, nvdispatch, bandwidth: float, rounds: int) -> dict:
    batch, n, dtype = cell["batch"], cell["n"], cell["dtype"]
    real = dtype.startswith("float")
    cdtype = {"float32": "complex64", "float64": "complex128"}.get(dtype, dtype)
    tdt, tcdt = getattr(torch, dtype), getattr(torch, cdtype)
    g = torch.Generator(device="cuda").manual_seed(0)
    if real:
        x = torch.randn(batch, n, device="cuda", dtype=tdt, generator=g)
    else:
        rdt = torch.float32 if dtype == "complex64" else torch.float64
        x = torch.complex(
            torch.randn(batch, n, device="cuda", dtype=rdt, generator=g),
            torch.randn(batch, n, device="cuda", dtype=rdt, generator=g),
        )
    m = n // 2 + 1 if real else n
    h = torch.randn(m, device="cuda", dtype=tcdt, generator=g)
    xc, hc = cupy.asarray(x), cupy.asarray(h)
    if real:
        variants = {
            "nvdispatch": lambda: F.convolve(x, h),
            "cupy": lambda: cupy.fft.irfft(cupy.fft.rfft(xc, axis=-1) * hc, n, axis=-1),
            "torch": lambda: torch.fft.irfft(torch.fft.rfft(x) * h, n),
        }
    else:
        variants = {
            "nvdispatch": lambda: F.convolve(x, h),
            "cupy": lambda: cupy.fft.ifft(cupy.fft.fft(xc, axis=-1) * hc, axis=-1),
            "torch": lambda: torch.fft.ifft(torch.fft.fft(x) * h),
        }
    t0 = time.perf_counter()
    first = F.convolve(x, h)
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    explanation = nvdispatch.explain(F.convolve, x, h)
    rows = torch.arange(0, batch, max(1, batch // CHECK_ROWS), device="cuda")[:CHECK_ROWS]
    xs = x[rows].cpu().numpy().astype(np.float64 if real else np.complex128)
    hs = h.cpu().numpy().astype(np.complex128)
    ref = np.fft.irfft(np.fft.rfft(xs) * hs, n) if real else np.fft.ifft(np.fft.fft(xs) * hs)
    errors = {}
    for name, fn in variants.items():
        got = first if name == "nvdispatch" else fn()
        got = torch.as_tensor(got, device="cuda")[rows].cpu().numpy()
        errors[name] = float(np.abs(got - ref).max() / np.abs(ref).max())
    del first
    seconds = time_rotating(torch, variants, rounds)
    ours = seconds["nvdispatch"]
    floor_bytes = x.numel() * x.element_size() * 2  # one read of x, one write of a result of x's dtype
    result = {
        **cell,
        "us": {k: v * 1e6 for k, v in seconds.items()},
        "speedup_over_cupy": seconds["cupy"] / ours,
        "speedup_over_torch": seconds["torch"] / ours,
        "strategy": chosen_strategy(explanation),
        "hbm_floor_share": floor_bytes / bandwidth / ours,
        "first_call_s": first_s,
        "max_rel_error": errors,
        "route_us": route_timings(explanation),
        "route_choice": explanation.steps[0] if explanation.steps else explanation.strategy,
        "explain": str(explanation),
    }
    result.update(verdict(result))
    return result


def _ratio(x: float) -> str:
    """A speed-up for the README's table: bold below the goal, with "(slower)" below 1.0."""
    if x < 1.0:
        return f"**{x:.2f} (slower)**"
    return f"**{x:.2f}**" if x < GOAL_SPEEDUP else f"{x:.2f}"


def markdown(paths: list[str]) -> str:
    """The cells of result files as the Markdown table of ``benchmarks/README.md``."""
    lines = [
        "| batch×n, dtype | chosen strategy | its µs | CuPy µs | Torch µs | × CuPy | × Torch | of HBM floor |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for path in paths:
        with open(path) as fh:
            summary = json.load(fh)
        for c in summary["cells"]:
            label = f"{c['batch']}×{c['n']} {c['dtype']}"
            if "error" in c:
                lines.append(f"| {label} | failed: {c['error'][:60]} | | | | | | |")
                continue
            us = c["us"]
            cupy_x, torch_x = (_ratio(c[f"speedup_over_{p}"]) for p in PEERS)
            lines.append(
                f"| {label} | {c['strategy']} | {us['nvdispatch']:.0f} | {us['cupy']:.0f} | {us['torch']:.0f} | "
                f"{cupy_x} | {torch_x} | {100 * c['hbm_floor_share']:.0f}% |"
            )
        lines += [f"| {label} | skipped (budget) | | | | | | |" for label in summary.get("skipped", [])]
    return "\n".join(lines)


def print_cell(r: dict) -> None:
    marks = ("  LOSES to " + "+".join(r["loses_to"])) if r["loses_to"] else ""
    if r["below_goal"] and not r["loses_to"]:
        marks = f"  <{GOAL_SPEEDUP}x vs " + "+".join(r["below_goal"])
    print(
        f"{cell_label(r):28s} ours {r['us']['nvdispatch']:9.1f} us  x{r['speedup_over_cupy']:.2f} CuPy  "
        f"x{r['speedup_over_torch']:.2f} Torch  {100 * r['hbm_floor_share']:5.1f}% floor  "
        f"{r['strategy']:22s} first call {r['first_call_s']:.1f} s  "
        f"err {max(r['max_rel_error'].values()):.1e}{marks}",
        flush=True,
    )
    timed = ", ".join(f"{label} {us:.1f}" for label, us in r["route_us"].items())
    print(f"{'':28s} route: {'timed (us) ' + timed if timed else r['route_choice']}", flush=True)


def draw_figure(summary: dict, path: str) -> None:
    done = [c for c in summary["cells"] if "error" not in c]
    if not done:
        return

    def draw(plt):
        labels = [f"{c['batch']}x{c['n']}\n{c['dtype']}" for c in done]
        xs = np.arange(len(done))
        fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(done)), 4.5))
        ax.bar(xs - 0.2, [c["speedup_over_cupy"] for c in done], 0.4, label="over CuPy ifft(fft(x)*h)")
        ax.bar(xs + 0.2, [c["speedup_over_torch"] for c in done], 0.4, label="over Torch")
        for i, c in enumerate(done):
            color = "red" if c["loses_to"] else ("darkorange" if c["below_goal"] else "black")
            text = f"{c['strategy']}\n{100 * c['hbm_floor_share']:.0f}% floor" + ("\nLOSES" if c["loses_to"] else "")
            ax.text(i, 0.05, text, ha="center", fontsize=6, color=color)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhline(GOAL_SPEEDUP, color="C2", lw=0.8, ls="--", label=f"goal {GOAL_SPEEDUP}x")
        ax.set_xticks(xs, labels, fontsize=6)
        for tick, c in zip(ax.get_xticklabels(), done):
            tick.set_color("red" if c["loses_to"] else "black")
        ax.set_ylabel("speed-up of nvdispatch.fft.convolve")
        ax.set_title(f"FFT convolution, one filter row, {summary['device']}")
        ax.legend(fontsize=7)
        fig.tight_layout()

    save_plot(draw, path)


def resumed(path: str, todo: list[dict]) -> tuple[list[dict], list[dict]]:
    """The cells of the results file at ``path`` that were measured (kept), and the cells of ``todo`` it lacks."""
    try:
        with open(path) as fh:
            old = json.load(fh)
    except (OSError, ValueError):
        return [], todo
    kept = [c for c in old.get("cells", []) if "error" not in c]
    have = {cell_label(c) for c in kept}
    return kept, [c for c in todo if cell_label(c) not in have]


def main():
    ap = parser(__doc__)
    ap.add_argument("--quick", action="store_true", help="only the issue's table (c64, complex x)")
    ap.add_argument(
        "--groups",
        type=group_list,
        default=None,
        help=f"comma-separated groups of cells to run, in this order, among {', '.join(GROUPS)} (default: all)",
    )
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per variant (default: %(default)s)")
    ap.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds the run should end within: a cell starts only while the time spent plus the longest cell so "
        "far fits (default: no bound)",
    )
    ap.add_argument(
        "--resume",
        action="store_true",
        help="run only the cells the results file lacks (skipped, failed or not yet run) and add them to it",
    )
    ap.add_argument(
        "--markdown", nargs="+", metavar="JSON", help="print the table of these result files for the README and exit"
    )
    args = ap.parse_args()
    if args.markdown:
        print(markdown(args.markdown))
        return
    torch = require_cuda_torch()
    cupy = require("cupy", "pip install 'nvdispatch[cupy]' (a CuPy build for your CUDA)")
    require_numba_gpu()
    try:
        import nvdispatch
        import nvdispatch.fft as F
    except ImportError as exc:  # pragma: no cover - an incomplete install
        cannot_run(f"nvdispatch does not import ({exc})")
    out = output_dir(args.out)
    stem = "convolve_bench" if args.groups is None else "convolve_bench-" + "-".join(args.groups)
    path = os.path.join(out, f"{stem}.json")
    start = time.perf_counter()
    signal.signal(signal.SIGTERM, _on_sigterm)
    bandwidth = copy_bandwidth(torch)
    todo = cells(args.quick, args.groups or GROUPS)
    kept, todo = resumed(path, todo) if args.resume else ([], todo)
    summary = {
        "device": torch.cuda.get_device_name(),
        "copy_bandwidth_TBps": bandwidth / 1e12,
        "timing": f"CUDA events, bursts of back-to-back calls, median of {args.rounds} rounds in rotating order",
        "hbm_floor": "one read of x and one write of the result at the copy bandwidth, over nvdispatch's time",
        "goal": f"issue #30 item 4: >= {GOAL_SPEEDUP}x CuPy and Torch in every cell, never below 1.0x; "
        f">= {100 * GOAL_FLOOR[3]:.0f}% of the HBM floor at {GOAL_FLOOR[0]}x{GOAL_FLOOR[1]} {GOAL_FLOOR[2]}",
        "quick": args.quick,
        "groups": list(args.groups or GROUPS),
        "cells": list(kept),
        "skipped": [],
    }
    if kept:
        summary["resumed"] = f"{len(kept)} cells measured by an earlier run (each cell's ratios are from one run)"
    print(f"{summary['device']}: device-to-device copy {bandwidth / 1e12:.2f} TB/s", flush=True)
    longest = 0.0
    try:
        for i, cell in enumerate(progress(todo, "cells", total=len(todo))):
            label = cell_label(cell)
            if not fits(time.perf_counter() - start, longest, args.budget):
                summary["skipped"] = [cell_label(c) for c in todo[i:]]
                break
            began, r = time.perf_counter(), None
            try:
                r = run_cell(cell, torch, cupy, F, nvdispatch, bandwidth, args.rounds)
                r["copy_bandwidth_TBps"] = bandwidth / 1e12
            except Exception as exc:  # noqa: BLE001 - record it, go on with the next cell
                summary["cells"].append({**cell, "error": f"{type(exc).__name__}: {exc}"})
                print(f"{label:28s} FAILED: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            finally:
                torch.cuda.empty_cache()  # the cell's operands are gone with run_cell's frame
                cupy.get_default_memory_pool().free_all_blocks()
            longest = max(longest, time.perf_counter() - began)
            if r is not None:
                summary["cells"].append(r)
                print_cell(r)
            summary["elapsed_s"] = time.perf_counter() - start
            with open(path, "w") as fh:
                json.dump(summary, fh, indent=2)
    except (Stop, KeyboardInterrupt) as exc:
        print(f"interrupted ({type(exc).__name__} {exc}): writing the cells measured so far", flush=True)
        have = {cell_label(c) for c in summary["cells"]}
        summary["skipped"] = [cell_label(c) for c in todo if cell_label(c) not in have]
    finally:
        summary["elapsed_s"] = time.perf_counter() - start
        with open(path, "w") as fh:
            json.dump(summary, fh, indent=2)
        print(f"wrote {path} ({len(summary['cells'])} cells, {len(summary['skipped'])} skipped)")
        for line in findings(summary):
            print(line, flush=True)
        draw_figure(summary, os.path.join(out, f"{stem}.png"))


if __name__ == "__main__":
    main()
