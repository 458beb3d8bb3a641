"""A multi-layer perceptron whose forward *and* backward GEMMs all run nvdispatch's fused epilogs.

One linear layer on its own fuses only half of its backward: its activation's derivative multiplies the result of
the GEMM that produced the upstream gradient, and that GEMM belongs to the next layer (see
:mod:`.torch_autograd`). A chain of layers owns both, so here every layer's backward is two GEMMs and nothing else:

* forward, hidden layer ``i``: ``h_i, aux_i = act(h_{i-1} @ W_i + b_i)`` in one call (``RELU_AUX_BIAS`` /
  ``GELU_AUX_BIAS``: the ReLU bit mask or the GELU pre-activation kept for the backward); output layer:
  ``BIAS``;
* backward, layer ``i`` given ``dz_i`` (the gradient of its pre-activation): ``dW_i, db_i`` from one ``BGRADB`` GEMM
  (``h_{i-1}^T @ dz_i`` and the column sums of ``dz_i``), and ``dz_{i-1} = (dz_i @ W_i^T) * act'(z_{i-1})`` from one
  ``DRELU``/``DGELU`` GEMM that takes the previous layer's ``aux`` (for the first layer, ``dx`` from a plain GEMM).

Inside the chain a hidden layer's output ``h_i`` carries ``dz_i`` (not ``dL/dh_i``) back to its own backward, which
is what makes the fusion possible: so ``h_i`` never leaves :class:`FusedMLP` (only the output layer's result does,
whose gradient is exact). Gradients of the input, weights and biases are those of the same model written with
``torch.nn.functional.linear`` and the activation (GELU is the tanh approximation, as cuBLASLt's).

Under ``torch.compile`` each layer is an autograd Function whose forward and backward call the ``nvdispatch::``
operators; eagerly they call nvdispatch's route directly (cached plans, one launch per GEMM on the GPU).

Examples
--------
>>> import torch
>>> from nvdispatch.integrations.torch_mlp import FusedMLP
>>> mlp = FusedMLP([8, 16, 16, 4], activation="relu")
>>> x = torch.randn(32, 8, requires_grad=True)
>>> loss = mlp(x).square().mean()
>>> loss.backward()
>>> x.grad.shape, mlp.weights[0].grad.shape, mlp.biases[-1].grad.shape
(torch.Size([32, 8]), torch.Size([8, 16]), torch.Size([4]))
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .. import linalg
from ..errors import InvalidArgumentError

__all__ = ["FusedMLP", "fused_mlp"]

_FORWARD = {"relu": ("RELU_AUX_BIAS", "relu_aux"), "gelu": ("GELU_AUX_BIAS", "gelu_aux")}
_BACKWARD = {"relu": "DRELU", "gelu": "DGELU"}


class _Layer(torch.autograd.Function):
    """One layer of the chain: ``(h, aux) = act(h_prev @ w + b)``, or ``h = h_prev @ w + b`` when ``act`` is None.
    ``prev_aux``/``prev_act``: the previous layer's aux output and activation (None for the first layer)."""

    @staticmethod
    def forward(h_prev, prev_aux, w, b, act, prev_act):
        if act is None:
            return linalg.matmul(h_prev, w, epilog="BIAS", epilog_inputs={"bias": b}), None
        epilog, aux_name = _FORWARD[act]
        h, aux = linalg.matmul(h_prev, w, epilog=epilog, epilog_inputs={"bias": b})
        return h, aux[aux_name]

    @staticmethod
    def setup_context(ctx, inputs, output):
        h_prev, prev_aux, w, b, act, prev_act = inputs
        ctx.prev_act = prev_act
        if output[1] is not None:
            ctx.mark_non_differentiable(output[1])
        ctx.save_for_backward(h_prev, prev_aux, w)

    @staticmethod
    def backward(ctx, dz, _):
        h_prev, prev_aux, w = ctx.saved_tensors
        dw, db = linalg.matmul(h_prev.mT, dz, epilog="BGRADB")
        db = db["bgradb"]
        if not ctx.needs_input_grad[0]:  # the model's input, not requiring grad: no GEMM for it
            dh = None
        elif ctx.prev_act is None:
            dh = linalg.matmul(dz, w.mT)
        else:
            name = _FORWARD[ctx.prev_act][1]
            dh = linalg.matmul(dz, w.mT, epilog=_BACKWARD[ctx.prev_act], epilog_inputs={name: prev_aux})
        return dh, None, dw, db, None, None


def fused_mlp(x, weights: Sequence, biases: Sequence, activation: str = "relu"):
    """``x`` through linear layers ``x @ weights[i] + biases[i]``, ``activation`` after every layer but the last,
    each GEMM of the forward and backward pass one fused nvdispatch call (see the module notes).

    Parameters
    ----------
    x : torch.Tensor
        ``(..., weights[0].shape[0])``.
    weights, biases : sequences of torch.Tensor
        ``weights[i]`` of shape ``(in_i, out_i)``, ``biases[i]`` of shape ``(out_i,)``.
    activation : {"relu", "gelu"}
        Between layers (GELU: the tanh approximation).

    Returns
    -------
    torch.Tensor
        ``(..., weights[-1].shape[1])``.

    Examples
    --------
    >>> import torch
    >>> from nvdispatch.integrations.torch_mlp import fused_mlp
    >>> w = [torch.randn(4, 8, requires_grad=True), torch.randn(8, 2, requires_grad=True)]
    >>> b = [torch.zeros(8, requires_grad=True), torch.zeros(2, requires_grad=True)]
    >>> x = torch.randn(5, 4)
    >>> y = fused_mlp(x, w, b, activation="gelu")
    >>> want = torch.nn.functional.gelu(x @ w[0] + b[0], approximate="tanh") @ w[1] + b[1]
    >>> bool(torch.allclose(y, want, atol=1e-5))
    True
    """
    if activation not in _FORWARD:
        raise InvalidArgumentError("activation", "'relu' or 'gelu'", repr(activation))
    if len(weights) != len(biases) or not weights:
        raise InvalidArgumentError("biases", f"{len(weights)} biases, one per weight (at least one)", str(len(biases)))
    lead = x.shape[:-1]
    h, aux, prev_act = x.reshape(-1, x.shape[-1]), None, None  # rows: the layers' GEMMs are 2-D
    last = len(weights) - 1
    for i, (w, b) in enumerate(zip(weights, biases)):
        act = None if i == last else activation
        h, aux = _Layer.apply(h, aux, w, b, act, prev_act)
        prev_act = act
    return h.reshape(*lead, h.shape[-1])


class FusedMLP(torch.nn.Module):
    """Linear layers of ``widths`` (``widths[0]`` inputs, ``widths[-1]`` outputs), ``activation`` between them;
    forward and backward GEMMs fused by nvdispatch (:func:`fused_mlp`). Weights are stored ``(in, out)``, both
    initialised as ``torch.nn.Linear``'s.

    Examples
    --------
    >>> import torch
    >>> from nvdispatch.integrations.torch_mlp import FusedMLP
    >>> mlp = FusedMLP([16, 32, 4], activation="gelu")
    >>> mlp(torch.randn(8, 16)).shape
    torch.Size([8, 4])
    """

    def __init__(self, widths: Sequence[int], activation: str = "relu", *, device=None, dtype=None) -> None:
        super().__init__()
        if len(widths) < 2:
            raise InvalidArgumentError("widths", "at least two widths (inputs and outputs)", repr(list(widths)))
        if activation not in _FORWARD:
            raise InvalidArgumentError("activation", "'relu' or 'gelu'", repr(activation))
        self.activation = activation
        kw = {"device": device, "dtype": dtype}
        self.weights = torch.nn.ParameterList()
        self.biases = torch.nn.ParameterList()
        for fan_in, fan_out in zip(widths[:-1], widths[1:]):
            bound = 1 / math.sqrt(fan_in)  # torch.nn.Linear's initialisation
            self.weights.append(torch.nn.Parameter(torch.empty(fan_in, fan_out, **kw).uniform_(-bound, bound)))
            self.biases.append(torch.nn.Parameter(torch.empty(fan_out, **kw).uniform_(-bound, bound)))

    def forward(self, x):
        return fused_mlp(x, list(self.weights), list(self.biases), self.activation)
