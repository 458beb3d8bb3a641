"""A multi-layer perceptron whose forward *and* backward GEMMs all run nvdispatch's fused epilogs.

One linear layer on its own fuses only half of its backward: its activation's derivative multiplies the result of
the GEMM that produced the upstream gradient, and that GEMM belongs to the next layer (see
:mod:`.torch_autograd`). A chain of layers owns both, so here every layer's backward is two GEMMs:

* forward, hidden layer ``i``: ``h_i = act(h_{i-1} @ W_i + b_i)`` in one call (``RELU_BIAS``; ``GELU_AUX_BIAS``,
  which keeps the pre-activation for the backward; ``RELU_AUX_BIAS`` with ``relu_backward="drelu"``, which keeps
  the ReLU's bit mask); output layer: ``BIAS``;
* backward, layer ``i`` given ``dz_i`` (the gradient of its pre-activation): ``dW_i, db_i`` from one ``BGRADB`` GEMM
  (``h_{i-1}^T @ dz_i`` and the column sums of ``dz_i``), and ``dz_{i-1} = (dz_i @ W_i^T) * act'(z_{i-1})``: for
  GELU one ``DGELU`` GEMM on the kept pre-activation; for ReLU, since ``h = relu(z)``, ``act'(z)`` is the mask
  ``h > 0`` of the saved output, applied to a plain GEMM's result by one elementwise op (``relu_backward="mask"``,
  the default), or by cuBLASLt's ``DRELU`` epilog on the forward's bit mask (``relu_backward="drelu"``). The mask
  form is the default because cuBLASLt does not fuse DRELU into every GEMM kernel (on the Hopper GPUs we measured
  with bfloat16, it runs the derivative as a separate, slower kernel after the GEMM), while the elementwise mask
  is one cheap, memory-bound pass; ``benchmarks/compiled_mlp_bench.py`` times both. For the first layer, ``dx``
  from a plain GEMM, skipped when the input does not require grad.

The whole chain is one autograd node: its forward runs the layers' fused calls back to back, its backward all the
backward GEMMs (:mod:`.torch_mlp_ops`). Under ``torch.compile`` it is two operators in the graph
(``nvdispatch::mlp_forward`` and ``nvdispatch::mlp_backward``), with exact fake kernels, so ``fullgraph=True``
traces it with no graph break, with static or dynamic shapes, and ``mode="reduce-overhead"`` captures it in the
step's CUDA graph. Each GEMM is a cached call of nvdispatch's compiled front (on the GPU one cuBLASLt launch).
Gradients of the input, weights and biases are those of the same model written with
``torch.nn.functional.linear`` and the activation (GELU is the tanh approximation, as cuBLASLt's).

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

import logging
import math
from collections.abc import Sequence

import torch

from ..errors import InvalidArgumentError, ShapeMismatchError
from . import torch_mlp_ops

__all__ = ["FusedMLP", "fused_mlp"]

log = logging.getLogger("nvdispatch")


def _check_choices(activation: object, relu_backward: object) -> None:
    if not isinstance(activation, str) or activation not in torch_mlp_ops.ACTIVATIONS:
        raise InvalidArgumentError("activation", "'relu' or 'gelu'", repr(activation))
    if not isinstance(relu_backward, str) or relu_backward not in torch_mlp_ops.RELU_BACKWARDS:
        raise InvalidArgumentError("relu_backward", "'mask' or 'drelu'", repr(relu_backward))


def _check_layers(x, weights: Sequence, biases: Sequence) -> None:
    if len(weights) != len(biases) or not weights:
        raise InvalidArgumentError("biases", f"{len(weights)} biases, one per weight (at least one)", str(len(biases)))
    width = x.shape[-1]
    for i, (w, b) in enumerate(zip(weights, biases)):
        if w.dim() != 2 or w.shape[0] != width:
            raise ShapeMismatchError(f"weights[{i}]", f"shape ({width}, out)", f"shape {tuple(w.shape)}")
        if tuple(b.shape) != (w.shape[1],):
            raise ShapeMismatchError(f"biases[{i}]", f"shape ({w.shape[1]},)", f"shape {tuple(b.shape)}")
        width = w.shape[1]


def fused_mlp(x, weights: Sequence, biases: Sequence, activation: str = "relu", *, relu_backward: str = "mask"):
    """``x`` through linear layers ``x @ weights[i] + biases[i]``, ``activation`` after every layer but the last,
    each GEMM of the forward and backward pass one fused nvdispatch call, the whole chain one autograd node (see
    the module notes).

    Parameters
    ----------
    x : torch.Tensor
        ``(..., weights[0].shape[0])``.
    weights, biases : sequences of torch.Tensor
        ``weights[i]`` of shape ``(in_i, out_i)``, ``biases[i]`` of shape ``(out_i,)``.
    activation : {"relu", "gelu"}
        Between layers (GELU: the tanh approximation).
    relu_backward : {"mask", "drelu"}
        How a ReLU model's backward applies the ReLU's derivative: the mask ``h > 0`` of each saved hidden output
        on a plain GEMM's result (default), or cuBLASLt's ``DRELU`` epilog on a bit mask the forward writes
        (``RELU_AUX_BIAS``). Ignored for GELU.

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
    >>> y.sum().backward()
    >>> w[0].grad.shape
    torch.Size([4, 8])
    """
    _check_choices(activation, relu_backward)
    _check_layers(x, weights, biases)
    if x.dim() == 2:
        return torch_mlp_ops.apply(x, weights, biases, activation, relu_backward)
    rows = x.reshape(-1, x.shape[-1])  # the layers' GEMMs are 2-D
    y = torch_mlp_ops.apply(rows, weights, biases, activation, relu_backward)
    return y.reshape(*x.shape[:-1], y.shape[-1])


class FusedMLP(torch.nn.Module):
    """Linear layers of ``widths`` (``widths[0]`` inputs, ``widths[-1]`` outputs), ``activation`` between them;
    forward and backward GEMMs fused by nvdispatch, the whole chain one autograd node (:func:`fused_mlp`, whose
    ``relu_backward`` this takes). Weights are stored ``(in, out)``, both initialised as ``torch.nn.Linear``'s.

    Examples
    --------
    >>> import torch
    >>> from nvdispatch.integrations.torch_mlp import FusedMLP
    >>> mlp = FusedMLP([16, 32, 4], activation="gelu")
    >>> mlp(torch.randn(8, 16)).shape
    torch.Size([8, 4])
    >>> FusedMLP([16, 32, 4], relu_backward="drelu").relu_backward
    'drelu'
    """

    def __init__(
        self,
        widths: Sequence[int],
        activation: str = "relu",
        *,
        relu_backward: str = "mask",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if len(widths) < 2:
            raise InvalidArgumentError("widths", "at least two widths (inputs and outputs)", repr(list(widths)))
        _check_choices(activation, relu_backward)
        self.activation = activation
        self.relu_backward = relu_backward
        kw = {"device": device, "dtype": dtype}
        self.weights = torch.nn.ParameterList()
        self.biases = torch.nn.ParameterList()
        for fan_in, fan_out in zip(widths[:-1], widths[1:]):
            bound = 1 / math.sqrt(fan_in)  # torch.nn.Linear's initialisation
            self.weights.append(torch.nn.Parameter(torch.empty(fan_in, fan_out, **kw).uniform_(-bound, bound)))
            self.biases.append(torch.nn.Parameter(torch.empty(fan_out, **kw).uniform_(-bound, bound)))
        epilog, _ = torch_mlp_ops.hidden_epilog(activation, relu_backward, True)
        log.debug("FusedMLP %s: hidden layers %s, relu_backward=%s", list(widths), epilog, relu_backward)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused_mlp(x, list(self.weights), list(self.biases), self.activation, relu_backward=self.relu_backward)

    def extra_repr(self) -> str:
        widths = [w.shape[0] for w in self.weights] + [self.weights[-1].shape[1]]
        return f"widths={widths}, activation={self.activation!r}, relu_backward={self.relu_backward!r}"
