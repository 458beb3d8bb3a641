"""``nvdispatch.fft.convolve`` for CuPy arrays when the ``"cuda"`` executor declines:
the executor's forward FFT, one multiply by the filter,
its inverse FFT (see :mod:`nvdispatch._fft_convolve`)."""

from __future__ import annotations

from .._fft_convolve import ConvolveProblem, VectorisedConvolvePlan
from . import cupy_fft as base
from .cupy_fft_callbacks import _stream_context as stream_context


def decline(problem: ConvolveProblem) -> str | None:
    return base.decline(problem.forward) or base.decline(problem.inverse)


def strategies(problem: ConvolveProblem) -> tuple[str, ...]:
    return ("fft-multiply-ifft",)


def plan(problem: ConvolveProblem, strategy: str, tuning=None):
    forward = base.plan(problem.forward, base.strategies(problem.forward)[0])
    inverse = base.plan(problem.inverse, base.strategies(problem.inverse)[0])
    return VectorisedConvolvePlan(problem, strategy, forward, inverse, stream_context)
