"""FFT with prolog/epilog callbacks for Torch tensors (CPU, and CUDA when the ``"cuda"`` executor declines):
the callbacks run once on whole tensors (vectorised, see :mod:`nvdispatch._fft_callbacks`) around
``torch.fft``, on the tensor's current stream or ``stream=``. Autograd records the whole sequence."""

from __future__ import annotations

from .._fft_callbacks import VectorisedCallbackOp
from . import torch_fft as base
from .torch import stream_context

_op = VectorisedCallbackOp(base, stream_context)
decline, strategies, plan = _op.decline, _op.strategies, _op.plan
