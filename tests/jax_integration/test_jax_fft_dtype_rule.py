"""JAX's dtype rule for the transforms, asked of ``jax.numpy.fft`` on the CPU: for every public transform and
float16, bfloat16, float32 and float64 (``jax_enable_x64``) input, the dtype nvdispatch decides (the adapter's
``fft_promotion`` hook, else the problem's own result dtype) is the one ``jnp.fft`` returns, and nvdispatch
refuses exactly what ``jnp.fft`` refuses; the eager and the jitted call give that dtype and the values of a
float64 NumPy oracle."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nvdispatch
import nvdispatch.fft as nf
from nvdispatch._fft_conventions import framework_promotion, names_one_axis
from nvdispatch._fft_problem import result_dtype
from nvdispatch.errors import UnsupportedDtypeError

#: public transform -> (the function of the n-D forms nvdispatch runs, the axes the public one passes)
FUNCS = {
    "fft": ("fft", None),
    "ifft": ("ifft", None),
    "rfft": ("rfft", None),
    "irfft": ("irfft", None),
    "hfft": ("hfft", None),
    "ihfft": ("ihfft", None),
    "fftn": ("fftn", None),
    "ifftn": ("ifftn", None),
    "rfftn": ("rfftn", None),
    "irfftn": ("irfftn", None),
    "fft2": ("fftn", (-2, -1)),
    "ifft2": ("ifftn", (-2, -1)),
    "rfft2": ("rfftn", (-2, -1)),
    "irfft2": ("irfftn", (-2, -1)),
}
DTYPES = ("float16", "bfloat16", "float32", "float64")
VALUES = np.random.default_rng(7).standard_normal((4, 6))


def _jnp_dtype(func, x):
    """What jnp.fft gives ``x`` (None where it refuses the dtype)."""
    try:
        return str(getattr(jnp.fft, func)(x).dtype)
    except (TypeError, ValueError):
        return None


def _decided(func, x):
    """The result dtype nvdispatch decides for ``x`` (None where it refuses): the framework's rule where it has
    one for the dtype, else the problem's (float32/float64 in, the same precision out)."""
    inner, axes = FUNCS[func]
    dtype = str(x.dtype)
    try:
        rule = framework_promotion(inner, x, dtype, names_one_axis(inner, axes))
        if rule is not None:
            return rule[1]
        return result_dtype(inner, dtype)
    except UnsupportedDtypeError:
        return None


def _oracle(func, x):
    wide = np.asarray(x.astype(jnp.float32), np.float64)
    return getattr(np.fft, func)(wide)


def _cases(x64):
    for func in FUNCS:
        for dtype in DTYPES:
            if dtype == "float64" and not x64:
                continue
            yield func, dtype


def _check(func, dtype):
    x = jnp.asarray(VALUES, dtype)
    want = _jnp_dtype(func, x)
    assert _decided(func, x) == want, (func, dtype)
    for call in (getattr(nf, func), jax.jit(getattr(nf, func))):
        if want is None:
            with pytest.raises(UnsupportedDtypeError):
                call(x)
            continue
        got = call(x)
        assert isinstance(got, jax.Array) and str(got.dtype) == want, (func, dtype, got.dtype)
        tol = 6e-2 if dtype == "bfloat16" else (2e-2 if dtype == "float16" else 1e-5)
        ref = _oracle(func, x)
        np.testing.assert_allclose(np.asarray(got), ref, rtol=tol, atol=tol * np.abs(ref).max())


@pytest.mark.parametrize(("func", "dtype"), list(_cases(False)))
def test_the_rule_is_jnp_ffts(func, dtype):
    _check(func, dtype)


@pytest.mark.parametrize("func", list(FUNCS))
def test_the_rule_is_jnp_ffts_with_x64(x64, func):
    for dtype in DTYPES:
        _check(func, dtype)


def test_the_expected_table():
    """The table the comparisons above rest on, as JAX documents its promotion (half precision and bfloat16
    computed in float32; real-input transforms take float32/float64 only): written out, so that a JAX that
    changed it is noticed here rather than followed silently."""
    for dtype in ("float16", "bfloat16", "float32"):
        x = jnp.asarray(VALUES, dtype)
        assert [_decided(f, x) for f in ("fft", "ifft", "fftn", "fft2")] == ["complex64"] * 4
        assert [_decided(f, x) for f in ("irfft", "hfft", "irfftn", "irfft2")] == ["float32"] * 4
        real_input = [_decided(f, x) for f in ("rfft", "ihfft", "rfftn", "rfft2")]
        assert real_input == ([None] * 4 if dtype != "float32" else ["complex64"] * 4)


@pytest.mark.parametrize("dtype", ["complex64", "float32"])
def test_explain_takes_a_dtype_the_transforms_take_as_it_is(dtype):
    """No promotion is planned for a dtype the transforms take as it is (a complex64 array's problem stays complex64:
    JAX's own rule answers it with the real dtype of its result, which would make it real)."""
    e = nvdispatch.explain(nf.fft, jnp.ones((4, 6), getattr(jnp, dtype)))
    assert e.problem.dtype == dtype and e.precision is None
