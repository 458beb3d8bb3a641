"""``nvdispatch.fft.convolve``: the front of the frequency-domain convolution (its problem, plans and
route: :mod:`nvdispatch._fft_convolve`)."""

from __future__ import annotations

from .. import _fft_convolve
from .._traced import traced_handler
from .._typing import Array, Stream

__all__ = ["convolve"]


def convolve(x: Array, h: Array, /, *, n: int | None = None, axis: int = -1, stream: Stream = None) -> Array:
    """Filter signals in the frequency domain: ``ifft(fft(x, n) * h, n)`` along ``axis`` (``irfft(rfft(x, n)
    * h, n)`` for real ``x``), a circular convolution of ``x`` with the filter whose spectrum is ``h``.

    ``h`` broadcasts against the spectrum (``n`` values along ``axis``, ``n//2 + 1`` for real ``x``). On the
    GPU the convolution is one generated kernel for lengths up to 16384 (the multiply between the two FFTs
    happens in registers), three kernels for longer signals (a four-step FFT with the multiply in its middle
    pass), or cuFFT with one multiply kernel or an LTO callback; the first call of a large problem times them
    and keeps the fastest (:mod:`nvdispatch.executors.cuda_fft_convolve`). Elsewhere it is the executor's
    FFT, one multiply and its inverse FFT. ``nvdispatch.explain(nvdispatch.fft.convolve, x, h)`` says which
    runs, and why.

    Examples
    --------
    >>> import numpy as np, nvdispatch
    >>> x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    >>> kernel = np.zeros(16, np.float32); kernel[:3] = 1 / 3          # a 3-tap moving average
    >>> y = nvdispatch.fft.convolve(x, np.fft.rfft(kernel))
    >>> bool(np.allclose(y[:, 2], x[:, :3].mean(axis=1), atol=1e-5))
    True
    """
    handler = traced_handler("fft_convolve", (x, h))  # traced arrays (inside jax.jit...): staged, not run; a
    if handler is not None:  # Torch call autograd records: through the Torch operators
        result = handler(x, h, n=n, axis=axis, stream=stream)
        if result is not NotImplemented:
            return result
    return _fft_convolve.run(x, h, n=n, axis=axis, stream=stream)


convolve.__nvdispatch_explain__ = lambda x, h, /, *, n=None, axis=-1, stream=None: _fft_convolve.explain(
    x, h, n=n, axis=axis, stream=stream
)
