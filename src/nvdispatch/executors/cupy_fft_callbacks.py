"""FFT with prolog/epilog callbacks for CuPy arrays when the ``"cuda"`` executor declines: the callbacks run
once on whole arrays (vectorised, see :mod:`nvdispatch._fft_callbacks`) around ``cupy.fft``, on CuPy's
current stream or ``stream=``."""

from __future__ import annotations

import contextlib

from .._fft_callbacks import CallbackFFTProblem, VectorisedCallbackPlan
from . import cupy_fft as base


def decline(problem: CallbackFFTProblem) -> str | None:
    return base.decline(problem.fft)


def strategies(problem: CallbackFFTProblem) -> tuple[str, ...]:
    return ("vectorised",)


def _stream_context(stream, device):
    return contextlib.nullcontext() if stream is None else base._cupy_stream(stream)


def plan(problem: CallbackFFTProblem, strategy: str, tuning=None):
    inner = base.plan(problem.fft, base.strategies(problem.fft)[0])
    return VectorisedCallbackPlan(problem, strategy, inner, _stream_context)
