"""The demo of ``python -m nvdispatch``: what this machine offers, and one fused linear layer run on it.

Prints the frameworks, executors and GPUs found, then runs ``relu(x @ w + bias)`` as one nvdispatch call on
every available framework/device, checks it against NumPy, and prints the median of several warm calls and the
plan that was chosen. The timings show what a call costs here; they are not a benchmark (``benchmarks/``
times nvdispatch and each framework's own call side by side).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import nvdispatch
from nvdispatch import Epilog, _environment

WARMUP = 2

DESCRIPTION = (
    "What this machine offers (frameworks, executors, GPUs), then one fused linear layer, relu(x @ w + bias), run "
    "by nvdispatch on every framework and device found, checked against NumPy, with the median time of its warm "
    "calls and the plan each one ran."
)


def _operands(library: str, device: str, m: int, k: int, n: int):
    """The demo's operands, made with ``library`` (the demo shows each installed library in turn)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((k, n), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    want = np.maximum(x @ w + bias, 0)
    if library == "numpy":
        return (x, w, bias), want
    if library == "torch":
        import torch

        return tuple(torch.from_numpy(v).to(device) for v in (x, w, bias)), want
    if library == "dask":  # NumPy chunks, 2 x 2 blocks; the small bias is broadcast as it is
        import dask.array as da

        return (da.from_array(x, chunks=(-(-m // 2), -(-k // 2))), da.from_array(w, chunks=(-(-k // 2), -(-n // 2))),
                bias), want
    import cupy

    return tuple(cupy.asarray(v) for v in (x, w, bias)), want


def _finisher(library: str, device: str) -> Callable[[Any], Any]:
    """What completes a call's work with ``library``'s arrays, so that a timing covers it: Dask computes its
    graph (synchronous scheduler), GPU work is waited for."""
    if library == "dask":
        return lambda r: r.compute(scheduler="sync")
    if library == "torch" and device == "cuda":
        import torch

        return lambda r: (torch.cuda.synchronize(), r)[1]
    if library == "cupy":
        import cupy

        return lambda r: (cupy.cuda.get_current_stream().synchronize(), r)[1]
    return lambda r: r


def _to_numpy(r) -> np.ndarray:
    if isinstance(r, np.ndarray):
        return r
    if hasattr(r, "get"):
        return r.get()
    return r.detach().cpu().numpy()


def warm_median_seconds(call: Callable[[], Any], repeats: int, warmup: int = WARMUP) -> tuple[float, Any]:
    """Median wall time of ``repeats`` calls of ``call`` after ``warmup`` untimed ones, and the last result."""
    for _ in range(warmup):
        result = call()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = call()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples), result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's options, on ``parser`` (the demo is what ``python -m nvdispatch`` runs with no command)."""
    parser.add_argument(
        "--shape",
        type=_dimension,
        nargs=3,
        default=(512, 256, 128),
        metavar=("M", "K", "N"),
        help="sizes of the demo product: x is M x K, w is K x N, bias has N entries (default: 512 256 128)",
    )
    parser.add_argument(
        "--repeats",
        type=_at_least(5),
        default=7,
        metavar="R",
        help=f"warm calls timed per framework after {WARMUP} untimed ones; shows their median (default: 7, min. 5)",
    )


def run(args: argparse.Namespace) -> int:
    """Run the demo with the parsed ``args``; returns the exit status (1 if any result is wrong)."""
    m, k, n = args.shape
    found = _environment.environment()
    print(found)
    versions, gpus = found.frameworks, found.gpus

    runs = [("numpy", "cpu")]
    if versions["torch"]:
        runs.append(("torch", "cpu"))
        if gpus:
            runs.append(("torch", "cuda"))
    if versions["cupy"] and gpus:
        runs.append(("cupy", "cuda"))
    if versions["dask"]:
        runs.append(("dask", "cpu"))

    print(f"\nfused linear layer relu(x @ w + bias), x {m}x{k}, w {k}x{n}, bias ({n},), float32:")
    print(f"each time is the median of {args.repeats} warm calls (after {WARMUP} untimed ones) on this machine,")
    print("to show what a call costs here. It is not a benchmark: benchmarks/ times nvdispatch and each")
    print("framework's own call side by side, with many more samples.")
    failures = 0
    for framework, device in runs:
        try:
            error, seconds, explanation = _fused_layer(framework, device, args.shape, args.repeats)
        except Exception as exc:  # noqa: BLE001 - the demo reports every path it tries
            failures += 1
            print(f"\n  [{framework} on {device}] failed: {type(exc).__name__}: {exc}")
            continue
        ok = error < 1e-2  # loose enough for TF32 on GPUs
        failures += not ok
        print(f"\n  [{framework} on {device}] {'ok' if ok else 'WRONG'}  max rel. error {error:.1e}  "
              f"warm median {seconds * 1e3:.3f} ms")
        for line in str(explanation).splitlines():
            print("    " + line)
    stats = nvdispatch.plan_cache.stats()
    print(f"\nplan cache: {stats['size']} plan(s), {stats['hits']} hits, {stats['misses']} misses")
    return 1 if failures else 0


def _fused_layer(framework: str, device: str, shape: tuple[int, int, int], repeats: int):
    """One framework's run: its relative error against NumPy, the warm median in seconds, the explanation."""
    (x, w, bias), want = _operands(framework, device, *shape)
    kwargs = {"epilog": Epilog.RELU_BIAS, "epilog_inputs": {"bias": bias}}
    finish = _finisher(framework, device)
    seconds, got = warm_median_seconds(lambda: finish(nvdispatch.matmul(x, w, **kwargs)), repeats)
    got = _to_numpy(got)
    error = float(np.max(np.abs(got - want)) / max(1.0, float(np.max(np.abs(want)))))
    return error, seconds, nvdispatch.explain(x, w, **kwargs)


def _dimension(text: str) -> int:
    """argparse type of one --shape entry: a positive integer."""
    return _at_least(1)(text)


def _at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value

    return parse
