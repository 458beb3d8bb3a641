"""FFT with prolog/epilog callbacks on the CPU for NumPy arrays: the callbacks are called once on whole
arrays (vectorised, see :mod:`nvdispatch._fft_callbacks`) around the NumPy executor's own FFT plan."""

from __future__ import annotations

from .._fft_callbacks import CallbackFFTProblem, VectorisedCallbackPlan
from . import numpy_fft as base


def decline(problem: CallbackFFTProblem) -> str | None:
    return base.decline(problem.fft)


def strategies(problem: CallbackFFTProblem) -> tuple[str, ...]:
    return ("vectorised",)


def plan(problem: CallbackFFTProblem, strategy: str, tuning=None):
    inner = base.plan(problem.fft, base.strategies(problem.fft)[0])
    return VectorisedCallbackPlan(problem, strategy, inner)
