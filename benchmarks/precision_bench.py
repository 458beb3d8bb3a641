# ruff: noqa: B023 - the lambdas are timed at once, inside the loop
"""Precision conventions benchmark (issue 29, H200): nvdispatch following each framework's own precision convention
against that framework's best call, all peers in one process.

Modes, on each shape (``M x N x K``; RELU_BIAS, a bias along N):

``tf32``
    float32 Torch tensors with ``torch.backends.cuda.matmul.allow_tf32 = True``: nvdispatch (stateless, stateful,
    and with ``b`` given as ``W.T`` the way an ``nn.Linear`` weight comes; then again after ``Matmul.autotune()``)
    against Torch's best of ``torch._addmm_activation``, ``relu(addmm)`` and ``F.linear`` + ``relu_``;
    ``torch.matmul`` alone as the floor.
``autocast``
    the same float32 tensors inside ``torch.autocast("cuda", dtype=torch.bfloat16)``: the same peers, each result's
    dtype recorded (Torch's best is taken among the calls returning bfloat16, as a model in the region gets);
    nvdispatch on operands cast to bfloat16 beforehand shows what the casts cost.
``jax``
    float32 JAX arrays at JAX's default matmul precision: nvdispatch eagerly, and inside ``jax.jit`` through each of
    its GPU routes (the XLA FFI handler, the Python buffer callback) where supported, against
    ``jax.nn.relu(jnp.dot(a, b) + bias)`` under ``jax.jit`` (the goal) and eagerly. The staged plans are autotuned
    when traced (nvdispatch's default, as XLA tunes its own GEMMs); first, in a round of its own (a tuned plan is
    shared, and the untuned program's calls would follow it), the staged call traced with trace-time autotuning
    off against the same ``jax.jit`` peer (``cell["untuned"]``), and each program's first call (trace, compile,
    the tuning) in ``cell["first_call_seconds"]``. ``--no-autotune``: trace-time autotuning off throughout, no
    untuned round.

Torch times: CUDA events around back-to-back calls queued while the GPU is held busy (``torch.cuda._sleep``: the
host's cost hidden), the peers sampled in turns within each round, medians over rounds, and the ratio to Torch's
best per round too. JAX times, per peer and round, in turns (the order rotating each round, each sample after an
untimed call of its own), medians over rounds:

* GPU time (the goal's ratio, ``cell["ratio"]``, ``cell["seconds"]``): CUDA events on the stream the calls' work
  runs on (XLA's compute stream, named by the XLA FFI handler's launch record; the legacy default stream for the
  eager nvdispatch call), around :data:`JAX_GPU_CALLS` back-to-back calls queued behind a sleep kernel that holds
  the GPU about twice as long as the host takes to queue them; ``gpu_samples_back_to_back`` counts the samples
  where it did (the start event not reached before the host had queued the last call): the others include the
  host's gaps (the host waited on the GPU), an upper bound. Without an FFI launch record there is no GPU time,
  and ``basis`` says the ratios are wall clock's.
* wall clock (``cell["wall"]``): ~:data:`JAX_SAMPLE_SECONDS` of back-to-back calls ended by ``block_until_ready``
  and a device synchronisation, what a sample pays once amortized: what the caller waits, host included.
* a floor, timed in the same turns: a jitted one-element program (``FLOOR``), what any jitted call costs the
  host and the GPU.
* kernel time (``cell["kernel"]``, ``cell["kernel_ratio"]``): after the rounds, the kernels of
  :data:`PROFILED_CALLS` calls of each peer as CUPTI records them (Torch's profiler): the sum of their durations
  per call, no gaps, and the kernels that took most of it (XLA's GEMM kernel against nvdispatch's).

The XLA FFI handler's launch of each staged program (``cell["launch"]``, the untuned one's in
``cell["untuned"]["launch"]``) names the cuBLASLt algorithm (id, tile, stages, split-K, cluster) and workspace
it ran: a tuned and an untuned program told apart by their kernels, not only their times.
Each cell records ``explain()`` (the compute type and what chose it, the cuBLASLt compute type of the plan) and the
largest error relative to the largest float64 value on the first rows, which shows every peer at the same
precision (TF32's ~1e-3, bfloat16's ~1e-2). Goal: nvdispatch at most :data:`GOAL` times the best peer.

``python benchmarks/precision_bench.py [--out DIR]`` writes ``precision_bench.json`` and ``.png`` (default folder
``benchmarks/results``); ``--plot JSON`` redraws a figure. Needs an NVIDIA GPU and Torch with CUDA (says so and
exits with status 2 otherwise); JAX with CUDA is timed where installed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from _bench import cuda_event_seconds, gemm_shapes, output_dir, parser, progress, require_cuda_torch, save_plot

SHAPES = [(16384, 4096, 512), (4096, 4096, 4096), (8192, 1024, 8192), (2048, 11008, 4096), (1024, 1024, 1024)]
MODES = ("tf32", "autocast", "jax")
#: the goal of issue 29: nvdispatch at most this multiple of the framework's best call
GOAL = 1.0
#: GPU time per Torch sample (seconds): the number of calls per sample follows from a first timing
SAMPLE_SECONDS = 0.015
#: rows of the result whose error is measured against float64
ERROR_ROWS = 64
#: wall-clock seconds per JAX sample: enough back-to-back calls that what a sample pays once (the final
#: block_until_ready and synchronisation) amortizes
JAX_SAMPLE_SECONDS = 0.05
#: calls per JAX sample: at least, at most
JAX_MIN_CALLS, JAX_MAX_CALLS = 5, 1000
#: calls per JAX GPU sample: PjRt lets a device have 32 executions in flight, and the host waits on the GPU for
#: more (its gaps would show in the events); 10 keeps the eager peer's three executions a call below it
JAX_GPU_CALLS = 10
#: the longest sleep kernel a GPU sample queues its calls behind (seconds)
SLEEP_LIMIT_SECONDS = 1.0
#: the JAX cells' floor: a jitted one-element program, timed with the peers (JAX's cost per call of a program)
FLOOR = "jax.jit(x + 1), one element (JAX's cost per call)"
#: calls of each JAX peer whose kernels the profiler records
PROFILED_CALLS = 20
#: what counts as device time in a profiler trace (Chrome trace categories)
DEVICE_EVENT_KINDS = ("kernel", "gpu_memcpy", "gpu_memset")
#: the name of Torch's sleep kernel (``torch.cuda._sleep``), the marker between peers in a profiler trace
MARKER_KERNEL = "spin_kernel"


def _calls_per_sample(fn, torch) -> int:
    once = cuda_event_seconds(fn, torch, reps=3, inner=2, warmup=2)
    return max(3, min(200, int(SAMPLE_SECONDS / max(once, 1e-7))))


def _in_turns(peers: dict, torch, rounds: int) -> dict[str, list[float]]:
    """Per peer, one CUDA-event sample per round (host hidden behind a busy GPU), the peers in turns."""
    inner = {name: _calls_per_sample(fn, torch) for name, fn in peers.items()}
    samples: dict[str, list[float]] = {name: [] for name in peers}
    for _ in range(rounds):
        for name, fn in peers.items():
            n = inner[name]
            busy = int(SAMPLE_SECONDS * 3e9 / n)  # ~2 sample-lengths of busy GPU: it outlasts the host's launches
            samples[name].append(cuda_event_seconds(fn, torch, reps=1, inner=n, warmup=1, busy_cycles=busy))
    return samples


def _summary(samples: dict[str, list[float]], ours: list[str], theirs: list[str]) -> dict:
    """Medians, Torch's (JAX's) best peer, and each of ours against it: median ratio and per-round ratios."""
    seconds = {name: statistics.median(v) for name, v in samples.items()}
    best = min(theirs, key=seconds.get) if theirs else None
    cell = {"seconds": seconds, "best_peer": best}
    if best is not None:
        cell["ratio"] = {name: seconds[name] / seconds[best] for name in ours}
        cell["per_round_ratio"] = {
            name: [x / y for x, y in zip(samples[name], samples[best], strict=True)] for name in ours
        }
    return cell


def _rel_error(got, ref) -> float:
    import numpy as np

    got = np.asarray(got, dtype=np.float64)
    return float(np.max(np.abs(got - ref)) / max(float(np.max(np.abs(ref))), 1e-30))


def _torch_cells(shapes, modes, rounds: int, autotune: bool) -> list[dict]:
    """Per shape and mode, two phases timed in turns against Torch's calls: nvdispatch with the plans cuBLASLt's
    heuristic chose (stateless, ``b`` as ``W.T``, ``Matmul.execute``), then, after ``Matmul.autotune()`` (which
    retunes the cached plan those calls share), stateless and stateful calls again."""
    import torch

    import nvdispatch

    F = torch.nn.functional
    cells = []
    saved_tf32 = torch.backends.cuda.matmul.allow_tf32
    for (m, n, k), mode in progress([(s, md) for s in shapes for md in modes], "torch shapes x modes"):
        g = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(m, k, device="cuda", generator=g)
        b = torch.randn(k, n, device="cuda", generator=g)
        bias = torch.randn(n, device="cuda", generator=g)
        w_t = b.t().contiguous().t()  # the same values as an nn.Linear weight (N, K) seen as W.T
        kw = {"epilog": "RELU_BIAS", "epilog_inputs": {"bias": bias}}
        cell = {"mode": mode, "m": m, "n": n, "k": k, "flop": 2 * m * n * k}
        ref = torch.relu(a[:ERROR_ROWS].double() @ b.double() + bias.double()).cpu().numpy()
        want = "bfloat16" if mode == "autocast" else "float32"
        torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
        try:
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=mode == "autocast"):
                mm = nvdispatch.Matmul(a, b).plan(**kw)
                ours = {
                    "nvdispatch.matmul": lambda: nvdispatch.matmul(a, b, **kw),
                    "nvdispatch.matmul (b = W.T)": lambda: nvdispatch.matmul(a, w_t, **kw),
                    "nvdispatch Matmul.execute": mm.execute,
                }
                if mode == "autocast":
                    a16, b16, bias16 = a.bfloat16(), b.bfloat16(), bias.bfloat16()
                    ours["nvdispatch.matmul on bf16 operands (no casts)"] = lambda: nvdispatch.matmul(
                        a16, b16, epilog="RELU_BIAS", epilog_inputs={"bias": bias16}
                    )
                theirs = {
                    "torch._addmm_activation": lambda: torch._addmm_activation(bias, a, b),
                    "torch.relu(torch.addmm)": lambda: torch.relu(torch.addmm(bias, a, b)),
                    "F.linear + relu_": lambda: torch.relu_(F.linear(a, w_t.t(), bias)),
                }
                floor = {"torch.matmul alone (no epilog)": lambda: torch.matmul(a, b)}
                cell["explain"] = str(nvdispatch.explain(a, b, **kw))
                cell["dtype"], cell["rel_error"], errors = {}, {}, {}
                for name, fn in {**ours, **theirs, **floor}.items():
                    try:
                        out = fn()
                        cell["dtype"][name] = str(out.dtype).removeprefix("torch.")
                        if name not in floor:
                            cell["rel_error"][name] = _rel_error(out[:ERROR_ROWS].double().cpu().numpy(), ref)
                    except Exception as exc:  # noqa: BLE001 - recorded, the others still measured
                        errors[name] = repr(exc)
                # Torch's best among its calls returning what the mode asks (a call Torch does not autocast gives
                # float32: not what a model in the region gets)
                best_of = [nm for nm in theirs if nm not in errors and cell["dtype"].get(nm) == want]
                ours = {nm: fn for nm, fn in ours.items() if nm not in errors}
                timed = {nm: fn for nm, fn in {**theirs, **floor}.items() if nm not in errors}
                cell.update(_summary(_in_turns({**ours, **timed}, torch, rounds), list(ours), best_of))
                if autotune:
                    tuned = nvdispatch.Matmul(a, b).plan(**kw)
                    try:
                        cell["autotune_seconds"] = tuned.autotune(iterations=5)
                        plan = getattr(tuned._plan, "plan", tuned._plan)  # in a region: the cast problem's
                        cell["tuning"] = repr(plan.tuning()) if hasattr(plan, "tuning") else None
                        after = {
                            "nvdispatch.matmul (autotuned)": lambda: nvdispatch.matmul(a, b, **kw),
                            "nvdispatch Matmul.execute (autotuned)": tuned.execute,
                        }
                        phase = _summary(_in_turns({**after, **timed}, torch, rounds), list(after), best_of)
                        cell["autotuned"] = phase
                        cell.setdefault("ratio", {}).update(phase.get("ratio", {}))
                    except Exception as exc:  # noqa: BLE001 - recorded, the heuristic's figures stand
                        cell["autotune_error"] = repr(exc)
                    tuned.free()
                cell["errors"] = errors
                cell["tflops"] = {nm: cell["flop"] / t / 1e12 for nm, t in cell["seconds"].items()}
                mm.free()
        finally:
            torch.backends.cuda.matmul.allow_tf32 = saved_tf32
        nvdispatch.plan_cache.clear()
        cells.append(cell)
    return cells


def _staged_on(route: str, a, b, bias, autotune: str | None = None):
    """``nvdispatch.matmul(a, b, RELU_BIAS)`` inside ``jax.jit``, staged through GPU route ``route``, autotuned when
    traced as ``autotune`` says (None: the process's setting): traced and compiled on the first call inside
    :func:`~nvdispatch.integrations.jax_ffi.jax_route` (and
    :func:`~nvdispatch.integrations.jax_autotune.jax_autotune`), then called directly, as a user calls a
    program: no setting entered around the timed calls."""
    import contextlib

    import jax

    import nvdispatch
    from nvdispatch.integrations.jax_autotune import jax_autotune
    from nvdispatch.integrations.jax_ffi import jax_route

    staged = jax.jit(lambda x, w, v: nvdispatch.matmul(x, w, epilog="RELU_BIAS", epilog_inputs={"bias": v}))
    program = []

    def run():
        if not program:
            with jax_route(route), (jax_autotune(autotune) if autotune else contextlib.nullcontext()):
                program.append(staged.lower(a, b, bias).compile())
        return program[0](a, b, bias)

    return run


def _first_call(fn, jax) -> float:
    """Seconds of ``fn``'s first call (for a jitted function: trace, compile, trace-time autotuning, one run)."""
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - t0


# -- JAX timing: GPU time by CUDA events on the stream the work runs on, wall over long samples, kernel time -------
def _settle(fn, jax, torch):
    """One untimed call, finished: what the previous sample left (its allocations, queued work) is not charged
    to the next one."""
    jax.block_until_ready(fn())
    torch.cuda.synchronize()


def _calls_and_once(fn, jax, torch) -> tuple[int, float]:
    """Calls per sample (:data:`JAX_SAMPLE_SECONDS` of wall clock, at least :data:`JAX_MIN_CALLS`) and the wall
    seconds of one call, from a short timing."""
    _settle(fn, jax, torch)
    t0 = time.perf_counter()
    for _ in range(3):
        out = fn()
    jax.block_until_ready(out)
    torch.cuda.synchronize()
    once = (time.perf_counter() - t0) / 3
    return max(JAX_MIN_CALLS, min(JAX_MAX_CALLS, int(JAX_SAMPLE_SECONDS / max(once, 1e-7)))), once


def _wall_sample(fn, calls: int, jax, torch) -> float:
    """Wall seconds per call over ``calls`` back-to-back calls ended by ``block_until_ready`` and a device
    synchronisation (whatever stream the work ran on): the host's cost per call included, the end's amortized."""
    _settle(fn, jax, torch)
    t0 = time.perf_counter()
    for _ in range(calls):
        out = fn()
    jax.block_until_ready(out)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls


def _gpu_sample(fn, calls: int, once: float, stream, jax, torch) -> tuple[float, bool]:
    """GPU seconds per call: CUDA events on ``stream`` (where the calls' work runs) around ``calls`` calls queued
    behind a sleep kernel meant to hold the GPU about twice as long as the host takes to queue them, so the
    events time the GPU's work back to back, not the host's per-call cost. Also whether that held: the start
    event was not yet reached when the host had queued the last call. Where it was (the host waited on the GPU
    during the calls, or queued slower than the sleep lasted), the events include the host's gaps: an upper
    bound."""
    _settle(fn, jax, torch)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        torch.cuda._sleep(int(min(2 * calls * once + 1e-3, SLEEP_LIMIT_SECONDS) * 2e9))  # cycles at ~2 GHz
        start.record(stream)
    for _ in range(calls):
        out = fn()
    covered = not start.query()
    stop.record(stream)
    stop.synchronize()
    jax.block_until_ready(out)
    return start.elapsed_time(stop) * 1e-3 / calls, covered


def _jax_in_turns(peers: dict, streams: dict, jax, torch, rounds: int) -> dict:
    """Per peer and round, a wall sample and a GPU sample (where ``streams`` names the peer's stream), the peers
    in turns: the order rotates each round (no peer always follows the same one) and each sample follows an
    untimed call of its own. Returns ``{"gpu": {name: [s]}, "wall": {name: [s]}, "covered": {name: [bool]},
    "calls": {name: n}}``."""
    sizing = {name: _calls_and_once(fn, jax, torch) for name, fn in peers.items()}
    got: dict = {"gpu": {n: [] for n in peers if streams.get(n) is not None}, "wall": {n: [] for n in peers},
                 "covered": {n: [] for n in peers if streams.get(n) is not None},
                 "calls": {n: calls for n, (calls, _) in sizing.items()}}
    names = list(peers)
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            fn, (calls, once) = peers[name], sizing[name]
            got["wall"][name].append(_wall_sample(fn, calls, jax, torch))
            if streams.get(name) is not None:
                seconds, covered = _gpu_sample(fn, min(calls, JAX_GPU_CALLS), once, streams[name], jax, torch)
                got["gpu"][name].append(seconds)
                got["covered"][name].append(covered)
    return got


def _kernel_times(peers: dict, jax, torch, calls: int = PROFILED_CALLS) -> dict:
    """Per peer, device time per call as CUPTI records it (Torch's profiler traces every kernel of the process,
    XLA's included): the sum of the durations of the kernels, copies and fills of ``calls`` calls, per call, and
    the kernels that took most of it (name, launches per call, microseconds each). Gaps between kernels are not
    counted, whatever the host did: the cross-check of the event times. One profiler session for all peers, each
    peer's calls after a marker (Torch's sleep kernel) and finished before the next marker, so the trace's device
    events split at the markers."""
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    for fn in peers.values():
        _settle(fn, jax, torch)
    with tempfile.TemporaryDirectory() as tmp:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for fn in peers.values():
                torch.cuda._sleep(1000)  # the marker
                torch.cuda.synchronize()
                for _ in range(calls):
                    out = fn()
                jax.block_until_ready(out)
                torch.cuda.synchronize()
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as fh:
            events = json.load(fh).get("traceEvents", [])
    return _split_device_time(events, list(peers), calls)


def _split_device_time(events: list[dict], names: list[str], calls: int) -> dict:
    """Per name, :func:`_device_time` of the device events (Chrome trace, in time order) between its marker and
    the next; an error for each where the trace's markers are not one per name."""
    device = sorted((e for e in events if e.get("ph") == "X" and str(e.get("cat", "")).lower() in DEVICE_EVENT_KINDS),
                    key=lambda e: float(e.get("ts", 0.0)))
    segments: list[list[dict]] = []
    for e in device:
        if MARKER_KERNEL in str(e.get("name", "")):
            segments.append([])
        elif segments:
            segments[-1].append(e)
    if len(segments) != len(names):
        why = f"the profiler's trace has {len(segments)} markers for {len(names)} peers (no kernel times)"
        return {name: {"error": why} for name in names}
    return {name: _device_time(segment, calls) for name, segment in zip(names, segments)}


def _device_time(events: list[dict], calls: int) -> dict:
    if not events:
        return {"error": "the profiler recorded no kernel"}
    by_name: dict[str, list] = {}
    for e in events:
        entry = by_name.setdefault(str(e.get("name", "?")), [0, 0.0])
        entry[0] += 1
        entry[1] += float(e.get("dur", 0.0)) * 1e-6
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:4]
    return {
        "seconds": sum(t for _, t in by_name.values()) / calls,
        "launches_per_call": len(events) / calls,
        "kernels": [{"name": name[:200], "per_call": n / calls, "us_each": t / n * 1e6} for name, (n, t) in top],
    }


def _launch_records() -> dict:
    from nvdispatch.integrations import jax_ffi

    try:
        return {(r["plan"], r["device"]): r for r in jax_ffi.launch_records()}
    except Exception:  # noqa: BLE001 - no FFI handler: no records
        return {}


def _launch_of(fn, jax) -> dict | None:
    """What the XLA FFI handler launched for one call of ``fn`` (a staged program on an FFI route): the stream,
    alignment, workspace and the algorithm's configuration (cuBLASLt's id, tile, stages, split-K, ...); None
    where the handler launched nothing (the callback route, or a replayed command buffer)."""
    from types import SimpleNamespace

    before = _launch_records()
    jax.block_until_ready(fn())
    moved = [r for key, r in _launch_records().items() if r["calls"] != before.get(key, {}).get("calls", 0)]
    if not moved or not moved[-1].get("algorithm"):
        return None
    record = {f: moved[-1].get(f) for f in ("plan", "problem", "alignment", "workspace", "capacity", "stream")}
    try:
        from nvdispatch._cuda import cublaslt, lt_autotune

        algo = cublaslt.Algo.from_buffer_copy(moved[-1]["algorithm"])
        record["algorithm"] = lt_autotune.configuration(SimpleNamespace(algo=algo, workspaceSize=record["workspace"]))
    except Exception as exc:  # noqa: BLE001 - the stream and workspace are recorded
        record["algorithm"] = {"error": repr(exc)}
    return record


def _jax_summary(got: dict, ours: list[str], peer: str, basis: str) -> dict:
    """The goal's figures on ``basis`` ("gpu" or "wall") as :func:`_summary` gives them, the other beside; how
    many GPU samples were held back-to-back; calls per sample."""
    main = _summary(got[basis], [n for n in ours if n in got[basis]], [peer] if peer in got[basis] else [])
    main["basis"] = basis
    main["wall"] = _summary(got["wall"], ours, [peer])
    if got["gpu"]:
        main["gpu_samples_back_to_back"] = {n: f"{sum(c)}/{len(c)}" for n, c in got["covered"].items()}
    main["calls_per_sample"] = got["calls"]
    return main


def _xla_stream(staged: dict, jax, torch):
    """XLA's compute stream as a Torch stream (the stream the FFI handler was given: the ``ffi`` route's launch
    record), and what each staged route launched; (None, records, why) where no handler launch names one."""
    records = {name: _launch_of(fn, jax) for name, fn in staged.items()}
    named = [r["stream"] for n, r in records.items() if r and r.get("stream") and n.endswith("(ffi)")]
    named += [r["stream"] for r in records.values() if r and r.get("stream")]
    if not named:
        return None, records, "no XLA FFI launch names XLA's stream: GPU time not measured, the ratios are wall's"
    return torch.cuda.ExternalStream(int(named[0]), device=torch.device("cuda", 0)), records, ""


def _jax_cells(shapes, rounds: int, autotune: bool = True) -> list[dict]:
    import os

    import torch

    # JAX takes 75% of the GPU's memory at start unless told not to; Torch's cached blocks go first
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    torch.cuda.empty_cache()
    try:
        import jax
        import jax.numpy as jnp

        gpu = jax.devices("gpu")[0]
    except Exception as exc:  # noqa: BLE001
        print(f"JAX with CUDA unavailable ({exc}): no JAX cells")
        return []
    import numpy as np

    import nvdispatch

    default_stream = torch.cuda.default_stream()  # the legacy stream an eager call on JAX arrays launches on
    # JAX's own cost per call of a compiled program, timed in the rounds beside the peers: the floor under a
    # jitted call's wall clock (no ratio)
    tiny, one = jax.jit(lambda x: x + 1), jax.device_put(np.zeros(1, np.float32), gpu)
    floor = {FLOOR: lambda: tiny(one)}
    cells = []
    for m, n, k in progress(shapes, "jax shapes"):
        rng = np.random.default_rng(0)
        a64, b64, bias64 = rng.standard_normal((m, k)), rng.standard_normal((k, n)), rng.standard_normal(n)
        a = jax.device_put(a64.astype(np.float32), gpu)
        b = jax.device_put(b64.astype(np.float32), gpu)
        bias = jax.device_put(bias64.astype(np.float32), gpu)
        ref = np.maximum(
            a64[:ERROR_ROWS].astype(np.float32).astype(np.float64) @ b64.astype(np.float32) + bias64.astype(np.float32),
            0,
        )
        cell = {"mode": "jax", "m": m, "n": n, "k": k, "flop": 2 * m * n * k}
        jitted = jax.jit(lambda x, w, v: jax.nn.relu(jnp.dot(x, w) + v))
        peer = "jnp.dot + bias + relu (jax.jit)"
        theirs = {
            peer: lambda: jitted(a, b, bias),
            "jnp.dot + bias + relu (eager)": lambda: jax.nn.relu(jnp.dot(a, b) + bias),
        }
        kw = {"epilog": "RELU_BIAS", "epilog_inputs": {"bias": bias}}
        cell["first_call_seconds"] = {peer: _first_call(theirs[peer], jax)}
        # XLA's stream, from the handler's record of an untuned ffi program (its plan entry is its own)
        probe = _staged_on("ffi", a, b, bias, autotune="off")
        try:
            _first_call(probe, jax)
        except Exception as exc:  # noqa: BLE001 - no FFI route: wall only
            cell["ffi_error"] = repr(exc)
        xla_stream, _, why = _xla_stream({"(ffi)": probe}, jax, torch)
        basis = "gpu" if xla_stream is not None else "wall"
        cell["gpu_time"] = why or ("CUDA events on XLA's compute stream (the eager nvdispatch call's: the legacy "
                                   "default stream it launches on)")
        if autotune:  # the untuned staged call first: once the plan is tuned, its calls would follow
            name = "nvdispatch.matmul inside jax.jit (ffi-graphs, untuned)"
            untuned = _staged_on("ffi-graphs", a, b, bias, autotune="off")
            try:
                cell["first_call_seconds"][name] = _first_call(untuned, jax)
                peers = {name: untuned, peer: theirs[peer]}
                got = _jax_in_turns(peers, dict.fromkeys(peers, xla_stream), jax, torch, rounds)
                cell["untuned"] = _jax_summary(got, [name], peer, basis)
                cell["untuned"]["launch"] = _launch_of(untuned, jax)
                try:
                    cell["untuned"]["kernel"] = _kernel_times(peers, jax, torch)
                except Exception as exc:  # noqa: BLE001 - the event and wall figures stand
                    cell["untuned"]["kernel"] = {nm: {"error": repr(exc)} for nm in peers}
            except Exception as exc:  # noqa: BLE001 - the tuned figures stand
                cell["untuned"] = {"error": repr(exc)}
        ours = {"nvdispatch.matmul (eager)": lambda: nvdispatch.matmul(a, b, **kw)}
        for route in ("ffi-graphs", "ffi", "callback"):  # the GPU routes (integrations.jax_ffi)
            ours[f"nvdispatch.matmul inside jax.jit ({route})"] = _staged_on(route, a, b, bias)
        cell["rel_error"], errors = {}, {}
        for name, fn in {**ours, **theirs}.items():
            try:
                if "jit" in name and name not in cell["first_call_seconds"]:
                    cell["first_call_seconds"][name] = _first_call(fn, jax)
                cell["rel_error"][name] = _rel_error(np.asarray(fn())[:ERROR_ROWS], ref)
            except Exception as exc:  # noqa: BLE001 - nvdispatch inside jax.jit needs the JAX integration
                errors[name] = repr(exc)
        cell["explain"] = str(nvdispatch.explain(a, b, **kw))  # (after tracing: it says where the algorithm came from)
        timed = {nm: fn for nm, fn in {**ours, **theirs, **floor}.items() if nm not in errors}
        cell["launch"] = {nm: _launch_of(fn, jax) for nm, fn in timed.items() if "jit" in nm and nm in ours}
        streams = {nm: (default_stream if nm == "nvdispatch.matmul (eager)" else xla_stream) for nm in timed}
        if xla_stream is None:
            streams = {}
        got = _jax_in_turns(timed, streams, jax, torch, rounds)
        cell.update(_jax_summary(got, [nm for nm in ours if nm in timed], peer, basis))
        try:  # after the timed rounds: the profiler disturbs nothing timed
            cell["kernel"] = _kernel_times(timed, jax, torch)
        except Exception as exc:  # noqa: BLE001 - the event and wall figures stand
            cell["kernel"] = {nm: {"error": repr(exc)} for nm in timed}
        base = cell["kernel"].get(peer, {}).get("seconds")
        cell["kernel_ratio"] = {nm: kt["seconds"] / base for nm, kt in cell["kernel"].items()
                                if base and nm in ours and "seconds" in kt}
        cell["errors"] = errors
        cells.append(cell)
        nvdispatch.plan_cache.clear()
    return cells


def run(out_dir: str, shapes=SHAPES, modes=MODES, rounds: int = 7, autotune: bool = True) -> dict:
    torch = require_cuda_torch()
    import nvdispatch

    out_dir = output_dir(out_dir)
    results = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "nvdispatch": getattr(nvdispatch, "__version__", "?"),
        "goal": GOAL,
        "rounds": rounds,
        "error_rows": ERROR_ROWS,
        "cells": [],
    }
    torch_modes = [md for md in modes if md != "jax"]
    if torch_modes:
        results["cells"] += _torch_cells(shapes, torch_modes, rounds, autotune)
    if "jax" in modes:
        if not autotune:
            os.environ["NVDISPATCH_JAX_AUTOTUNE"] = "off"
        results["cells"] += _jax_cells(shapes, rounds, autotune)
    path = f"{out_dir}/precision_bench.json"
    with open(path, "w") as fh:
        json.dump(results, fh, indent=1, default=str)
    print(f"wrote {path}")
    for cell in results["cells"]:
        ratios = ", ".join(f"{nm} {r:.3f}x" for nm, r in _ratios(cell).items())
        basis = f" ({cell['basis']} time)" if "basis" in cell else ""
        print(f"{cell['mode']:8s} {cell['m']}x{cell['n']}x{cell['k']}: vs {cell.get('best_peer')}{basis}: {ratios}")
        if cell["mode"] == "jax":
            for what, got in (("wall", _ratios(cell, "wall")), ("kernel", cell.get("kernel_ratio", {}))):
                print(f"{'':8s}   {what}: " + ", ".join(f"{nm} {r:.3f}x" for nm, r in got.items()))
            _print_jax_times(cell)
    plot(path)
    return results


def _print_jax_times(cell: dict) -> None:
    """Microseconds per call of each peer of a JAX cell: GPU (events; how many samples back to back), wall,
    kernel time, and the kernel that took most of it."""
    untuned = cell.get("untuned", {})
    rows = {**cell.get("seconds", {}), **{nm: t for nm, t in untuned.get("seconds", {}).items() if "untuned" in nm}}
    for name, gpu in rows.items():
        part = untuned if name in untuned.get("seconds", {}) and "untuned" in name else cell
        wall = part.get("wall", {}).get("seconds", {}).get(name)
        held = part.get("gpu_samples_back_to_back", {}).get(name, "-")
        kernel = part.get("kernel", {}).get(name, {})
        top = (kernel.get("kernels") or [{}])[0]
        print(f"{'':11s}{name:58s} {cell.get('basis', 'gpu')} {gpu * 1e6:8.1f} us ({held})  wall "
              f"{(wall or 0) * 1e6:8.1f} us  kernels {kernel.get('seconds', 0) * 1e6:8.1f} us "
              f"{str(top.get('name', kernel.get('error', '')))[:60]}")


# -- plot ------------------------------------------------------------------------------------------------------
def plot(path: str) -> None:
    with open(path) as fh:
        data = json.load(fh)
    save_plot(lambda plt: _draw(data, plt), path.replace(".json", ".png"))


def _ratios(cell: dict, basis: str | None = None) -> dict[str, float]:
    """A cell's ratios to the best peer, its untuned staged call's (a JAX cell) included: the goal's (a JAX
    cell's: GPU time), or with ``basis="wall"`` a JAX cell's wall-clock ratios."""
    if basis is None:
        return {**cell.get("ratio", {}), **cell.get("untuned", {}).get("ratio", {})}
    return {**cell.get(basis, {}).get("ratio", {}), **cell.get("untuned", {}).get(basis, {}).get("ratio", {})}


def _draw(data: dict, plt) -> None:
    cells = [c for c in data["cells"] if c.get("ratio")]
    names = sorted({name for c in cells for name in _ratios(c)})
    labels = [f"{c['m']}x{c['n']}x{c['k']}\n{c['mode']}" for c in cells]
    fig, ax = plt.subplots(figsize=(max(10, 1.3 * len(cells) + 4), 5.5))
    width = 0.8 / max(1, len(names))
    wall_label = "wall clock (JAX cells)"
    for i, name in enumerate(names):
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(cells))]
        ax.bar(xs, [_ratios(c).get(name, 0) for c in cells], width, label=name)
        walls = [(x, w) for x, c in zip(xs, cells) if (w := _ratios(c, "wall").get(name)) is not None]
        if walls:  # JAX cells: the wall-clock ratio beside the GPU time's
            ax.scatter(*zip(*walls), marker="_", s=80, color="black", zorder=3, label=wall_label)
            wall_label = None
    ax.axhline(data.get("goal", GOAL), color="tab:red", linestyle="--", linewidth=0.8, label=f"goal {GOAL}x")
    ax.set_xticks(range(len(cells)), labels, fontsize=7)
    ax.set_ylabel("GPU time / the framework's best call (lower is better)")
    ax.set_title(
        f"RELU_BIAS at the framework's precision convention on {data.get('device', 'GPU')}: nvdispatch / best peer, "
        f"median of {data.get('rounds')} rounds in turns (CUDA events; JAX: wall clock as dashes)",
        fontsize=9,
    )
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()


def _modes(text: str) -> tuple[str, ...]:
    modes = tuple(m for m in text.split(",") if m)
    if not modes or any(m not in MODES for m in modes):
        raise argparse.ArgumentTypeError(f"modes among {','.join(MODES)}, not {text!r}")
    return modes


def main(argv=None) -> None:
    ap = parser(__doc__)
    ap.add_argument("--plot", metavar="JSON", help="redraw the figure of a results file, then exit")
    shapes = ",".join("x".join(map(str, s)) for s in SHAPES)
    ap.add_argument("--shapes", type=gemm_shapes, default=SHAPES, help=f"MxNxK,... (default: {shapes})")
    ap.add_argument("--modes", type=_modes, default=MODES, help=f"among {','.join(MODES)} (default: all)")
    ap.add_argument("--rounds", type=int, default=7, help="rounds of samples in turns (default: %(default)s)")
    ap.add_argument("--no-autotune", action="store_true",
                    help="skip the autotuned plans (Torch: Matmul.autotune(); JAX: trace-time autotuning off)")
    args = ap.parse_args(argv)
    if args.plot:
        plot(args.plot)
        return
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    run(args.out, args.shapes, args.modes, args.rounds, not args.no_autotune)


if __name__ == "__main__":
    main(sys.argv[1:])
