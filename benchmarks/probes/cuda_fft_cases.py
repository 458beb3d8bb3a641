"""What the ``cuda`` executor's prepared FFTs cost (issue 31): real input to a complex transform, ``hfft``/``ihfft``,
padding by ``n``, run with an array pass around cuFFT for operands known only by ``__cuda_array_interface__`` and for
JAX GPU arrays, beside what runs the same transform otherwise.

Routes, per case (each checked against numpy.fft on the host copy; the largest error relative to the result's
largest magnitude is printed beside the time):

``cai-cuda``
    ``nvdispatch.fft.<func>`` of an object exposing only the CuPy array's ``__cuda_array_interface__`` (the cuda
    executor's prepared plan: input pass, cuFFT, output pass);
``cai-raw``
    the same call with neither CuPy nor Torch offered for the passes (as for a Numba-only user): the framework-free
    passes (``nvdispatch._cuda.raw_passes``: cudaMemsetAsync, strided cudaMemcpy2D/3DAsync, cuBLAS ?scal) around
    the same cuFFT plan;
``cupy``
    ``cupy.fft.<func>`` of the CuPy array itself (CuPy's own cuFFT plan cache; the reference cost of the work);
``jax-cuda``
    ``nvdispatch.fft.<func>`` of the JAX GPU array (the cuda executor's prepared plan, through JAX's buffer);
``jax-route``
    the same call with the cuda executor made to decline it (as where neither CuPy nor Torch is installed): JAX's
    operations around nvdispatch's cuFFT kernel (``integrations.jax_fft.eager_fft``), the route JAX calls took
    before;
``jnp``
    ``jax.numpy.fft.<func>`` itself.

Times are wall-clock seconds per call, the median of ``--rounds`` bursts of back-to-back calls, each burst ended by
a device synchronisation (so host cost and GPU time both count, as a caller sees them). A route whose framework is
not installed is left out.

    python benchmarks/probes/cuda_fft_cases.py [--rounds 5] [--calls 20] [--small] [--out FILE.json]

Needs an NVIDIA GPU and CuPy; JAX (with CUDA) for the ``jax-*`` routes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

# func, shape, dtype, kwargs
CASES = [
    ("fft", (4096, 1024), "float32", {}),
    ("fft2", (2048, 2048), "float32", {}),
    ("fft", (4096, 1000), "complex64", {"n": 1024}),
    ("fft", (4096, 1024), "complex64", {"n": 1000, "norm": "ortho"}),
    ("hfft", (4096, 513), "complex64", {}),
    ("ihfft", (4096, 1024), "float32", {}),
    ("fft", (4096, 1024), "float64", {"axis": 0}),
    ("fft", (64, 512, 512), "float32", {"n": 600, "axis": 1}),
]
SMALL = [
    ("fft", (64, 256), "float32", {}),
    ("hfft", (64, 129), "complex64", {"n": 256}),
]


class CaiOnly:
    def __init__(self, a):
        self._a = a

    @property
    def __cuda_array_interface__(self):
        return self._a.__cuda_array_interface__


def _make(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def _oracle(func, x, kw):
    x = x.astype(np.float64 if func in ("rfft", "ihfft") else np.complex128)
    return getattr(np.fft, func)(x, **kw)


def _time(fn, sync, rounds: int, calls: int) -> float:
    fn()
    sync()
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) / calls)
    return statistics.median(samples)


def _error(got, ref) -> float:
    scale = max(float(np.max(np.abs(ref))), 1e-30)
    return float(np.max(np.abs(np.asarray(got).astype(ref.dtype) - ref))) / scale


def routes(func, x, kw):
    """``name -> (call, to_host, sync)`` for the installed frameworks."""
    import cupy

    import nvdispatch.fft as F

    out = {}
    xc = cupy.asarray(x)
    cai = CaiOnly(xc)

    def dev_sync():
        cupy.cuda.Device().synchronize()

    def cai_host(r):
        return cupy.asnumpy(cupy.asarray(r)) if not hasattr(r, "copy_to_host") else r.copy_to_host()

    def cai_raw():
        from nvdispatch._cuda import xp

        saved = xp.namespace_for
        xp.namespace_for = lambda framework: None  # no CuPy/Torch helper: the framework-free passes
        try:
            return getattr(F, func)(cai, **kw)
        finally:
            xp.namespace_for = saved

    out["cai-cuda"] = (lambda: getattr(F, func)(cai, **kw), cai_host, dev_sync)
    out["cai-raw"] = (cai_raw, cai_host, dev_sync)
    out["cupy"] = (lambda: getattr(cupy.fft, func)(xc, **kw), cupy.asnumpy, dev_sync)
    try:
        import jax
        import jax.numpy as jnp

        gpu = jax.devices("gpu")[0]
    except Exception:  # noqa: BLE001 - no JAX, or no GPU for it
        return out
    xj = jax.device_put(x, gpu)

    def jax_sync():
        dev_sync()

    def jax_route():
        from nvdispatch._cuda import xp

        saved = xp.namespace_for
        xp.namespace_for = lambda framework: None  # the cuda executor declines: JAX's operations around the kernel
        try:
            return getattr(F, func)(xj, **kw).block_until_ready()
        finally:
            xp.namespace_for = saved

    out["jax-cuda"] = (lambda: getattr(F, func)(xj, **kw).block_until_ready(), np.asarray, jax_sync)
    out["jax-route"] = (jax_route, np.asarray, jax_sync)
    out["jnp"] = (lambda: getattr(jnp.fft, func)(xj, **kw).block_until_ready(), np.asarray, jax_sync)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="bursts per route (median reported)")
    ap.add_argument("--calls", type=int, default=20, help="back-to-back calls per burst")
    ap.add_argument("--small", action="store_true", help="also small (host-bound) transforms")
    ap.add_argument("--out", help="write the records as JSON here")
    args = ap.parse_args(argv)

    import nvdispatch

    records = []
    for func, shape, dtype, kw in CASES + (SMALL if args.small else []):
        x = _make(shape, dtype)
        ref = _oracle(func, x, kw)
        label = f"{func}({dtype}{list(shape)}, {', '.join(f'{k}={v}' for k, v in kw.items())})"
        for name, (call, to_host, sync) in routes(func, x, kw).items():
            nvdispatch.plan_cache.clear()
            try:
                err = _error(to_host(call()), ref)
                seconds = _time(call, sync, args.rounds, args.calls)
            except Exception as exc:  # noqa: BLE001 - a route that cannot run this case: say why, go on
                print(f"{label:58s} {name:10s} failed: {type(exc).__name__}: {exc}")
                records.append({"case": label, "route": name, "error": f"{type(exc).__name__}: {exc}"})
                continue
            print(f"{label:58s} {name:10s} {seconds * 1e3:9.3f} ms  rel.err {err:.1e}")
            records.append({"case": label, "route": name, "seconds": seconds, "rel_error": err})
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(records, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
