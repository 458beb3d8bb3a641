"""Small kernels around a frequency-domain filter: multiply a batch of spectra by it, or lay it out for the
four-step convolution (:mod:`nvdispatch.device.fft_four_step`).

``multiply_by_filter(y, h, per_row, scale, real_n)``
    ``y[r, k] *= h[r or 0, k] * scale`` in place, ``y`` a ``(rows, m)`` complex array, ``h`` ``(1, m)`` (one
    row for all) or ``(rows, m)``, real or complex. One read and one write of ``y``. For the half-spectra of
    real signals of length ``real_n`` the products at ``k = 0`` and ``k = real_n / 2`` keep their real parts
    (what ``irfft`` reads there).
``permute_filter(h, hp, n1, hermitian, scale)``
    ``hp[k1, k2] = H[k1 + n1 * k2] * scale`` (the convolution's ``1/n`` folded into the filter): the filter in
    the order the four-step transform leaves the spectrum (frequency ``k1 + n1 * k2`` at row ``k1``, column
    ``k2`` of an ``(n1, n2)`` array). ``H`` is ``h`` itself
    (``n`` values), or with ``hermitian`` the Hermitian completion of a real signal's half-spectrum filter
    (``n // 2 + 1`` values): ``H[k] = h[k]`` for ``k <= n // 2``, ``conj(h[n - k])`` above, and the real part
    of ``h`` at ``k = 0`` and ``k = n / 2``, whose imaginary parts ``irfft`` ignores. Convolving a complex
    signal ``x1 + i x2`` of two real rows with that ``H`` gives ``irfft(rfft(x1) * h) + i irfft(rfft(x2) * h)``.

Both launch ``launch_*`` helpers below on a Numba stream; under Numba's CUDA simulator they run on NumPy
arrays.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .kernel_steps import ArrayArg, KernelStep, launch_with_numba

__all__ = [
    "multiply_by_filter",
    "permute_complex_filter",
    "permute_real_filter",
    "permute_kernel",
    "multiply_step",
    "launch_multiply",
    "permute_step",
    "launch_permute",
]

_THREADS = 256
_MAX_GRID_Y = 65535


@cuda.jit
def multiply_by_filter(y, h, per_row, scale, real_n):
    c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if c < y.shape[1]:
        # a real signal's spectrum (real_n > 0): the product's DC and Nyquist bins keep their real parts only,
        # as irfft reads them; cuFFT's C2R does not ignore imaginary parts there
        real_only = real_n > 0 and (c == 0 or 2 * c == real_n)
        for r in range(cuda.blockIdx.y, y.shape[0], cuda.gridDim.y):
            hr = r if per_row else 0
            v = y[r, c] * h[hr, c] * scale
            if real_only:
                y[r, c] = v.real
            else:
                y[r, c] = v


@cuda.jit
def permute_complex_filter(h, hp, n1, hermitian, scale):
    q = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    n2 = hp.shape[1]
    if q < hp.shape[0] * n2:
        k1 = q // n2
        k2 = q - k1 * n2
        k = k1 + n1 * k2
        n = hp.shape[0] * n2
        if not hermitian:
            hp[k1, k2] = h[k] * scale
        elif 2 * k > n:
            hp[k1, k2] = h[n - k].conjugate() * scale
        elif k == 0 or 2 * k == n:
            hp[k1, k2] = h[k].real * scale
        else:
            hp[k1, k2] = h[k] * scale


@cuda.jit
def permute_real_filter(h, hp, n1, hermitian, scale):
    q = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    n2 = hp.shape[1]
    if q < hp.shape[0] * n2:
        k1 = q // n2
        k2 = q - k1 * n2
        k = k1 + n1 * k2
        n = hp.shape[0] * n2
        if hermitian and 2 * k > n:
            hp[k1, k2] = h[n - k] * scale
        else:
            hp[k1, k2] = h[k] * scale


def multiply_step(y: ArrayArg, h: ArrayArg, per_row: bool, scale, real_n: int = 0) -> KernelStep:
    """The launch of ``y *= h * scale`` (see the module docstring) on a non-empty ``y``; ``scale`` a NumPy scalar
    of ``y``'s real precision; ``real_n`` the length of the real signals ``y`` is the half-spectrum of (0: complex
    signals)."""
    rows, m = y.shape
    grid = (-(-m // _THREADS), min(rows, _MAX_GRID_Y))
    args = (y, h, np.int64(per_row), scale, np.int64(real_n))
    return KernelStep(multiply_by_filter, grid, (_THREADS,), 0, args)


def launch_multiply(y, h, per_row: bool, scale, stream=0, real_n: int = 0) -> None:
    """``y *= h * scale`` (see :func:`multiply_step`) on Numba stream ``stream``."""
    rows, m = y.shape
    if rows == 0 or m == 0:
        return
    y_arg = ArrayArg(0, tuple(y.shape), np.dtype(y.dtype))
    h_arg = ArrayArg(1, tuple(h.shape), np.dtype(h.dtype))
    launch_with_numba((multiply_step(y_arg, h_arg, per_row, scale, real_n),), (y, h), stream)


def permute_kernel(h_dtype) -> object:
    """The permutation kernel for a filter of ``h_dtype`` (complex or real)."""
    return permute_complex_filter if np.dtype(h_dtype).kind == "c" else permute_real_filter


def permute_step(h: ArrayArg, hp: ArrayArg, hermitian: bool, scale) -> KernelStep:
    """The launch filling ``hp`` (``(n1, n2)``) from the 1-D filter ``h`` times ``scale`` (a NumPy scalar of
    ``hp``'s real precision)."""
    n1, n2 = hp.shape
    grid = (-(-(n1 * n2) // _THREADS),)
    args = (h, hp, np.int64(n1), np.int64(hermitian), scale)
    return KernelStep(permute_kernel(h.dtype), grid, (_THREADS,), 0, args)


def launch_permute(h, hp, hermitian: bool, stream=0, scale=None) -> None:
    """Fill ``hp`` (``(n1, n2)``) from the 1-D filter ``h`` times ``scale`` (see the module docstring; a NumPy
    scalar of ``hp``'s real precision, 1 by default)."""
    if scale is None:
        scale = np.dtype(hp.dtype).type(0).real.dtype.type(1)
    h_arg = ArrayArg(0, tuple(h.shape), np.dtype(h.dtype))
    hp_arg = ArrayArg(1, tuple(hp.shape), np.dtype(hp.dtype))
    launch_with_numba((permute_step(h_arg, hp_arg, hermitian, scale),), (h, hp), stream)
