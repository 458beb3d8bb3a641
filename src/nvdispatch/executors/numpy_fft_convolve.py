"""``nvdispatch.fft.convolve`` for NumPy arrays on the CPU: the executor's forward FFT, one multiply by the filter,
its inverse FFT (see :mod:`nvdispatch._fft_convolve`)."""

from __future__ import annotations

from .._fft_convolve import VectorisedConvolveOp
from . import numpy_fft as base

_op = VectorisedConvolveOp(base)
decline, strategies, plan = _op.decline, _op.strategies, _op.plan
