"""JAX GPU arrays still being written by XLA when nvdispatch is called (the input of each call is the last step of
a chain of large products XLA runs first), through the raw ``cuda`` executor: the prepared FFTs (float16 input,
cast by XLA for the call, and float32), the plain transform and the matmul read the values, and the result handed
back to JAX holds the product of the work queued before it (a Torch busy kernel delays the stream the passes run
on). New values every call, against NumPy float64. Five test processes on one GPU once gave all-zero float16
results here (the input read through JAX's ``__cuda_array_interface__``, which does not wait). The CPU half:
``tests/core/test_stream_order_cpu.py``; under load: ``benchmarks/probes/jax_stream_order.py``."""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nvdispatch
import nvdispatch.fft as nf
from nvdispatch._cuda.xp import namespace_for

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(namespace_for("jax") is None, reason="the array passes need CuPy or Torch"),
]


@pytest.fixture(scope="module")
def late():
    """``late(x)``: ``x`` again, written by XLA only after 30 products of 2048x2048 matrices."""
    w = jax.random.normal(jax.random.PRNGKey(0), (2048, 2048), jnp.float32) / 2048**0.5

    @jax.jit
    def delayed(x, w):
        s = jax.lax.fori_loop(0, 30, lambda i, m: jnp.tanh(m @ w), w).sum()
        return x + (s * 0).astype(x.dtype)

    return lambda x: delayed(x, w)


def _busy_stream():
    """A busy kernel on Torch's current stream (the one the array passes and cuFFT take for JAX operands)."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        torch.cuda._sleep(20_000_000)


CALLS = [("fft", {}), ("ifft", {"axis": 0}), ("fft", {"n": 30}), ("fftn", {"s": (12, 9), "axes": (0, 1)}),
         ("rfft", {"n": 25}), ("hfft", {"n": 21})]  # fmt: skip


@pytest.mark.parametrize("busy", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize(("func", "kw"), CALLS)
def test_a_transform_reads_an_input_xla_is_still_writing(late, dtype, func, kw, busy):
    rng = np.random.default_rng(zlib.crc32(f"{dtype} {func} {kw} {busy}".encode()))
    for i in range(3):
        x = jnp.asarray(rng.standard_normal((10, 16)).astype(np.float32), dtype)
        host = np.asarray(x).astype(np.float64)
        try:
            got = None
            y = late(x)
            if busy:
                _busy_stream()
            got = getattr(nf, func)(y, **kw)
        except nvdispatch.errors.UnsupportedDtypeError:
            pytest.skip(f"jnp.fft refuses {dtype} for {func}")
        want = getattr(np.fft, func)(host if func in ("rfft", "ihfft") else host.astype(np.complex128), **kw)
        g = np.asarray(got).astype(want.dtype)
        assert np.any(g), f"call {i}: an all-zero result"
        scale = max(1.0, float(np.abs(want).max()))
        assert float(np.abs(g - want).max()) <= 1e-5 * scale * 30, f"call {i}"


@pytest.mark.parametrize("busy", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_a_matmul_reads_an_input_xla_is_still_writing(late, dtype, busy):
    rng = np.random.default_rng(7)
    b = jnp.asarray(rng.standard_normal((48, 32)).astype(np.float32), dtype)
    for i in range(3):
        a = jnp.asarray(rng.standard_normal((64, 48)).astype(np.float32), dtype)
        want = np.asarray(a).astype(np.float64) @ np.asarray(b).astype(np.float64)
        y = late(a)
        if busy:
            _busy_stream()
        got = np.asarray(nvdispatch.matmul(y, b)).astype(np.float64)
        tol = 5e-2 if dtype == "float16" else 1e-2  # (TF32 products, JAX's default; a stale read is off by O(1))
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * float(np.abs(want).max()), err_msg=f"call {i}")
