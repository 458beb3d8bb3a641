"""Genuinely complex operands inside ``jax.jit``, under ``jax.grad`` and ``jax.vmap``: every ``nvdispatch.fft``
transform in the three norms of conjugated, transposed and strided signals made inside the traced function, and
complex products of conjugated operands. Values against ``numpy.fft`` and NumPy products in complex128; gradients
against ``jax.grad`` of ``jax.numpy`` (JAX's convention for complex inputs), an implementation of its own."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nvdispatch

NORMS = ("backward", "ortho", "forward")
REAL_INPUT = ("rfft", "rfftn", "ihfft", "rfft2")
TRANSFORMS = ("fft", "ifft", "fftn", "ifftn", "irfft", "irfftn", "hfft", "fft2", "ifft2", "irfft2", *REAL_INPUT)


def _complex(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)


def _signals(xp, z):
    """Signals made from ``z`` with ``xp``'s operations: conjugated, conjugated and transposed, strided, negated."""
    zc = xp.conj(z)
    return [zc, zc.T, z[::2, 1::2], -zc[:, 1:]]


def every_transform(xp_fft, xp, z):
    """Each transform of each signal (real-input transforms: its imaginary part), the norm changing from signal to
    signal: each transform meets the three."""
    return [
        getattr(xp_fft, func)(xp.imag(s) if func in REAL_INPUT else s, norm=NORMS[(i + j) % 3])
        for i, s in enumerate(_signals(xp, z))
        for j, func in enumerate(TRANSFORMS)
    ]


def _loss(xp_fft):
    def loss(z):
        terms = every_transform(xp_fft, jnp, z)
        weights = [jnp.arange(t.size, dtype=jnp.float64 if t.real.dtype == jnp.float64 else jnp.float32) for t in terms]
        return sum(
            jnp.sum(w.reshape(t.shape) * (jnp.abs(t) ** 2 + jnp.real(t) - jnp.imag(t))) for w, t in zip(weights, terms)
        )

    return loss


def _close(got, want, tol, what):
    got = np.asarray(got)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()), err_msg=what)


def _names():
    return [f"signal{i}-{f}-{NORMS[(i + j) % 3]}" for i in range(4) for j, f in enumerate(TRANSFORMS)]


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_every_transform_of_complex_views_in_every_norm_inside_jit_and_vmap(dtype, x64):
    z = _complex((6, 8), dtype)
    want = every_transform(np.fft, np, z.astype(np.complex128))
    tol = 1e-12 if dtype == "complex128" else 2e-5
    got = jax.jit(lambda z: every_transform(nvdispatch.fft, jnp, z))(jnp.asarray(z))
    for name, g, w in zip(_names(), got, want):
        assert np.iscomplexobj(np.asarray(g)) == np.iscomplexobj(w), name
        _close(g, w, tol, name)
    stacked = jax.jit(jax.vmap(lambda z: every_transform(nvdispatch.fft, jnp, z)))(
        jnp.stack([jnp.asarray(z), 2j * jnp.asarray(z)])
    )
    twice = every_transform(np.fft, np, 2j * z.astype(np.complex128))
    for name, g, w, w2 in zip(_names(), stacked, want, twice):
        _close(g[0], w, tol, f"vmap {name} [0]")
        _close(g[1], w2, tol, f"vmap {name} [1]")


def test_gradients_of_every_transform_of_complex_views_against_jax_numpy(x64):
    z = jnp.asarray(_complex((6, 8), "complex128", seed=1))
    tol = 1e-10
    reference = jax.jit(jax.grad(_loss(jnp.fft)))
    want = np.asarray(reference(z))
    _close(jax.jit(jax.grad(_loss(nvdispatch.fft)))(z), want, tol, "jit(grad)")
    per_row = jax.jit(jax.vmap(jax.grad(_loss(nvdispatch.fft))))(jnp.stack([z, z.conj()]))
    _close(per_row[0], want, tol, "vmap(grad) [0]")
    _close(per_row[1], np.asarray(reference(z.conj())), tol, "vmap(grad) [1]")


def _products(mm, xp, a, b, c):
    ac = xp.conj(a)
    return [mm(ac, b), mm(a, xp.conj(b)), mm(xp.conj(ac.T).T, -b), mm(ac[:, ::2], b[::2])] + (
        [nvdispatch.matmul(ac, b, xp.conj(c), alpha=1 - 2j, beta=0.5j)] if mm is nvdispatch.matmul else
        [(1 - 2j) * (ac @ b) + 0.5j * xp.conj(c)]
    )  # fmt: skip


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_complex_products_of_conjugates_inside_jit_vmap_and_grad(dtype, x64):
    a, b, c = _complex((5, 4), dtype), _complex((4, 6), dtype, seed=1), _complex((5, 6), dtype, seed=2)
    tol = 1e-12 if dtype == "complex128" else 2e-5
    want = _products(np.matmul, np, *(x.astype(np.complex128) for x in (a, b, c)))
    got = jax.jit(lambda a, b, c: _products(nvdispatch.matmul, jnp, a, b, c))(a, b, c)
    for k, (g, w) in enumerate(zip(got, want)):
        assert np.asarray(g).dtype == np.dtype(dtype), k
        _close(g, w, tol, f"product {k}")
    stacked = jax.vmap(lambda a: _products(nvdispatch.matmul, jnp, a, b, c))(jnp.stack([a, 1j * a]))
    for k, (g, w) in enumerate(zip(stacked, _products(np.matmul, np, 1j * a.astype(np.complex128), b, c))):
        _close(g[1], w, tol, f"vmap product {k}")

    def loss(mm, xp):
        return lambda a, b, c: sum(jnp.sum(jnp.abs(t) ** 2 + jnp.imag(t)) for t in _products(mm, xp, a, b, c))

    got = jax.jit(jax.grad(loss(nvdispatch.matmul, jnp), argnums=(0, 1, 2)))(a, b, c)
    want = jax.jit(jax.grad(loss(jnp.matmul, jnp), argnums=(0, 1, 2)))(a, b, c)
    for name, g, w in zip("abc", got, want):
        _close(g, np.asarray(w), tol * 10, f"d{name}")
