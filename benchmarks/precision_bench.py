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
best per round too. JAX times: wall clock over back-to-back calls ended by ``block_until_ready`` (and a device
synchronisation), in turns (the order rotating each round, each sample after an untimed call of its own), medians.
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


def _jax_in_turns(peers: dict, jax, torch, rounds: int, calls: int) -> dict[str, list[float]]:
    """Per peer, one wall-clock sample per round, the peers in turns. The order rotates each round and each sample
    follows one untimed call of its own peer: no peer always comes after the same one, and what the previous peer
    left (its allocations, the GPU's clocks after the synchronisation) is not charged to the next one's sample.
    (In the fixed order of the twelfth session's H100 run ``ffi-graphs`` always followed the eager call and was
    slower than ``ffi``, which launches the same cuBLASLt call, in 23 of 25 rounds, by 5% at the median.)"""
    samples: dict[str, list[float]] = {name: [] for name in peers}
    names = list(peers)
    for fn in peers.values():
        jax.block_until_ready(fn())
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            fn = peers[name]
            jax.block_until_ready(fn())
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                out = fn()
            jax.block_until_ready(out)
            torch.cuda.synchronize()  # whatever stream nvdispatch's kernels ran on
            samples[name].append((time.perf_counter() - t0) / calls)
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
        if autotune:  # the untuned staged call first: once the plan is tuned, its calls would follow
            name = "nvdispatch.matmul inside jax.jit (ffi-graphs, untuned)"
            untuned = _staged_on("ffi-graphs", a, b, bias, autotune="off")
            try:
                cell["first_call_seconds"][name] = _first_call(untuned, jax)
                once = _jax_in_turns({peer: theirs[peer]}, jax, torch, 1, 3)[peer][0]
                calls = max(3, min(100, int(SAMPLE_SECONDS / max(once, 1e-7))))
                samples = _jax_in_turns({name: untuned, peer: theirs[peer]}, jax, torch, rounds, calls)
                cell["untuned"] = _summary(samples, [name], [peer])
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
        timed = {nm: fn for nm, fn in {**ours, **theirs}.items() if nm not in errors}
        once = min(_jax_in_turns({nm: timed[nm]}, jax, torch, 1, 3)[nm][0] for nm in timed)
        calls = max(3, min(100, int(SAMPLE_SECONDS / max(once, 1e-7))))
        samples = _jax_in_turns(timed, jax, torch, rounds, calls)
        best_of = [nm for nm in theirs if nm not in errors and "jit" in nm] or [nm for nm in theirs if nm not in errors]
        cell.update(_summary(samples, [nm for nm in ours if nm not in errors], best_of))
        cell["errors"] = errors
        cell["calls_per_sample"] = calls
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
        print(f"{cell['mode']:8s} {cell['m']}x{cell['n']}x{cell['k']}: vs {cell.get('best_peer')}: {ratios}")
    plot(path)
    return results


# -- plot ------------------------------------------------------------------------------------------------------
def plot(path: str) -> None:
    with open(path) as fh:
        data = json.load(fh)
    save_plot(lambda plt: _draw(data, plt), path.replace(".json", ".png"))


def _ratios(cell: dict) -> dict[str, float]:
    """A cell's ratios to the best peer, its untuned staged call's (a JAX cell) included."""
    return {**cell.get("ratio", {}), **cell.get("untuned", {}).get("ratio", {})}


def _draw(data: dict, plt) -> None:
    cells = [c for c in data["cells"] if c.get("ratio")]
    names = sorted({name for c in cells for name in _ratios(c)})
    labels = [f"{c['m']}x{c['n']}x{c['k']}\n{c['mode']}" for c in cells]
    fig, ax = plt.subplots(figsize=(max(10, 1.3 * len(cells) + 4), 5.5))
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(cells))]
        ax.bar(xs, [_ratios(c).get(name, 0) for c in cells], width, label=name)
    ax.axhline(data.get("goal", GOAL), color="tab:red", linestyle="--", linewidth=0.8, label=f"goal {GOAL}x")
    ax.set_xticks(range(len(cells)), labels, fontsize=7)
    ax.set_ylabel("time / the framework's best call (lower is better)")
    ax.set_title(
        f"RELU_BIAS at the framework's precision convention on {data.get('device', 'GPU')}: nvdispatch / best peer, "
        f"median of {data.get('rounds')} rounds in turns",
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
