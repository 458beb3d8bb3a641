"""Transforms of JAX GPU arrays that no executor takes as they are: the ``cuda`` executor reads XLA's buffer by
pointer and runs real input to a complex transform, ``hfft``/``ihfft`` and padding by ``n``/``s`` with an array pass
of CuPy or Torch around cuFFT; where neither is installed (and for what cuFFT cannot express, a halved axis not the
innermost) it declines, and the calls run as inside ``jax.jit``, JAX's operations around the kernel, with
``jnp.fft``'s result dtype.

On the CPU the GPU is stood in for: the integration is told the arrays lie in CUDA memory and the selection finds
no executor (as on a GPU without CuPy/Torch), so the staged operations run eagerly with the kernel's host callback.
The ``gpu`` tests run the real thing (the cuda executor's route: test_jax_gpu_prepared_fft.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nvdispatch
import nvdispatch.fft as nf
import nvdispatch.integrations as integrations
from nvdispatch._cuda.xp import namespace_for
from nvdispatch.errors import NoExecutorError, UnsupportedDtypeError
from nvdispatch.fft import _route as fft_route
from nvdispatch.integrations import jax_fft

VALUES = np.random.default_rng(11).standard_normal((4, 6))
CALLS = [
    ("fft", {}),
    ("ifft", {"n": 9}),
    ("fftn", {}),
    ("ifftn", {"s": (5, 8), "axes": (0, 1)}),
    ("fft2", {}),
    ("irfft", {}),
    ("irfft", {"n": 7}),
    ("hfft", {}),
    ("hfft", {"n": 5, "norm": "ortho"}),
    ("irfftn", {"axes": (0,)}),
    ("rfft", {"n": 10}),
    ("ihfft", {}),
    ("rfftn", {"axes": (1, 0)}),
]


@pytest.fixture
def declined(monkeypatch):
    """The GPU stood in for: arrays in CUDA memory, no executor taking the problem as it is; counts the calls
    that ran as JAX's operations."""
    staged = []

    def no_executor(op, problem):
        staged.append(problem.func)
        why = [("cuda", "stood in: declined")]
        raise NoExecutorError("backend", f"an executor able to run this {op}", "jax operands", "cuda", declined=why)

    monkeypatch.setattr(integrations, "_in_cuda_memory", lambda x: True)
    monkeypatch.setattr(jax_fft, "select", no_executor)
    nvdispatch.plan_cache.clear()  # a CPU call of an earlier test keyed the same problem: it is not on a GPU
    yield staged
    nvdispatch.plan_cache.clear()


def _own(func, x, kwargs):
    try:
        return getattr(jnp.fft, func)(x, **kwargs)
    except (TypeError, ValueError):
        return None


def _oracle(func, x, kwargs):
    x = np.asarray(x.astype(jnp.complex64 if jnp.iscomplexobj(x) else jnp.float32))
    return getattr(np.fft, func)(x.astype(np.complex128 if np.iscomplexobj(x) else np.float64), **kwargs)


def _follows_jnp(func, x, kwargs):
    want = _own(func, x, kwargs)
    if want is None:
        with pytest.raises(UnsupportedDtypeError):
            getattr(nf, func)(x, **kwargs)
        return False
    got = getattr(nf, func)(x, **kwargs)
    assert isinstance(got, jax.Array) and got.dtype == want.dtype, (func, kwargs, got.dtype, want.dtype)
    assert got.devices() == x.devices()
    ref = _oracle(func, x, kwargs)
    tol = {"float16": 2e-2, "bfloat16": 6e-2}.get(str(x.dtype), 1e-5)
    np.testing.assert_allclose(np.asarray(got), ref, rtol=tol, atol=tol * np.abs(ref).max())
    return True


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "complex64"])
def test_declined_calls_run_as_jax_operations_with_jnp_dtypes(declined, dtype):
    x = jnp.asarray(VALUES + (1j * VALUES[::-1] if dtype == "complex64" else 0), dtype)
    for func, kwargs in CALLS:
        before = len(declined)
        if _follows_jnp(func, x, kwargs):
            assert len(declined) > before, (func, kwargs)  # the staged operations ran it, not the route


def test_float64_with_x64(declined, x64):
    x = jnp.asarray(VALUES, jnp.float64)
    for func, kwargs in CALLS:
        assert _follows_jnp(func, x, kwargs)
    assert {"fft", "irfft", "hfft", "ihfft"} <= set(declined)


def test_a_problem_an_executor_takes_stays_with_the_route(monkeypatch):
    """Only what the selection refuses is staged: where an executor takes the problem (and for a ``stream=``,
    which XLA's stream cannot honour), the handler steps aside and the route runs the call."""
    monkeypatch.setattr(integrations, "_in_cuda_memory", lambda x: True)
    x = jnp.asarray(VALUES, jnp.float32)
    assert jax_fft.eager_fft("fft", x) is NotImplemented  # the NumPy executor takes a CPU array
    assert jax_fft.eager_fft("fft", x, stream=0) is NotImplemented
    np.testing.assert_allclose(np.asarray(nf.fft(x)), np.fft.fft(VALUES), rtol=1e-5, atol=1e-5)


def test_explain_says_how_a_declined_call_runs(declined, monkeypatch):
    """``explain()`` of such a call says what runs it (JAX's operations, the kernel) and why no executor took it,
    where it raised NoExecutorError while the call itself ran; with a ``stream=`` (the route's), it still raises."""
    monkeypatch.setattr(fft_route, "select", jax_fft.select)  # the stand-in's selection: no executor
    x = jnp.asarray(VALUES, jnp.float16)
    e = nvdispatch.explain(nf.hfft, x, n=7, norm="ortho")
    assert e.executor == "jax" and e.strategy == "staged" and not e.cached
    text = str(e)
    for words in ("cast to complex64", "zero-padded/trimmed to [4]", "conjugated", "c2r transform", "scaled by"):
        assert words in text, (words, text)
    assert e.declined == (("cuda", "stood in: declined"),) and "float16 input: computed in float32" in e.precision
    assert e.problem.out_shape == nf.hfft(x, n=7).shape
    assert "moved last" in str(nvdispatch.explain(nf.rfftn, x.astype(jnp.float32), axes=(1, 0)))
    with pytest.raises(NoExecutorError):
        nvdispatch.explain(nf.fft, x.astype(jnp.float32), stream=0)


def test_arrays_outside_cuda_memory_are_not_offered():
    assert integrations._jax_eager_fft("fft", jnp.asarray(VALUES)) is NotImplemented
    assert integrations._jax_eager_fft_explain("fft", jnp.asarray(VALUES), None, ()) is NotImplemented
    assert not integrations._in_cuda_memory(np.ones(3))
    assert not integrations._in_cuda_memory(object())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "float32", "complex64"])
def test_on_the_gpu(dtype):
    """The real thing: JAX GPU arrays, whichever runs them (the ``cuda`` executor's array passes where CuPy or Torch is
    installed, else the staged operations), with ``jnp.fft``'s dtypes."""
    x = jnp.asarray(VALUES + (1j * VALUES[::-1] if dtype == "complex64" else 0), dtype)
    assert x.devices().pop().platform == "gpu"
    for func, kwargs in CALLS:
        _follows_jnp(func, x, kwargs)


@pytest.mark.gpu
def test_on_the_gpu_float64(x64):
    x = jnp.asarray(VALUES, jnp.float64)
    for func, kwargs in CALLS:
        assert _follows_jnp(func, x, kwargs)


@pytest.mark.gpu
def test_explain_on_the_gpu():
    x = jnp.asarray(VALUES, jnp.float32)
    # real input: the cuda executor's array pass, with CuPy or Torch; without either it declines, to the JAX route
    want = "jax" if namespace_for("jax") is None else "cuda"
    assert nvdispatch.explain(nf.fft, x).executor == want
    assert nvdispatch.explain(nf.rfftn, x, axes=(1, 0)).executor == "jax"  # a halved axis not the innermost
    taken = nvdispatch.explain(nf.fft, x.astype(jnp.complex64))
    assert taken.executor == "cuda", taken.declined
