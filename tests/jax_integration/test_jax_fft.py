"""The ``nvdispatch.fft`` functions inside ``jax.jit``, under ``jax.grad`` and ``jax.vmap`` (CPU).

Values against ``numpy.fft`` in double precision (``fft_reference``); gradients against central finite
differences of ``numpy.fft`` in float64 along random directions (JAX's convention for complex inputs: the
gradient ``g`` of a real loss gives the directional derivative ``Re(sum(g * v))`` along ``v``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fft_reference import assert_close, make

import nvdispatch
from nvdispatch import plan_cache
from nvdispatch.errors import InvalidArgumentError

fft = nvdispatch.fft

#: (function, input dtype kind, keyword arguments): every transform, with n/s/axes/norm varied
CASES = [
    ("fft", "c", {}),
    ("fft", "r", {"n": 9, "axis": 0}),
    ("ifft", "c", {"n": 5, "norm": "ortho"}),
    ("fftn", "c", {}),
    ("fftn", "c", {"s": (3, 8), "axes": (2, 0), "norm": "forward"}),
    ("ifftn", "c", {"axes": (1,)}),
    ("rfft", "r", {}),
    ("rfft", "r", {"n": 7, "axis": 1, "norm": "ortho"}),
    ("irfft", "c", {}),
    ("irfft", "c", {"n": 9, "axis": 0}),
    ("rfftn", "r", {}),
    ("rfftn", "r", {"axes": (2, 0), "s": (6, 5)}),
    ("irfftn", "c", {"axes": (0, 1)}),
    ("irfftn", "c", {"s": (3, 4, 7), "axes": (0, 1, 2), "norm": "forward"}),
    ("hfft", "c", {}),
    ("hfft", "c", {"n": 7, "norm": "ortho"}),
    ("ihfft", "r", {}),
    ("ihfft", "r", {"n": 10, "axis": 0, "norm": "forward"}),
    ("fft2", "c", {}),
    ("ifft2", "c", {"axes": (0, 2)}),
    ("rfft2", "r", {"norm": "ortho"}),
    ("irfft2", "c", {"s": (4, 6)}),
]
SHAPE = (4, 5, 6)


def _input(kind, dtype_single=True, shape=SHAPE, seed=0):
    dtype = ("complex64" if kind == "c" else "float32") if dtype_single else ("complex128" if kind == "c" else "float64")
    return make(shape, dtype, seed), dtype


def _numpy(func, x, kw):
    return getattr(np.fft, func)(x.astype(np.complex128 if np.iscomplexobj(x) else np.float64), **kw)


@pytest.mark.parametrize("func, kind, kw", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_every_transform_inside_jit(func, kind, kw):
    x, dtype = _input(kind)
    got = jax.jit(lambda v: getattr(fft, func)(v, **kw))(x)
    want = _numpy(func, x, kw)
    assert isinstance(got, jax.Array)
    assert got.dtype == getattr(jnp.fft, func)(jnp.asarray(x), **kw).dtype  # JAX's own dtype rules agree
    assert_close(np.asarray(got), want, dtype)


@pytest.mark.parametrize("func, kind, kw", CASES[::3], ids=[c[0] for c in CASES[::3]])
def test_double_precision(x64, func, kind, kw):
    x, dtype = _input(kind, dtype_single=False)
    got = jax.jit(lambda v: getattr(fft, func)(v, **kw))(x)
    assert str(got.dtype) in ("float64", "complex128")
    assert_close(np.asarray(got), _numpy(func, x, kw), dtype)


@pytest.mark.parametrize(
    "func, kw",
    [("fftn", {}), ("ifftn", {"norm": "ortho"}), ("rfftn", {}), ("irfftn", {}), ("rfftn", {"axes": (3, 0, 1, 2)})],
)
def test_more_than_three_axes(func, kw):
    x, dtype = _input("r" if func == "rfftn" else "c", shape=(3, 4, 2, 5, 2))
    got = jax.jit(lambda v: getattr(fft, func)(v, axes=kw.get("axes", (0, 1, 2, 3)), norm=kw.get("norm")))(x)
    assert_close(np.asarray(got), _numpy(func, x, {"axes": kw.get("axes", (0, 1, 2, 3)), "norm": kw.get("norm")}), dtype)


def test_integer_input_is_promoted_to_jax_default_float():
    got = jax.jit(lambda v: fft.rfft(v))(jnp.arange(8))
    assert got.dtype == jnp.fft.rfft(jnp.arange(8)).dtype
    assert_close(np.asarray(got), np.fft.rfft(np.arange(8.0)), "complex64")


# -- gradients ----------------------------------------------------------------------------------------------------
def _directional(func, kw, x, weight_re, weight_im, v, eps=1e-6):
    def loss(t):
        y = _numpy(func, x + t * v, kw)
        return float(np.sum(weight_re * y.real) + np.sum(weight_im * (y.imag if np.iscomplexobj(y) else 0)))

    return (loss(eps) - loss(-eps)) / (2 * eps)


@pytest.mark.parametrize("func, kind, kw", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_gradients_of_every_transform(x64, func, kind, kw):
    x, _ = _input(kind, dtype_single=False, seed=3)
    rng = np.random.default_rng(11)
    shape = _numpy(func, x, kw).shape
    wr, wi = rng.standard_normal(shape), rng.standard_normal(shape)

    def loss(v):
        y = getattr(fft, func)(v, **kw)
        return jnp.sum(wr * jnp.real(y)) + (jnp.sum(wi * jnp.imag(y)) if jnp.iscomplexobj(y) else 0.0)

    g = np.asarray(jax.jit(jax.grad(loss))(x))
    for seed in range(2):
        v = make(x.shape, x.dtype, 20 + seed)
        numeric = _directional(func, kw, x, wr, wi, v)
        analytic = float(np.real(np.sum(g * v)))
        assert abs(numeric - analytic) <= 1e-6 * max(1.0, abs(numeric)), (numeric, analytic)


# -- vmap ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("in_axis", [0, 1, 2, -1])
@pytest.mark.parametrize("func, kw", [("fft", {"axis": 1}), ("rfft", {"axis": 0, "n": 6}), ("irfftn", {"axes": (1, 0)}), ("hfft", {})])
def test_vmap_with_positive_axes(in_axis, func, kw):
    x, dtype = _input("r" if func == "rfft" else "c")
    got = jax.jit(jax.vmap(lambda v: getattr(fft, func)(v, **kw), in_axes=in_axis))(x)
    for i in range(x.shape[in_axis]):
        assert_close(np.asarray(got[i]), _numpy(func, np.take(x, i, axis=in_axis), kw), dtype)


def _weighted_power(transform, kw):
    """A real loss of ``transform(v, **kw)``: its power weighted along the last axis."""

    def loss(v):
        y = transform(v, **kw)
        return jnp.sum(jnp.abs(y) ** 2 * jnp.arange(1.0, 1.0 + y.shape[-1]))

    return loss


def test_vmap_of_every_transform_and_of_its_gradient(x64):
    # every transform of CASES (n/s/axes/norm as given) under jit(vmap) over a batch axis inserted in the middle:
    # values against numpy.fft per example; per-example gradients of a real loss against jax.numpy.fft's (for the
    # cases with arguments, every other one: compiles are slow on CI's two cores)
    for i, (func, kind, kw) in enumerate(CASES):
        xs, dtype = _input(kind, dtype_single=False, shape=(4, 3, 5, 6), seed=i)
        transform = getattr(fft, func)
        got = jax.jit(jax.vmap(functools.partial(transform, **kw), in_axes=1))(xs)
        for j in range(xs.shape[1]):
            assert_close(np.asarray(got[j]), _numpy(func, np.take(xs, j, axis=1), kw), dtype)
        if not kw:
            continue
        grads = jax.jit(jax.vmap(jax.grad(_weighted_power(transform, kw)), in_axes=1, out_axes=1))(xs)
        want = jax.jit(jax.vmap(jax.grad(_weighted_power(getattr(jnp.fft, func), kw)), in_axes=1, out_axes=1))(xs)
        np.testing.assert_allclose(np.asarray(grads), np.asarray(want), rtol=1e-9, atol=1e-9, err_msg=f"{func} {kw}")


@pytest.mark.parametrize("in_axes", [(0, None), (None, 0), (1, 0)])
def test_vmap_of_convolve_over_the_signal_the_filter_or_both(x64, in_axes):
    rng = np.random.default_rng(5)
    x = rng.standard_normal({None: (3, 8), 0: (4, 3, 8), 1: (3, 4, 8)}[in_axes[0]])
    h = rng.standard_normal((4, 5)) + 1j * rng.standard_normal((4, 5)) if in_axes[1] is not None else rng.standard_normal(5)
    got = jax.jit(jax.vmap(fft.convolve, in_axes=in_axes))(x, h)
    for j in range(4):
        xj = x if in_axes[0] is None else np.take(x, j, axis=in_axes[0])
        hj = h if in_axes[1] is None else h[j]
        np.testing.assert_allclose(np.asarray(got[j]), np.fft.irfft(np.fft.rfft(xj) * hj, 8), rtol=1e-10, atol=1e-10)


def test_per_example_gradients(x64):
    x, _ = _input("r", dtype_single=False)
    per = jax.jit(jax.vmap(jax.grad(lambda v: jnp.sum(jnp.abs(fft.rfft(v, axis=0)) ** 2))))(x)
    for i in range(x.shape[0]):
        xi = x[i]
        # sum |rfft|^2 over the half spectrum: d/dx = 2 * irfft-like adjoint; checked numerically
        v = make(xi.shape, "float64", 5)
        eps = 1e-6
        f = lambda t, xi=xi, v=v: float(np.sum(np.abs(np.fft.rfft(xi + t * v, axis=0)) ** 2))
        assert abs((f(eps) - f(-eps)) / (2 * eps) - float(np.sum(np.asarray(per[i]) * v))) < 1e-6 * max(1, abs(f(0)))


# -- convolve, shifts, frequencies -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["r", "c"])
def test_convolve(kind, x64):
    x, _ = _input(kind, dtype_single=False)
    n = 8
    rng = np.random.default_rng(2)
    h = rng.standard_normal(n // 2 + 1 if kind == "r" else n) + 1j * rng.standard_normal(n // 2 + 1 if kind == "r" else n)
    got = jax.jit(lambda v, h: fft.convolve(v, h, n=n))(x, h)
    want = np.fft.irfft(np.fft.rfft(x, n) * h, n) if kind == "r" else np.fft.ifft(np.fft.fft(x, n) * h, n)
    assert_close(np.asarray(got), want, "float64" if kind == "r" else "complex128")
    g = jax.jit(jax.grad(lambda h: jnp.sum(jnp.real(fft.convolve(x, h, n=n)) ** 2)))(h)
    v = rng.standard_normal(h.shape) + 1j * rng.standard_normal(h.shape)

    def loss(t):
        y = np.fft.irfft(np.fft.rfft(x, n) * (h + t * v), n) if kind == "r" else np.fft.ifft(np.fft.fft(x, n) * (h + t * v), n)
        return float(np.sum(np.real(y) ** 2))

    numeric = (loss(1e-6) - loss(-1e-6)) / 2e-6
    assert abs(numeric - float(np.real(np.sum(np.asarray(g) * v)))) <= 1e-6 * max(1.0, abs(numeric))


@pytest.mark.parametrize("axes", [None, 0, (1, -1)])
def test_shifts(axes):
    x, _ = _input("r")
    assert_close(np.asarray(jax.jit(lambda v: fft.fftshift(v, axes=axes))(x)), np.fft.fftshift(x, axes=axes), "float32")
    assert_close(np.asarray(jax.jit(lambda v: fft.ifftshift(v, axes=axes))(x)), np.fft.ifftshift(x, axes=axes), "float32")


def test_frequencies_with_a_traced_spacing():
    got = jax.jit(lambda d: fft.fftfreq(7, d=d))(0.5)
    assert_close(np.asarray(got), np.fft.fftfreq(7, d=0.5), "float32")
    got = jax.jit(lambda d: fft.rfftfreq(8, d=d))(0.25)
    assert_close(np.asarray(got), np.fft.rfftfreq(8, d=0.25), "float32")
    assert fft.fftfreq(4, d=0.5).tolist() == [0.0, 0.5, -1.0, -0.5]  # concrete: unchanged


# -- errors and plans ---------------------------------------------------------------------------------------------------
def test_what_cannot_be_staged_is_refused_at_trace_time_naming_it():
    x = jnp.ones((4, 8), jnp.complex64)
    with pytest.raises(InvalidArgumentError, match="prolog"):
        jax.jit(lambda v: fft.fft(v, prolog=lambda value, index: value))(x)
    with pytest.raises(InvalidArgumentError, match="epilog"):
        jax.jit(lambda v: fft.rfftn(v.real, epilog=lambda value, index: value))(x)
    with pytest.raises(InvalidArgumentError, match="out"):
        jax.jit(lambda v: fft.fft(v, out=v))(x)
    with pytest.raises(InvalidArgumentError, match="stream"):
        jax.jit(lambda v: fft.fft(v, stream=0))(x)
    with pytest.raises(InvalidArgumentError, match="axis"):
        jax.jit(lambda v: fft.fft(v, axis=2))(x)


def test_tracing_the_same_shapes_again_plans_nothing():
    x, _ = _input("c")
    f = lambda v: fft.irfftn(fft.fftn(v), axes=(1, 2))
    jax.jit(f)(x).block_until_ready()
    misses = plan_cache.stats()["misses"]
    jax.clear_caches()
    jax.jit(lambda v: f(v))(x).block_until_ready()
    assert plan_cache.stats()["misses"] == misses
