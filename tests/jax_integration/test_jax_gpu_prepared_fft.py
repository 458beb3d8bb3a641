"""JAX GPU arrays through the raw cuda executor's prepared transforms (real input to a complex transform,
hfft/ihfft, padding and trimming by n/s): the stateful ``FFT`` (which the eager JAX route does not serve) and the
stateless functions, against numpy.fft on the host copy, with ``jnp.fft``'s result dtypes. The array passes need
CuPy or Torch; without either these calls stay with the JAX route (test_jax_gpu_declined_fft.py)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from fft_reference import assert_close, make

import nvdispatch
import nvdispatch.fft as nf
from nvdispatch._cuda.xp import namespace_for
from nvdispatch.errors import UnsupportedDtypeError

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(namespace_for("jax") is None, reason="the array passes need CuPy or Torch"),
]

NORMS = ("backward", "ortho", "forward")
CALLS = [
    ("fft", {}),
    ("ifft", {"axis": 0}),
    ("fftn", {}),
    ("fft2", {}),
    ("ifftn", {"axes": (0, 1)}),
    ("fft", {"n": 30}),
    ("fft", {"n": 7, "axis": 0}),
    ("fftn", {"s": (12, 9), "axes": (0, 1)}),
    ("rfft", {"n": 25}),
    ("irfft", {}),
    ("irfft", {"n": 15}),
    ("hfft", {}),
    ("hfft", {"n": 21}),
    ("ihfft", {}),
    ("ihfft", {"n": 8}),
]


def _oracle(func, x, kw, norm):
    x = np.asarray(x).astype(np.float64)
    return getattr(np.fft, func)(x if func in ("rfft", "ihfft") else x.astype(np.complex128), norm=norm, **kw)


def _jnp_dtype(func, x, kw):
    try:
        return getattr(jnp.fft, func)(x, **kw).dtype
    except (TypeError, ValueError):
        return None


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_stateless_calls_run_on_the_cuda_executor(dtype, norm):
    x = jnp.asarray(make((10, 16), "float32"), dtype)
    host = np.asarray(x).copy()
    for func, kw in CALLS:
        want = _jnp_dtype(func, x, kw)
        if want is None:  # jnp.fft refuses the dtype: so does nvdispatch, with a dtype error
            with pytest.raises(UnsupportedDtypeError):
                getattr(nf, func)(x, norm=norm, **kw)
            continue
        e = nvdispatch.explain(getattr(nf, func), x, norm=norm, **kw)
        assert e.executor == "cuda", (func, kw, str(e))
        got = getattr(nf, func)(x, norm=norm, **kw)
        assert got.dtype == want and got.devices() == x.devices(), (func, kw, got.dtype, want)
        assert_close(np.asarray(got), _oracle(func, host, kw, norm), "float32")
    np.testing.assert_array_equal(np.asarray(x), host)  # XLA's buffer read by pointer, never written


@pytest.mark.parametrize("norm", NORMS)
def test_stateless_float64(x64, norm):
    x = jnp.asarray(make((10, 16), "float64"))
    for func, kw in CALLS:
        got = getattr(nf, func)(x, norm=norm, **kw)
        assert got.dtype == _jnp_dtype(func, x, kw)
        assert_close(np.asarray(got), _oracle(func, np.asarray(x), kw, norm), "float64")


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize(("dtype", "axes"), [("float32", None), ("float32", (1,)), ("float64", (0, 2))])
def test_stateful_c2c_of_real_jax_arrays(x64, dtype, axes, norm):
    x = make((6, 10, 8), dtype)
    xj = jnp.asarray(x)
    along = tuple(range(3)) if axes is None else axes
    with nf.FFT(xj, axes=axes, options={"fft_type": "C2C", "norm": norm}) as f:
        y = f.plan().execute()
        z = f.execute(direction="inverse")
        assert f.executor == "cuda"
    want = np.complex64 if dtype == "float32" else np.complex128
    assert y.dtype == want and z.dtype == want
    assert_close(np.asarray(y), np.fft.fftn(x.astype(np.float64), axes=along, norm=norm), dtype)
    assert_close(np.asarray(z), np.fft.ifftn(x.astype(np.float64), axes=along, norm=norm), dtype)
    np.testing.assert_array_equal(np.asarray(xj), x)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("parity", ["even", "odd"])
def test_stateful_c2r_of_real_jax_arrays(norm, parity):
    x = make((6, 9), "float32")
    xj = jnp.asarray(x)
    n = 2 * (9 - 1) + (parity == "odd")
    with nf.FFT(xj, options={"fft_type": "C2R", "last_axis_parity": parity, "norm": norm}) as f:
        y = f.plan().execute()
        assert f.executor == "cuda"
    assert y.dtype == np.float32 and y.shape == (6, n)
    assert_close(np.asarray(y), np.fft.irfftn(x.astype(np.complex128), s=(6, n), axes=(0, 1), norm=norm), "float32")
    np.testing.assert_array_equal(np.asarray(xj), x)
