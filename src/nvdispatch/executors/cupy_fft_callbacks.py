"""FFT with prolog/epilog callbacks for CuPy arrays when the ``"cuda"`` executor declines: the callbacks run
once on whole arrays (vectorised, see :mod:`nvdispatch._fft_callbacks`) around ``cupy.fft``, on CuPy's
current stream or ``stream=``."""

from __future__ import annotations

import contextlib

from .._fft_callbacks import VectorisedCallbackOp
from . import cupy_fft as base


def _stream_context(stream, device):
    return contextlib.nullcontext() if stream is None else base._cupy_stream(stream)


_op = VectorisedCallbackOp(base, _stream_context)
decline, strategies, plan = _op.decline, _op.strategies, _op.plan
