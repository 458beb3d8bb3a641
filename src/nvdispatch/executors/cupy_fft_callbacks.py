"""FFT with prolog/epilog callbacks for CuPy arrays when the ``"cuda"`` executor declines: the callbacks run
once on whole arrays (vectorised, see :mod:`nvdispatch._fft_callbacks`) around ``cupy.fft``, on CuPy's
current stream or ``stream=``."""

from __future__ import annotations

from .._fft_callbacks import VectorisedCallbackOp
from . import cupy_fft as base
from .cupy import stream_context

_op = VectorisedCallbackOp(base, stream_context)
decline, strategies, plan = _op.decline, _op.strategies, _op.plan
