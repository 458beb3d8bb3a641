"""Cost of nvdispatch's calls staged into JAX programs (CPU): tracing and running, against the same program on
``jax.numpy``.

Cases (each a repeated call, timed per call): tracing (``jax.make_jaxpr`` of a fresh function, so nothing is
served from JAX's trace cache) a 16x16 float32 ``RELU_BIAS`` matmul, a 64-point complex64 fft and a 3-layer GELU
``jax_mlp.fused_mlp`` (64 rows, widths 16-32-32-8, its jitted chain traced inline), forward alone, under
``jax.grad`` and under ``jax.jvp``; tracing and lowering the gradient to XLA's input (``.lower``: a kernel
staged as a primitive is traced when lowered); calling the jitted forward and gradient programs (compiled once); and
the eager call on JAX arrays (no tracer: the route's cached path). Peers: ``jax.nn.relu(a @ b + bias)``,
``jnp.fft.fft`` and the same MLP in ``jnp``, in the same transformations. Contenders are interleaved round by
round; each sample is the calling thread's CPU time over ``--number`` calls; we report medians and the ratio to
the peer.

    python benchmarks/jax_staged_cost.py [--rounds 11] [--number 30] [--out benchmarks/results] [--quick]
    python benchmarks/jax_staged_cost.py --compare SRC_A SRC_B   # two source trees, alternately

A case a source tree cannot run (``jax.jvp`` before nvdispatch had forward mode) is left out of that tree's
results. Writes ``jax_staged_cost.json`` (and a PNG with matplotlib). Needs jax (``pip install
'nvdispatch[test]'``); exits with status 2 saying so when it is missing.
"""

from __future__ import annotations

import contextlib
import sys

import _host_overhead as host_overhead
import numpy as np


def _cases(nvd):
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    a, b = (jnp.asarray(rng.standard_normal((16, 16), dtype=np.float32)) for _ in range(2))
    bias = jnp.asarray(rng.standard_normal(16, dtype=np.float32))
    x = jnp.asarray((rng.standard_normal(64) + 1j * rng.standard_normal(64)).astype(np.complex64))

    def ours_mm(a, b, bias):
        return nvd.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})

    def peer_mm(a, b, bias):
        return jax.nn.relu(a @ b + bias)

    def ours_fft(x):
        return nvd.fft.fft(x)

    def peer_fft(x):
        return jnp.fft.fft(x)

    widths = (16, 32, 32, 8)
    ws = [jnp.asarray(rng.standard_normal((i, o), dtype=np.float32) / np.sqrt(i)) for i, o in zip(widths, widths[1:])]
    bs = [jnp.zeros(o, jnp.float32) for o in widths[1:]]
    h = jnp.asarray(rng.standard_normal((64, widths[0]), dtype=np.float32))

    def ours_mlp(h, ws, bs):
        from nvdispatch.integrations.jax_mlp import fused_mlp

        return fused_mlp(h, ws, bs, activation="gelu")

    def peer_mlp(h, ws, bs):
        for i, (w, b) in enumerate(zip(ws, bs)):
            h = h @ w + b
            h = h if i == len(ws) - 1 else jax.nn.gelu(h, approximate=True)
        return h

    def mlp_loss(mlp):
        return lambda h, ws, bs: jnp.sum(mlp(h, ws, bs) ** 2)

    def matmul_loss(mm):
        return lambda a, b, bias: jnp.sum(mm(a, b, bias) ** 2)

    def spectrum_loss(transform):
        return lambda x: jnp.sum(jnp.abs(transform(x)) ** 2)

    def family(f, loss, args, fresh=contextlib.nullcontext):
        """The case's calls of ``f`` on ``args``: tracing a fresh function each time (JAX's trace cache serves
        nothing; ``fresh``: the context that keeps ``f``'s own jitted parts from being served from it), compiled
        programs, the eager call."""
        forward, gradient = jax.jit(f), jax.jit(jax.grad(loss(f)))

        def traced(transform):
            def trace():
                with fresh():
                    return jax.make_jaxpr(transform(lambda *xs: f(*xs)))(*args)

            return trace

        return {
            "trace": traced(lambda g: g),
            "trace grad": traced(lambda g: jax.grad(loss(g))),
            "trace jvp": traced(lambda g: lambda *xs: jax.jvp(g, xs, xs)),
            "lower grad": lambda: jax.jit(jax.grad(loss(lambda *xs: f(*xs)))).lower(*args),
            "jitted": lambda: forward(*args).block_until_ready(),
            "jitted grad": lambda: jax.block_until_ready(gradient(*args)),
            "eager": lambda: jax.block_until_ready(f(*args)),
        }

    cases = {}
    for label, ours, peer, loss, args, fresh in (
        ("matmul RELU_BIAS", ours_mm, peer_mm, matmul_loss, (a, b, bias), contextlib.nullcontext),
        ("fft 64", ours_fft, peer_fft, spectrum_loss, (x,), contextlib.nullcontext),
        # fused_mlp runs its chain as a jitted function: traced inline (jax.disable_jit), not served from its cache
        ("fused_mlp 3 GELU layers", ours_mlp, peer_mlp, mlp_loss, (h, ws, bs), jax.disable_jit),
    ):
        mine, theirs = family(ours, loss, args, fresh), family(peer, loss, args, fresh)
        cases.update({f"{kind} {label}": (mine[kind], theirs[kind]) for kind in mine})
    runnable = {}
    for name, (ours, peer) in cases.items():
        try:
            ours()
        except Exception:  # noqa: BLE001 - a case this source tree cannot run is reported as missing
            continue
        runnable[name] = (ours, peer)
    got, want = jax.jit(jax.grad(matmul_loss(ours_mm)))(a, b, bias), jax.grad(matmul_loss(peer_mm))(a, b, bias)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(np.asarray(jax.jit(nvd.fft.fft)(x)), np.fft.fft(np.asarray(x)), rtol=1e-4, atol=1e-4)
    return runnable


def measure(rounds: int, number: int) -> dict:
    import nvdispatch

    return host_overhead.measure(_cases(nvdispatch), rounds, number, warmup=3, desc="staged JAX calls")


def main(argv=None) -> None:
    ap = host_overhead.parser(__doc__, __file__, rounds=11, number=30, repeats=3)
    args = ap.parse_args(argv)
    try:
        import jax  # noqa: F401
    except ImportError:
        print("needs jax: pip install 'nvdispatch[test]'")
        sys.exit(2)
    if args.quick:
        args.rounds, args.number, args.repeats = 3, 3, 1
    host_overhead.run(args, __file__, measure, "jax_staged_cost", "nvdispatch_us", "us per call (nvdispatch)",
                      log_scale=True)  # fmt: skip


if __name__ == "__main__":
    main()
