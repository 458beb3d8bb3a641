"""``nvdispatch.fft.convolve`` for CuPy arrays when the ``"cuda"`` executor declines:
the executor's forward FFT, one multiply by the filter,
its inverse FFT (see :mod:`nvdispatch._fft_convolve`)."""

from __future__ import annotations

from .._fft_convolve import VectorisedConvolveOp
from . import cupy_fft as base
from .cupy import stream_context

_op = VectorisedConvolveOp(base, stream_context)
decline, strategies, plan = _op.decline, _op.strategies, _op.plan
