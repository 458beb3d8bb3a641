# ruff: noqa: B023 - the closures are called at once, inside the loop
"""GPU probe (issue 29; not a benchmark of record): do nvdispatch's two XLA FFI routes, ``ffi`` and ``ffi-graphs``
(the default), launch the same cuBLASLt call, and where does the time ``ffi-graphs`` loses against ``ffi`` go?

Both routes call the one C entry a problem's plan registers (the target is not part of the entry's key), so they
launch one descriptor, algorithm and workspace; what differs is XLA: ``ffi-graphs`` lets XLA put the call in a
command buffer (a CUDA graph), which XLA records by calling the handler under stream capture and then replays or
re-records (when a buffer it holds moves, e.g. the program's fresh output) instead of calling the handler.

For each shape (``M x N x K``, float32, RELU_BIAS, JAX's default precision) and each XLA setting (a fresh process
each: ``default``, and ``no-command-buffers``, ``XLA_FLAGS=--xla_gpu_enable_command_buffer=``, where both routes
must time alike), programs of ``u`` matmuls (u = 1, what precision_bench.py times, and ``--unroll``: independent
matmuls, one bias each, in one program, so the host's per-program cost is shared and XLA meets enough commands
to form a command buffer) through ``ffi-graphs``, ``ffi`` and XLA's own ``relu(dot + bias)``:

* the handler's launch record (``jax_ffi.launch_records``): launches per program run on the first run and on
  later runs (fewer than ``u``: XLA replays a captured graph), how many were under CUDA-graph capture, and the
  launch's algorithm (cuBLASLt's id, tile, stages, split-K, ...), the workspace given to cuBLASLt and the
  workspace buffer XLA allocated;
* whether XLA's optimized HLO names a command buffer;
* time per matmul: wall clock over back-to-back runs ended by ``block_until_ready``, the programs in turns (the
  order rotating each round, each sample after an untimed run), medians over ``--rounds``, and the ratio to XLA's
  program of the same ``u`` (per round too).
* with Torch (CUDA) installed, GPU time per matmul too: CUDA events on XLA's compute stream (the stream the ``ffi``
  launch record names, wrapped as a Torch ``ExternalStream``) around runs queued behind a sleep kernel that holds
  the GPU longer than the host takes to queue them, so the events see the GPU's work, not the host's per-run cost
  (``gpu_us_per_matmul``, ``gpu_ratio``; ``gpu_time`` says why where it is not measured). At most
  :data:`GPU_RUNS` runs a sample: XLA's GPU client keeps 32 executions in flight and the host waits on the GPU
  for more. Where the host still fell behind the sleep (the start event reached before the last run was
  queued), the events include its gaps: an upper bound; ``gpu_samples_back_to_back`` counts the samples where
  it did not.

    python benchmarks/probes/jax_ffi_routes.py [--shapes 4096x4096x4096,...] [--rounds 15] [--unroll 8]
        [--autotune auto] [--settings default,no-command-buffers] [--out DIR]

writes ``jax_ffi_routes.json`` in ``--out`` (default ``benchmarks/results``) and prints a table. Needs JAX with
CUDA and nvdispatch's extension built with the XLA FFI handler (says so and exits with status 2 otherwise).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _bench import CANNOT_RUN, cannot_run, gemm_shapes, output_dir, parser, progress  # noqa: E402

SHAPES = [(16384, 4096, 512), (4096, 4096, 4096), (8192, 1024, 8192), (2048, 11008, 4096), (1024, 1024, 1024)]
#: XLA settings, each in a process of its own (XLA reads XLA_FLAGS once)
SETTINGS = {"default": "", "no-command-buffers": "--xla_gpu_enable_command_buffer="}
ROUTES = ("ffi-graphs", "ffi")
XLA = "xla"
#: wall-clock seconds per timed sample: the runs per sample follow from a first timing
SAMPLE_SECONDS = 0.02
#: runs of each program between launch-record snapshots
RECORD_RUNS = 10
#: runs per GPU sample at most (XLA's GPU client: 32 executions in flight, then the host waits on the GPU)
GPU_RUNS = 10


def main(argv=None) -> int:
    ap = parser(__doc__)
    default = ",".join("x".join(map(str, s)) for s in SHAPES)
    ap.add_argument("--shapes", type=gemm_shapes, default=SHAPES, help=f"MxNxK,... (default: {default})")
    ap.add_argument("--rounds", type=int, default=15, help="timed rounds, programs in turns (default: %(default)s)")
    ap.add_argument("--unroll", type=int, default=8, help="matmuls of the unrolled programs (default: %(default)s)")
    ap.add_argument("--autotune", default="auto", choices=["auto", "always", "off"],
                    help="trace-time autotuning of the staged plans, as NVDISPATCH_JAX_AUTOTUNE (default: auto)")
    ap.add_argument("--settings", default=",".join(SETTINGS),
                    help=f"XLA settings among {','.join(SETTINGS)} (default: all)")
    ap.add_argument("--child", metavar="JSON", help=argparse_suppress())
    args = ap.parse_args(argv)
    settings = [s for s in args.settings.split(",") if s]
    if not settings or any(s not in SETTINGS for s in settings):
        ap.error(f"--settings among {','.join(SETTINGS)}")
    if args.rounds < 1 or args.unroll < 2:
        ap.error("--rounds must be at least 1 and --unroll at least 2")
    if args.child:
        return _child(args, settings[0])
    return _parent(args, settings)


def argparse_suppress():
    import argparse

    return argparse.SUPPRESS


# -- the parent: one process per XLA setting ---------------------------------------------------------------------
def _parent(args, settings) -> int:
    out_dir = output_dir(args.out)
    results = {"shapes": args.shapes, "rounds": args.rounds, "unroll": args.unroll, "autotune": args.autotune,
               "settings": {}}
    for setting in settings:
        part = os.path.join(out_dir, f"jax_ffi_routes.{setting}.part.json")
        env = dict(os.environ)
        env["XLA_FLAGS"] = " ".join(f for f in (env.get("XLA_FLAGS", ""), SETTINGS[setting]) if f)
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        print(f"== XLA setting {setting!r}: XLA_FLAGS={env['XLA_FLAGS']!r}", flush=True)
        shapes = ",".join("x".join(map(str, s)) for s in args.shapes)
        cmd = [sys.executable, os.path.abspath(__file__), "--child", part, "--settings", setting, "--shapes", shapes,
               "--rounds", str(args.rounds), "--unroll", str(args.unroll), "--autotune", args.autotune,
               "--out", out_dir]  # fmt: skip
        done = subprocess.run(cmd, env=env)
        if done.returncode == CANNOT_RUN:
            return CANNOT_RUN  # the child said what is missing
        if done.returncode != 0 or not os.path.exists(part):
            results["settings"][setting] = {"error": f"exit status {done.returncode}"}
            continue
        with open(part) as fh:
            results["settings"][setting] = json.load(fh)
        os.remove(part)
    path = os.path.join(out_dir, "jax_ffi_routes.json")
    with open(path, "w") as fh:
        json.dump(results, fh, indent=1, default=str)
    print(f"wrote {path}")
    _table(results)
    return 0


def _table(results: dict) -> None:
    for setting, got in results["settings"].items():
        if "error" in got:
            print(f"{setting}: {got['error']}")
            continue
        print(f"\n== {setting} (jax {got.get('jax')}, {got.get('device')}; captured-launch counting "
              f"{'on' if got.get('counting') else 'off'})")
        for cell in got["cells"]:
            print(f"{cell['shape']}: ({cell.get('gpu_time')})")
            for name, row in cell["programs"].items():
                rec, algo = row.get("record", {}), row.get("algorithm") or {}
                launches = (f"launches/run first {rec.get('first_per_run', '-')}, later {rec.get('later_per_run', '-')}"
                            f" (captured {rec.get('captured', '-')}, not {rec.get('uncaptured', '-')})") if rec else ""
                kernel = (f"algo {algo.get('id')} tile {algo.get('tile')} stages {algo.get('stages')} splitk "
                          f"{algo.get('splitk')} cluster {algo.get('cluster')}, ws {rec.get('workspace')}/"
                          f"{rec.get('capacity')} B") if algo else ""
                gpu_time = (f"GPU {row['gpu_us_per_matmul']:8.1f} us x{row['gpu_ratio']:.3f} "
                            f"({row.get('gpu_samples_back_to_back', '-')} back to back)"
                            if "gpu_us_per_matmul" in row else "GPU -")
                print(f"  {name:22s} {row['us_per_matmul']:9.1f} us/matmul  x{row.get('ratio', float('nan')):.3f}  "
                      f"{gpu_time}  "
                      f"cmdbuf-in-HLO {row.get('command_buffer_in_hlo')}  {launches}  {kernel}")


# -- the child: one XLA setting --------------------------------------------------------------------------------
def _child(args, setting: str) -> int:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        cannot_run("needs JAX with CUDA (pip install 'jax[cuda12]')")
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError as exc:
        cannot_run(f"needs JAX with CUDA and an NVIDIA GPU ({exc})")
    import numpy as np

    import nvdispatch
    from nvdispatch._cuda import cublaslt, lt_autotune
    from nvdispatch.integrations import jax_ffi
    from nvdispatch.integrations.jax_autotune import jax_autotune

    try:
        with jax_ffi.jax_route("ffi"):
            jax_ffi.route()
    except Exception as exc:  # noqa: BLE001 - the FFI route is what this probe is about
        cannot_run(f"needs nvdispatch's XLA FFI handler ({exc})")
    counting = jax_ffi.count_captured_launches(True)
    got = {"setting": setting, "xla_flags": os.environ.get("XLA_FLAGS", ""), "jax": jax.__version__,
           "device": str(gpu.device_kind), "counting": counting, "cells": []}

    def records() -> dict:
        return {(r["plan"], r["device"]): r for r in jax_ffi.launch_records()}

    def delta(before: dict, after: dict) -> dict:
        moved = [r for key, r in after.items() if r["calls"] != before.get(key, {}).get("calls", 0)]
        out = {f: sum(r[f] - before.get((r["plan"], r["device"]), {}).get(f, 0) for r in after.values())
               for f in ("calls", "captured", "uncaptured")}
        if moved:
            last = moved[-1]
            out.update({f: last[f] for f in ("plan", "index", "alignment", "workspace", "capacity", "stream")})
            out["algorithm"] = last["algorithm"]
        return out

    def configuration(algorithm: bytes, workspace: int) -> dict:
        from types import SimpleNamespace

        algo = cublaslt.Algo.from_buffer_copy(algorithm)
        return lt_autotune.configuration(SimpleNamespace(algo=algo, workspaceSize=workspace))

    for m, n, k in progress(args.shapes, f"shapes ({setting})"):
        rng = np.random.default_rng(0)
        a = jax.device_put(rng.standard_normal((m, k), dtype=np.float32), gpu)
        b = jax.device_put(rng.standard_normal((k, n), dtype=np.float32), gpu)
        biases = [jax.device_put(rng.standard_normal(n, dtype=np.float32), gpu) for _ in range(args.unroll)]
        cell = {"shape": f"{m}x{n}x{k}", "programs": {}}
        programs = {}
        for u in (1, args.unroll):
            vs = biases[:u]

            def xla(x, w, *vs):
                return tuple(jax.nn.relu(jnp.dot(x, w) + v) for v in vs)

            def ours(x, w, *vs):
                return tuple(nvdispatch.matmul(x, w, epilog="RELU_BIAS", epilog_inputs={"bias": v}) for v in vs)

            programs[f"{XLA} u={u}"] = (jax.jit(xla).lower(a, b, *vs).compile(), vs, u)
            for route in ROUTES:
                with jax_ffi.jax_route(route), jax_autotune(args.autotune):
                    compiled = jax.jit(ours).lower(a, b, *vs).compile()
                programs[f"{route} u={u}"] = (compiled, vs, u)
        # the launch record: each program's first run (XLA records a command buffer then), then later runs
        for name, (compiled, vs, u) in programs.items():
            row = cell["programs"][name] = {"u": u}
            try:
                row["command_buffer_in_hlo"] = "command_buffer" in compiled.as_text()
            except Exception as exc:  # noqa: BLE001 - the text is a hint only
                row["command_buffer_in_hlo"] = repr(exc)
            if name.startswith(XLA):
                jax.block_until_ready(compiled(a, b, *vs))
                continue
            before = records()
            jax.block_until_ready(compiled(a, b, *vs))
            first = delta(before, records())
            before = records()
            for _ in range(RECORD_RUNS):
                out = compiled(a, b, *vs)
            jax.block_until_ready(out)
            later = delta(before, records())
            del out
            launch = later if later.get("algorithm") else first  # the launch this route ran last
            row["record"] = {
                "first_per_run": first["calls"] / u,
                "later_per_run": later["calls"] / (u * RECORD_RUNS),
                "captured": first["captured"] + later["captured"],
                "uncaptured": first["uncaptured"] + later["uncaptured"],
                **{f: launch.get(f) for f in ("plan", "index", "alignment", "workspace", "capacity", "stream")},
            }
            if launch.get("algorithm"):
                row["algorithm_bytes"] = launch["algorithm"].hex()
                try:
                    row["algorithm"] = configuration(launch["algorithm"], launch["workspace"])
                except Exception as exc:  # noqa: BLE001 - the bytes are recorded
                    row["algorithm"] = {"error": repr(exc)}
        # timing: the programs in turns, medians over rounds
        once = {}
        for name, (compiled, vs, _) in programs.items():
            t0 = time.perf_counter()
            jax.block_until_ready(compiled(a, b, *vs))
            once[name] = time.perf_counter() - t0
        runs = {name: max(3, min(200, int(SAMPLE_SECONDS / max(t, 1e-6)))) for name, t in once.items()}
        samples: dict[str, list[float]] = {name: [] for name in programs}
        names = list(programs)
        for r in range(args.rounds):  # the order rotates: no program always follows the same one
            for name in names[r % len(names) :] + names[: r % len(names)]:
                compiled, vs, u = programs[name]
                jax.block_until_ready(compiled(a, b, *vs))  # untimed: what the previous program left is not charged
                t0 = time.perf_counter()
                for _ in range(runs[name]):
                    out = compiled(a, b, *vs)
                jax.block_until_ready(out)
                samples[name].append((time.perf_counter() - t0) / (runs[name] * u))
                del out
        gpu_times = _gpu_samples(programs, cell, a, b, runs, once, min(args.rounds, 7), jax)
        cell["gpu_time"] = gpu_times if isinstance(gpu_times, str) else "CUDA events on XLA's compute stream"
        for name, row in cell["programs"].items():
            u = row["u"]
            if not isinstance(gpu_times, str):
                row["gpu_us_per_matmul"] = statistics.median(gpu_times[name]) * 1e6
                row["gpu_ratio"] = statistics.median(gpu_times[name]) / statistics.median(gpu_times[f"{XLA} u={u}"])
            row["us_per_matmul"] = statistics.median(samples[name]) * 1e6
            row["samples_us"] = [s * 1e6 for s in samples[name]]
            row["runs_per_sample"] = runs[name]
            peer = statistics.median(samples[f"{XLA} u={u}"])
            row["ratio"] = statistics.median(samples[name]) / peer
            row["per_round_ratio"] = [x / y for x, y in zip(samples[name], samples[f"{XLA} u={u}"], strict=True)]
        got["cells"].append(cell)
        del programs
    with open(args.child, "w") as fh:
        json.dump(got, fh, indent=1, default=str)
    return 0


def _gpu_samples(programs: dict, cell: dict, a, b, runs: dict, once: dict, rounds: int, jax) -> dict | str:
    """Per program, GPU seconds per matmul in ``rounds`` samples (rotating turns): CUDA events on XLA's compute
    stream around runs queued behind a sleep kernel; or why they are not measured (a string)."""
    stream = cell["programs"].get("ffi u=1", {}).get("record", {}).get("stream")
    if not stream:
        return "no GPU time: the ffi launch record names no stream"
    try:
        import torch
    except ImportError:
        return "no GPU time: needs Torch with CUDA"
    if not torch.cuda.is_available():
        return "no GPU time: Torch finds no CUDA device"
    xla_stream = torch.cuda.ExternalStream(stream, device=torch.device("cuda", 0))
    samples: dict[str, list[float]] = {name: [] for name in programs}
    back_to_back: dict[str, list[bool]] = {name: [] for name in programs}
    names = list(programs)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            compiled, vs, u = programs[name]
            n = min(runs[name], GPU_RUNS)
            jax.block_until_ready(compiled(a, b, *vs))
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(xla_stream):
                # ~2 GHz: twice the wall time of n runs, so the host has queued them all before the GPU is free
                torch.cuda._sleep(int(min(2 * n * once[name] + 1e-3, 0.5) * 2e9))
                start.record(xla_stream)
            for _ in range(n):
                out = compiled(a, b, *vs)
            back_to_back[name].append(not start.query())
            stop.record(xla_stream)
            stop.synchronize()
            jax.block_until_ready(out)
            samples[name].append(start.elapsed_time(stop) * 1e-3 / (n * u))
            del out
    for name, held in back_to_back.items():
        cell["programs"][name]["gpu_samples_back_to_back"] = f"{sum(held)}/{len(held)}"
    return samples


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
