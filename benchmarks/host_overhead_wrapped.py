"""Host time of repeated calls on frameworks whose results come back through their adapter (JAX CPU arrays,
array-api-strict arrays, a bare DLPack producer): nvdispatch against the same framework's own call, same operands.

Cases (each a repeated call, timed per call): a 16x16 float32 matmul and RELU_BIAS on JAX CPU arrays (against
``jnp.matmul`` / ``jax.nn.relu(a @ b + bias)``), the same matmul on array-api-strict arrays (against
``xp.matmul``), a 64-point complex64 fft on JAX (against ``jnp.fft.fft``), and a 16x16 matmul of a DLPack-only
producer (against ``np.matmul`` on its NumPy view). Contenders are interleaved round by round; each sample is the
calling thread's CPU time over ``--number`` calls; we report medians and the ratio to the peer.

    python benchmarks/host_overhead_wrapped.py [--rounds 21] [--number 300] [--out benchmarks/results] [--quick]
    python benchmarks/host_overhead_wrapped.py --compare SRC_A SRC_B   # two source trees, alternately

Writes ``host_overhead_wrapped.json`` (and a PNG with matplotlib). Needs jax and array-api-strict (``pip install
'nvdispatch[test]'``); exits with status 2 saying so when they are missing.
"""

from __future__ import annotations

import sys

import _host_overhead as host_overhead
import numpy as np


class _Producer:
    """A DLPack producer no framework adapter claims (the generic DLPack adapter's)."""

    def __init__(self, arr):
        self.arr = arr

    def __dlpack__(self, **kw):
        return self.arr.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


def _cases(nvd):
    import array_api_strict as xp
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((16, 16), dtype=np.float32) for _ in range(2))
    bias = rng.standard_normal(16, dtype=np.float32)
    x = (rng.standard_normal(64) + 1j * rng.standard_normal(64)).astype(np.complex64)
    ja, jb, jbias, jx = jnp.asarray(a), jnp.asarray(b), jnp.asarray(bias), jnp.asarray(x)
    sa, sb = xp.asarray(a), xp.asarray(b)
    pa, pb = _Producer(a), _Producer(b)
    relu = {"epilog": nvd.Epilog.RELU_BIAS, "epilog_inputs": {"bias": jbias}}
    cases = {
        "jax 16x16 matmul": (lambda: nvd.matmul(ja, jb), lambda: jnp.matmul(ja, jb).block_until_ready()),
        "jax 16x16 RELU_BIAS": (
            lambda: nvd.matmul(ja, jb, **relu),
            lambda: jax.nn.relu(ja @ jb + jbias).block_until_ready(),
        ),
        "jax fft 64 complex64": (lambda: nvd.fft.fft(jx), lambda: jnp.fft.fft(jx).block_until_ready()),
        "array_api_strict 16x16 matmul": (lambda: nvd.matmul(sa, sb), lambda: xp.matmul(sa, sb)),
        "dlpack producer 16x16 matmul": (lambda: nvd.matmul(pa, pb), lambda: np.matmul(np.from_dlpack(pa), pb.arr)),
    }
    checks = [
        (nvd.matmul(ja, jb), a @ b),
        (nvd.matmul(ja, jb, **relu), np.maximum(a @ b + bias, 0)),
        (nvd.fft.fft(jx), np.fft.fft(x)),
        (np.from_dlpack(nvd.matmul(sa, sb)), a @ b),
        (nvd.matmul(pa, pb), a @ b),
    ]
    for got, want in checks:
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)
    return cases


def measure(rounds: int, number: int) -> dict:
    import nvdispatch

    return host_overhead.measure(
        _cases(nvdispatch), rounds, number, warmup=20, desc="host overhead (wrapping frameworks)"
    )


def main(argv=None) -> None:
    ap = host_overhead.parser(__doc__, __file__, rounds=21, number=300, repeats=3)
    args = ap.parse_args(argv)
    try:
        import array_api_strict  # noqa: F401
        import jax  # noqa: F401
    except ImportError as exc:
        print(f"needs jax and array-api-strict ({exc.name} is missing): pip install 'nvdispatch[test]'")
        sys.exit(2)
    if args.quick:
        args.rounds, args.number, args.repeats = 3, 20, 1
    host_overhead.run(
        args, __file__, measure, "host_overhead_wrapped", "nvdispatch_us", "us per call (nvdispatch)", log_scale=True
    )


if __name__ == "__main__":
    main()
