"""One short GPU run that tells whether nvdispatch's XLA FFI route works: the route each setting takes and why,
then for a few shapes and epilogs (jit, grad, vmap) the largest error against a float64 NumPy reference, per
route (``ffi``, ``ffi-graphs``: inside XLA's command buffers, ``callback``), and the time per call of a chain of
small staged matmuls on each route against XLA's own.

    python3 tests/jax_integration/ffi_smoke.py

Prints one line per check and ``SMOKE OK`` or ``SMOKE FAILED`` last (exit status 0 / 1). Not a pytest module
(the tests are test_jax_gpu_ffi.py); it runs in seconds.
"""

from __future__ import annotations

import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

import nvdispatch
from nvdispatch._compiled import hotpath
from nvdispatch.integrations.jax_ffi import jax_route, route, staged_plans

SHAPES = [(64, 32, 16), (257, 130, 72), (1024, 1024, 1024), (8192, 1024, 1024)]
#: largest error allowed, relative to the largest reference value (float32 at JAX's default precision: TF32)
BOUND = 1e-2


def _ref(a, w, bias, epilog):
    z = np.asarray(a, np.float64) @ np.asarray(w, np.float64) + np.asarray(bias, np.float64)
    return np.maximum(z, 0) if "RELU" in epilog else 0.5 * z * (1 + np.tanh(0.7978845608 * (z + 0.044715 * z**3)))


def _check(name: str, got, want, bound: float = BOUND) -> bool:
    err = float(np.abs(np.asarray(got, np.float64) - want).max() / max(np.abs(want).max(), 1e-30))
    ok = err <= bound
    print(f"  {name}: max rel error {err:.2e} {'ok' if ok else 'TOO LARGE'}", flush=True)
    return ok


def _one_route(name: str) -> bool:
    ok = True
    with jax_route(name):
        print(f"route {name!r} -> {route()}", flush=True)
        rng = np.random.default_rng(0)
        for m, n, k in SHAPES:
            a = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
            w = jnp.asarray(rng.standard_normal((k, n)) / np.sqrt(k), jnp.float32)
            bias = jnp.asarray(rng.standard_normal(n), jnp.float32)
            for epilog in ("RELU_BIAS", "GELU_BIAS"):
                f = jax.jit(lambda a, w, b, e=epilog: nvdispatch.matmul(a, w, epilog=e, epilog_inputs={"bias": b}))
                ok &= _check(f"{m}x{n}x{k} {epilog} jit", f(a, w, bias), _ref(a, w, bias, epilog))
            loss = lambda w, a=a, bias=bias: jnp.sum(  # noqa: E731
                nvdispatch.matmul(a, w, epilog="RELU_BIAS", epilog_inputs={"bias": bias}))
            g = jax.jit(jax.grad(loss))(w)
            # the mask of the forward that ran: at TF32 a pre-activation near zero may take the other side of
            # float64's, which moves a whole row of a into or out of the gradient
            y = jax.jit(lambda a, w, b: nvdispatch.matmul(a, w, epilog="RELU_BIAS", epilog_inputs={"bias": b}))
            mask = np.asarray(y(a, w, bias)) > 0
            ok &= _check(f"{m}x{n}x{k} RELU_BIAS grad", g, np.asarray(a, np.float64).T @ mask)
        batch = jnp.asarray(rng.standard_normal((3, 40, 24)), jnp.float32)
        w = jnp.asarray(rng.standard_normal((24, 8)), jnp.float32)
        bias = jnp.asarray(rng.standard_normal(8), jnp.float32)
        v = jax.jit(jax.vmap(lambda x: nvdispatch.matmul(x, w, epilog="RELU_BIAS", epilog_inputs={"bias": bias})))
        ok &= _check("vmap 3x(40x8x24) RELU_BIAS", v(batch), _ref(batch, w, bias, "RELU_BIAS"))
    return ok


def _host_cost() -> None:
    size, chain = 128, 64
    rng = np.random.default_rng(2)
    w = jnp.asarray(rng.standard_normal((size, size)) / np.sqrt(size), jnp.bfloat16)
    bias = jnp.zeros(size, jnp.bfloat16)
    x = jnp.asarray(rng.standard_normal((size, size)), jnp.bfloat16)

    def chained(layer):
        def f(h):
            for _ in range(chain):
                h = layer(h)
            return h

        return jax.jit(f)

    ours = lambda h: nvdispatch.matmul(h, w, epilog="RELU_BIAS", epilog_inputs={"bias": bias})  # noqa: E731
    fns = {"xla": chained(lambda h: jax.nn.relu(jnp.dot(h, w) + bias))}
    for name in ("ffi", "ffi-graphs", "callback"):
        with jax_route(name):  # traced and compiled on the route; called outside the block as compiled
            fns[name] = chained(ours).lower(x).compile()
            jax.block_until_ready(fns[name](x))
    times = {}
    for name, fn in fns.items():
        jax.block_until_ready(fn(x))
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(10):
                out = fn(x)
            jax.block_until_ready(out)
            best = min(best, (time.perf_counter() - t0) / 10 / chain)
        times[name] = best
    print("host+GPU time per small call (best of 5): " + ", ".join(f"{k} {v * 1e6:.2f} us" for k, v in times.items()))


def main() -> int:
    hp = hotpath()
    print(f"jax {jax.__version__}, devices {jax.devices()}")
    print(f"extension: {'built' if hp is not None else 'NOT built'}; XLA FFI handler: "
          f"{hp.ffi_info() if hp is not None else None} (built, XLA FFI API major, minor)")
    ok = True
    for name in ("ffi", "ffi-graphs", "callback"):
        try:
            ok &= _one_route(name)
        except Exception:  # noqa: BLE001 - a smoke run reports and goes on
            traceback.print_exc()
            ok = False
    print(f"FFI plan entries made: {len(staged_plans())}")
    try:
        _host_cost()
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        ok = False
    print("SMOKE OK" if ok else "SMOKE FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
