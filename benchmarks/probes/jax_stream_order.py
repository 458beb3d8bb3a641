"""Whether JAX GPU arrays through the raw ``"cuda"`` executor are read once XLA has written them, and handed back
only once the work writing the result is over, under the conditions that broke it: the input still being computed
by XLA when nvdispatch is called, the GPU shared with other busy processes, and the stream nvdispatch's own work
runs on held busy.

The failure it confirms fixed: ``tests/jax_integration/test_jax_gpu_prepared_fft.py::
test_stateless_calls_run_on_the_cuda_executor[float16-*]`` gave all-zero results with 5 pytest processes on one GPU.
A float16 JAX array is cast to float32 (``x.astype``, an XLA kernel queued on XLA's stream) right before the cuFFT
input pass reads it; that read went through JAX's ``__cuda_array_interface__``, which neither waits for the array
nor names XLA's stream, so under load the pass read the cast's memory before XLA wrote it.

Each round, for each dtype and call, the input is made *late* on purpose: ``y = x + 0 * s`` where ``s`` is the sum
of a chain of large matmuls XLA runs first (``--delay-iters`` of ``--delay-size``\\ ² products), so ``y`` is written
only after they finish; with ``--sleep-cycles`` Torch's ``_sleep`` kernel is queued on Torch's current stream (the
legacy default stream, the one the array passes, cuFFT and cuBLASLt run on for JAX operands) first, so that
nvdispatch's work finishes late and a result handed to JAX before it is over would be read too early. ``--load``
processes run the same calls in a loop meanwhile. Every call has new input values (memory read before XLA writes
it may hold an earlier input of the same shape). Every result is compared with NumPy (float64) on the host copy of
``x``; a call counts as failed beyond 1e-2 relative error (float16/bfloat16 inputs are cast to float32 first, so
the tolerance is float32's scaled; an all-zero result is counted apart).

    python benchmarks/probes/jax_stream_order.py [--rounds 20] [--load 4] [--load-start 20]
        [--dtypes float16 float32 bfloat16] [--delay-iters 30] [--delay-size 2048] [--sleep-cycles 20000000]
        [--unfixed] [--out DIR]

``--unfixed`` puts the old read back (JAX's ``__cuda_array_interface__``, no wait) to show that the probe sees the
race on this machine: expect failures with it and none without. Exit status 1 where any call failed (without
``--unfixed``). Needs an NVIDIA GPU, JAX with CUDA, and CuPy or Torch (the array passes); Torch for
``--sleep-cycles``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _bench import cannot_run, output_dir, parser, progress, require  # noqa: E402

#: (function, keyword arguments): the failing test's calls, the padded/trimmed and hfft/ihfft ones included
FFT_CALLS = [
    ("fft", {}),
    ("ifft", {"axis": 0}),
    ("fftn", {}),
    ("fft2", {}),
    ("ifftn", {"axes": (0, 1)}),
    ("fft", {"n": 30}),
    ("fft", {"n": 7, "axis": 0}),
    ("fftn", {"s": (12, 9), "axes": (0, 1)}),
    ("rfft", {"n": 25}),
    ("hfft", {"n": 21}),
    ("ihfft", {"n": 8}),
]
SHAPE = (10, 16)
TOLERANCE = 1e-2


def _oracle(np, func, host, kw):
    x = host.astype(np.float64)
    return getattr(np.fft, func)(x if func in ("rfft", "ihfft") else x.astype(np.complex128), **kw)


def _delayer(jax, jnp, iters: int, size: int):
    """``late(x)``: ``x`` again, written by XLA only after ``iters`` products of ``size``² matrices."""
    w = jax.random.normal(jax.random.PRNGKey(0), (size, size), jnp.float32) / size**0.5

    @jax.jit
    def late(x, w):
        s = jax.lax.fori_loop(0, iters, lambda i, m: jnp.tanh(m @ w), w).sum()
        return x + (s * 0).astype(x.dtype)  # XLA does not fold a float product with zero (NaN, infinities)

    return lambda x: late(x, w)


def _sleeper(cycles: int):
    """A busy kernel on Torch's current stream (None without Torch or cycles)."""
    if not cycles:
        return None
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return lambda: torch.cuda._sleep(cycles)


def _unfix():
    """The read of JAX arrays as it was: the protocol's (JAX's ``__cuda_array_interface__``), no wait."""
    from nvdispatch._adapters.jax import JaxAdapter

    JaxAdapter.device_view = lambda self, x: None


def run_calls(np, jax, jnp, nvdispatch, dtypes, rounds, late, sleep, show=True, seed=0) -> dict:
    import nvdispatch.fft as nf
    from nvdispatch.errors import UnsupportedDtypeError

    # new values for every call: memory read before XLA writes it may hold an earlier input of the same shape (XLA's
    # allocator hands the same blocks out again), which must not pass for this one
    rng = np.random.default_rng(seed)
    b32 = rng.standard_normal((48, 32)).astype(np.float32)
    stats: dict = {}
    cases = [(d, f, kw) for d in dtypes for f, kw in FFT_CALLS] + [(d, "matmul", {}) for d in dtypes]
    it = progress(range(rounds), "rounds") if show else range(rounds)
    for _ in it:
        for dtype, func, kw in cases:
            key = f"{dtype} {func}{'' if not kw else ' ' + json.dumps(kw)}"
            st = stats.setdefault(key, {"calls": 0, "failed": 0, "zero": 0, "max_rel_err": 0.0, "executor": ""})
            if st["executor"] == "refused":
                continue
            if func == "matmul":
                a32 = rng.standard_normal((64, 48)).astype(np.float32)
                a, b = jnp.asarray(a32, dtype), jnp.asarray(b32, dtype)
                want = np.asarray(a).astype(np.float64) @ np.asarray(b).astype(np.float64)
                y = late(a)
                if not st["executor"]:
                    st["executor"] = nvdispatch.explain(a, b).executor
                if sleep is not None:
                    sleep()
                got = nvdispatch.matmul(y, b)
            else:
                x = jnp.asarray(rng.standard_normal(SHAPE).astype(np.float32), dtype)
                want = _oracle(np, func, np.asarray(x), kw)
                y = late(x)
                if not st["executor"]:
                    try:
                        st["executor"] = nvdispatch.explain(getattr(nf, func), x, **kw).executor
                    except UnsupportedDtypeError:  # as jnp.fft refuses it
                        st["executor"] = "refused"
                        continue
                if sleep is not None:
                    sleep()
                got = getattr(nf, func)(y, **kw)
            g = np.asarray(got).astype(want.dtype)
            scale = max(1.0, float(np.abs(want).max()))
            err = float(np.abs(g - want).max()) / scale
            st["calls"] += 1
            st["max_rel_err"] = max(st["max_rel_err"], err)
            if err > TOLERANCE:
                st["failed"] += 1
                st["zero"] += int(not np.any(g))
    return stats


def load_worker(seconds: float, dtypes, delay_iters: int, delay_size: int) -> None:
    np, jax, jnp, nvdispatch = _imports()
    late = _delayer(jax, jnp, delay_iters, delay_size)
    stop = time.monotonic() + seconds
    seed = os.getpid()
    while time.monotonic() < stop:
        seed += 1
        run_calls(np, jax, jnp, nvdispatch, dtypes, 1, late, None, show=False, seed=seed)


def _imports():
    # several processes share the GPU: none may take most of its memory up front, as XLA does by default
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    np = require("numpy", "pip install numpy")
    jax = require("jax", "pip install 'jax[cuda12]'")
    import jax.numpy as jnp

    if not any(d.platform == "gpu" for d in jax.devices()):
        cannot_run(f"needs JAX with a CUDA GPU (JAX {jax.__version__} sees {jax.devices()})")
    import nvdispatch
    from nvdispatch._cuda.xp import namespace_for

    if namespace_for("jax") is None:
        cannot_run("the cuda executor's array passes for JAX arrays need CuPy or Torch")
    return np, jax, jnp, nvdispatch


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--rounds", type=int, default=20, help="rounds of every call (default: %(default)s)")
    ap.add_argument("--load", type=int, default=4, help="other processes running the calls meanwhile (default: 4)")
    ap.add_argument("--dtypes", nargs="+", default=["float16", "float32", "bfloat16"],
                    choices=["float16", "float32", "bfloat16"])  # fmt: skip
    ap.add_argument("--delay-iters", type=int, default=30, help="matmuls XLA runs before writing an input")
    ap.add_argument("--delay-size", type=int, default=2048, help="their size (default: %(default)s)")
    ap.add_argument("--sleep-cycles", type=int, default=20_000_000,
                    help="Torch _sleep cycles queued on its current stream before each call (0: none)")  # fmt: skip
    ap.add_argument("--unfixed", action="store_true", help="read JAX arrays the old way (expect failures)")
    ap.add_argument("--load-start", type=float, default=20.0,
                    help="seconds the load processes get to start before the calls (default: %(default)s)")  # fmt: skip
    ap.add_argument("--load-worker", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.load_worker is not None:
        if args.unfixed:
            _unfix()
        load_worker(args.load_worker, args.dtypes, args.delay_iters, args.delay_size)
        return
    np, jax, jnp, nvdispatch = _imports()
    if args.unfixed:
        _unfix()
    late = _delayer(jax, jnp, args.delay_iters, args.delay_size)
    late(jnp.ones(SHAPE, jnp.float32)).block_until_ready()  # compiled before the load starts
    workers = []
    for _ in range(args.load):
        cmd = [sys.executable, os.path.abspath(__file__), "--load-worker", "600", "--dtypes", *args.dtypes,
               "--delay-iters", str(args.delay_iters), "--delay-size", str(args.delay_size)]  # fmt: skip
        workers.append(subprocess.Popen(cmd + (["--unfixed"] if args.unfixed else []), stdout=subprocess.DEVNULL))
    try:
        time.sleep(args.load_start if workers else 0)  # the load processes import JAX and start their GPU work
        start = time.perf_counter()
        stats = run_calls(np, jax, jnp, nvdispatch, args.dtypes, args.rounds, late, _sleeper(args.sleep_cycles))
        seconds = time.perf_counter() - start
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait()
    failed = 0
    for key, st in stats.items():
        failed += st["failed"]
        print(f"{key:42s} {st['executor']:6s} calls {st['calls']:4d} failed {st['failed']:4d} (all zero "
              f"{st['zero']:4d})  max rel err {st['max_rel_err']:.1e}")  # fmt: skip
    print(f"{failed} failed calls of {sum(s['calls'] for s in stats.values())} in {seconds:.1f} s "
          f"({'unfixed read' if args.unfixed else 'as built'}, {args.load} load processes)")  # fmt: skip
    path = os.path.join(output_dir(args.out), "jax_stream_order.json")
    with open(path, "w") as f:
        json.dump({"jax": jax.__version__, "device": str(jax.devices()[0]), "unfixed": args.unfixed,
                   "load": args.load, "rounds": args.rounds, "stats": stats}, f, indent=1)  # fmt: skip
    print(f"wrote {path}")
    if failed and not args.unfixed:
        sys.exit(1)


if __name__ == "__main__":
    main()
