"""FFT with prolog/epilog callbacks for Torch tensors (CPU, and CUDA when the ``"cuda"`` executor declines):
the callbacks run once on whole tensors (vectorised, see :mod:`nvdispatch._fft_callbacks`) around
``torch.fft``, on the tensor's current stream or ``stream=``. Autograd records the whole sequence."""

from __future__ import annotations

from .._fft_callbacks import CallbackFFTProblem, VectorisedCallbackPlan
from . import torch_fft as base
from .torch import stream_context


def decline(problem: CallbackFFTProblem) -> str | None:
    return base.decline(problem.fft)


def strategies(problem: CallbackFFTProblem) -> tuple[str, ...]:
    return ("vectorised",)


def plan(problem: CallbackFFTProblem, strategy: str, tuning=None):
    inner = base.plan(problem.fft, base.strategies(problem.fft)[0])
    return VectorisedCallbackPlan(problem, strategy, inner, stream_context)
