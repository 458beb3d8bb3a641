"""FFT with prolog/epilog callbacks on the CPU for NumPy arrays: the callbacks are called once on whole
arrays (vectorised, see :mod:`nvdispatch._fft_callbacks`) around the NumPy executor's own FFT plan."""

from __future__ import annotations

from .._fft_callbacks import VectorisedCallbackOp
from . import numpy_fft as base

_op = VectorisedCallbackOp(base)
decline, strategies, plan = _op.decline, _op.strategies, _op.plan
