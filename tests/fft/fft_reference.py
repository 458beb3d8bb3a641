"""Shared helpers of the FFT tests: random operands, the numpy.fft complex128 reference, tolerances."""

from __future__ import annotations

import numpy as np

ONE_D = ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft")
N_D = ("fftn", "ifftn", "rfftn", "irfftn")
REAL_IN = ("rfft", "rfftn", "ihfft")
DTYPES = ("float32", "float64", "complex64", "complex128")


def make(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def expected_dtype(func: str, dtype: str) -> np.dtype:
    single = dtype in ("float32", "complex64")
    if func in ("irfft", "irfftn", "hfft"):
        return np.dtype(np.float32 if single else np.float64)
    return np.dtype(np.complex64 if single else np.complex128)


def reference(func: str, x: np.ndarray, **kw) -> np.ndarray:
    """numpy.fft in double precision."""
    if func in REAL_IN:
        x = x.astype(np.float64)
    else:
        x = x.astype(np.complex128)
    return getattr(np.fft, func)(x, **kw)


def assert_close(got, ref, dtype: str):
    got = np.asarray(got)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    tol = 3e-5 if dtype in ("float32", "complex64") else 1e-11
    scale = max(1.0, float(np.max(np.abs(ref)))) if ref.size else 1.0
    err = float(np.max(np.abs(got.astype(ref.dtype) - ref))) if ref.size else 0.0
    assert err <= tol * scale, f"max error {err} > {tol} * {scale}"


def to_numpy(y):
    mod = type(y).__module__.split(".")[0]
    if mod == "torch":
        return y.detach().cpu().resolve_conj().numpy()
    if mod == "cupy":
        return y.get()
    return np.asarray(y)
