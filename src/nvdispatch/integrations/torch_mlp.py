"""A multi-layer perceptron whose forward *and* backward GEMMs all run nvdispatch's fused epilogs.

One linear layer on its own fuses only half of its backward: its activation's derivative multiplies the result of
the GEMM that produced the upstream gradient, and that GEMM belongs to the next layer (see
:mod:`.torch_autograd`). A chain of layers owns both, so here every layer's backward is two GEMMs:

Weights are stored as ``torch.nn.Linear`` stores them, ``W_i`` of shape ``(out, in)`` (``weight_layout="out_in"``;
:func:`fused_mlp` also takes ``(in, out)`` weights, ``"in_out"``), and the GEMMs are Linear's:

* forward, hidden layer ``i``: ``h_i = act(h_{i-1} @ W_i^T + b_i)`` in one call, ``W_i^T`` a transposed view read
  by the GEMM as such (``RELU_BIAS``; ``GELU_AUX_BIAS``,
  which keeps the pre-activation for the backward; ``RELU_AUX_BIAS`` with ``relu_backward="drelu"``, which keeps
  the ReLU's bit mask); output layer: ``BIAS``;
* backward, layer ``i`` given ``dz_i`` (the gradient of its pre-activation): ``dW_i, db_i`` from one ``BGRADA`` GEMM
  (``dz_i^T @ h_{i-1}``, of the weight's own shape ``(out, in)``, and the sums of ``dz_i^T`` along K, the column
  sums of ``dz_i``; with ``(in, out)`` weights ``h_{i-1}^T @ dz_i`` and ``BGRADB``), and
  ``dz_{i-1} = (dz_i @ W_i) * act'(z_{i-1})``: for
  GELU one ``DGELU`` GEMM on the kept pre-activation; for ReLU, since ``h = relu(z)``, ``act'(z)`` is the mask
  ``h > 0`` of the saved output, applied to a plain GEMM's result by one elementwise op (``relu_backward="mask"``,
  the default), or by cuBLASLt's ``DRELU`` epilog on the forward's bit mask (``relu_backward="drelu"``). The mask
  form is the default because cuBLASLt does not fuse DRELU into every GEMM kernel (on the Hopper GPUs we measured
  with bfloat16, it runs the derivative as a separate, slower kernel after the GEMM), while the elementwise mask
  is one cheap, memory-bound pass; ``benchmarks/compiled_mlp_bench.py`` times both. For the first layer, ``dx``
  from a plain GEMM, skipped when the input does not require grad.
* on CUDA with bfloat16, the derivative and the bias gradient may instead come from one memory pass of our own
  (:mod:`.torch_activation_grad`, a Numba kernel): ``act'`` applied to a plain GEMM's result (the mask ``h > 0``,
  or with ``relu_backward="drelu"`` the forward's bit mask, or GELU's derivative from the kept pre-activation) and
  the column sums of the outcome, which are ``db_{i-1}``; the weight-gradient GEMM is then plain (cuBLASLt runs
  ``BGRADA``/``BGRADB`` as a separate reduction over ``dz``, and its ``DGELU`` kernels can be slower than a plain
  GEMM). A third form is cuBLASLt's ``DGELU_BGRAD``/``DRELU_BGRAD`` where an aux was kept. Which form a layer
  runs is timed once per problem on the first backward (not while a CUDA graph is being captured) and kept for
  the process.

The whole chain is one autograd node: its forward runs the layers' fused calls back to back, its backward all the
backward GEMMs (:mod:`.torch_mlp_ops`). Under ``torch.compile`` it is two operators in the graph
(``nvdispatch::mlp_forward_kernel`` and ``nvdispatch::mlp_backward_kernel``, below ``nvdispatch::mlp_forward``'s
autograd), with exact fake kernels, so ``fullgraph=True``
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
(torch.Size([32, 8]), torch.Size([16, 8]), torch.Size([4]))
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import torch

from ..errors import InvalidArgumentError, ShapeMismatchError
from . import torch_mlp_ops, torch_mlp_state
from .mlp_epilogs import check_activation

__all__ = ["FusedMLP", "fused_mlp"]

log = logging.getLogger("nvdispatch")


def _check_layout(weight_layout: object) -> None:
    if not isinstance(weight_layout, str) or weight_layout not in torch_mlp_ops.WEIGHT_LAYOUTS:
        raise InvalidArgumentError("weight_layout", "'out_in' or 'in_out'", repr(weight_layout))


def _check_choices(activation: object, relu_backward: object) -> None:
    check_activation(activation, relu_backward)


def _check_layers(x, weights: Sequence, biases: Sequence, weight_layout: str) -> None:
    if len(weights) != len(biases) or not weights:
        raise InvalidArgumentError("biases", f"{len(weights)} biases, one per weight (at least one)", str(len(biases)))
    width = x.shape[-1]
    out_in = weight_layout == "out_in"
    for i, (w, b) in enumerate(zip(weights, biases)):
        if w.dim() != 2 or w.shape[1 if out_in else 0] != width:
            expected = f"shape (out, {width}) (weight_layout='out_in')" if out_in else \
                f"shape ({width}, out) (weight_layout='in_out')"  # fmt: skip
            raise ShapeMismatchError(f"weights[{i}]", expected, f"shape {tuple(w.shape)}")
        out = torch_mlp_ops.out_features(w, weight_layout)
        if tuple(b.shape) != (out,):
            raise ShapeMismatchError(f"biases[{i}]", f"shape ({out},)", f"shape {tuple(b.shape)}")
        width = out


def fused_mlp(
    x,
    weights: Sequence,
    biases: Sequence,
    activation: str = "relu",
    *,
    relu_backward: str = "mask",
    weight_layout: str = "out_in",
):
    """``x`` through linear layers ``x @ weights[i]^T + biases[i]`` (as ``torch.nn.functional.linear``),
    ``activation`` after every layer but the last, each GEMM of the forward and backward pass one fused nvdispatch
    call, the whole chain one autograd node (see the module notes).

    Parameters
    ----------
    x : torch.Tensor
        ``(..., in_0)``.
    weights, biases : sequences of torch.Tensor
        ``weights[i]`` of shape ``(out_i, in_i)`` (``torch.nn.Linear``'s weight; see ``weight_layout``),
        ``biases[i]`` of shape ``(out_i,)``.
    activation : {"relu", "gelu"}
        Between layers (GELU: the tanh approximation).
    relu_backward : {"mask", "drelu"}
        How a ReLU model's backward applies the ReLU's derivative: the mask ``h > 0`` of each saved hidden output
        on a plain GEMM's result (default), or cuBLASLt's ``DRELU`` epilog on a bit mask the forward writes
        (``RELU_AUX_BIAS``). Ignored for GELU.
    weight_layout : {"out_in", "in_out"}
        How ``weights[i]`` is stored: ``(out_i, in_i)`` as ``torch.nn.Linear`` (default; each layer ``h @ W^T``,
        the weight gradients ``dz^T @ h`` in the same layout), or ``(in_i, out_i)`` (each layer ``h @ W``).

    Returns
    -------
    torch.Tensor
        ``(..., out_L)``, ``out_L`` the last layer's output width.

    Examples
    --------
    >>> import torch
    >>> from nvdispatch.integrations.torch_mlp import fused_mlp
    >>> import torch.nn.functional as F
    >>> from nvdispatch.integrations.torch_mlp import fused_mlp
    >>> w = [torch.randn(8, 4, requires_grad=True), torch.randn(2, 8, requires_grad=True)]
    >>> b = [torch.zeros(8, requires_grad=True), torch.zeros(2, requires_grad=True)]
    >>> x = torch.randn(5, 4)
    >>> y = fused_mlp(x, w, b, activation="gelu")
    >>> want = F.linear(F.gelu(F.linear(x, w[0], b[0]), approximate="tanh"), w[1], b[1])
    >>> bool(torch.allclose(y, want, atol=1e-5))
    True
    >>> y.sum().backward()
    >>> w[0].grad.shape
    torch.Size([8, 4])

    Weights stored ``(in, out)``:

    >>> w_in_out = [w[0].detach().T, w[1].detach().T]
    >>> bool(torch.allclose(fused_mlp(x, w_in_out, b, activation="gelu", weight_layout="in_out"), want, atol=1e-5))
    True
    """
    _check_choices(activation, relu_backward)
    _check_layout(weight_layout)
    _check_layers(x, weights, biases, weight_layout)
    if x.dim() == 2:
        return torch_mlp_ops.apply(x, weights, biases, activation, relu_backward, weight_layout)
    rows = x.reshape(-1, x.shape[-1])  # the layers' GEMMs are 2-D
    y = torch_mlp_ops.apply(rows, weights, biases, activation, relu_backward, weight_layout)
    return y.reshape(*x.shape[:-1], y.shape[-1])


class FusedMLP(torch.nn.Module):
    """Linear layers of ``widths`` (``widths[0]`` inputs, ``widths[-1]`` outputs), ``activation`` between them;
    forward and backward GEMMs fused by nvdispatch, the whole chain one autograd node (:func:`fused_mlp`, whose
    ``relu_backward`` this takes). ``weights[i]`` and ``biases[i]`` are stored and initialised as
    ``torch.nn.Linear``'s ``weight`` (shape ``(out, in)``) and ``bias``, so a Linear layer's tensors copy in as
    they are, and their gradients land in ``.grad`` in that layout (the weight-gradient GEMM writes ``(out, in)``).

    Examples
    --------
    >>> import torch
    >>> from nvdispatch.integrations.torch_mlp import FusedMLP
    >>> mlp = FusedMLP([16, 32, 4], activation="gelu")
    >>> mlp(torch.randn(8, 16)).shape
    torch.Size([8, 4])
    >>> FusedMLP([16, 32, 4], relu_backward="drelu").relu_backward
    'drelu'

    The weights of ``torch.nn.Linear`` layers, as they are:

    >>> linears = [torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)]
    >>> mlp = FusedMLP([16, 32, 4])
    >>> with torch.no_grad():
    ...     for lin, w, b in zip(linears, mlp.weights, mlp.biases):
    ...         _ = w.copy_(lin.weight), b.copy_(lin.bias)
    >>> x = torch.randn(8, 16)
    >>> bool(torch.allclose(mlp(x), linears[1](torch.relu(linears[0](x))), atol=1e-5))
    True

    Checkpoints: ``load_state_dict`` takes this model's own state dict (keys ``weights.0``, ``biases.0``, ...)
    and that of the ``torch.nn.Sequential`` it replaces (``Linear, act, ..., Linear``: keys ``0.weight``,
    ``0.bias``, ``2.weight``, ...), here or inside a larger model, with Torch's ``strict`` checks (a strict
    load of a Sequential checkpoint names what is missing or unexpected by that checkpoint's keys);
    :meth:`to_sequential` gives the plain model, whose ``state_dict()`` loads without nvdispatch.

    >>> seq = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    >>> list(seq.state_dict())
    ['0.weight', '0.bias', '2.weight', '2.bias']
    >>> mlp = FusedMLP([16, 32, 4])
    >>> mlp.load_state_dict(seq.state_dict())
    <All keys matched successfully>
    >>> bool(torch.allclose(mlp(x), seq(x), atol=1e-5))
    True
    >>> list(mlp.state_dict())
    ['weights.0', 'weights.1', 'biases.0', 'biases.1']
    >>> list(mlp.to_sequential().state_dict())
    ['0.weight', '0.bias', '2.weight', '2.bias']
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
            self.weights.append(torch.nn.Parameter(torch.empty(fan_out, fan_in, **kw).uniform_(-bound, bound)))
            self.biases.append(torch.nn.Parameter(torch.empty(fan_out, **kw).uniform_(-bound, bound)))
        self.register_load_state_dict_pre_hook(torch_mlp_state.accept_sequential_keys)
        self.register_load_state_dict_post_hook(torch_mlp_state.report_sequential_keys)
        epilog, _ = torch_mlp_ops.hidden_epilog(activation, relu_backward, True)
        log.debug(
            "FusedMLP %s: hidden layers %s, relu_backward=%s, weights (out, in)", list(widths), epilog, relu_backward
        )

    @classmethod
    def from_sequential(cls, layers, *, relu_backward: str = "mask") -> FusedMLP:
        """The ``FusedMLP`` of an existing Torch model: ``layers`` (a ``torch.nn.Sequential``, or any iterable of
        modules) ``Linear, act, Linear, act, ..., Linear``, the same activation between every two Linear layers
        (``torch.nn.ReLU``, or ``torch.nn.GELU(approximate="tanh")``) and every Linear with a bias. The new model
        holds the Linear layers' own parameters (not copies): the same tensors, so an optimizer made over the old
        model's parameters trains the new one, and the gradients land where they did.

        Raises
        ------
        InvalidArgumentError
            Naming ``layers[i]`` when a module is not what its place needs (or a Linear has no bias, or a GELU is
            not the tanh approximation, which cuBLASLt's epilogs compute).
        ShapeMismatchError
            When a Linear's inputs differ from the previous one's outputs.

        Examples
        --------
        >>> import torch
        >>> from nvdispatch.integrations.torch_mlp import FusedMLP
        >>> seq = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        >>> mlp = FusedMLP.from_sequential(seq)
        >>> mlp.extra_repr()
        "widths=[16, 32, 4], activation='relu', relu_backward='mask'"
        >>> mlp.weights[0] is seq[0].weight
        True
        >>> x = torch.randn(8, 16)
        >>> bool(torch.allclose(mlp(x), seq(x), atol=1e-5))
        True
        """
        modules = list(layers)
        if len(modules) % 2 == 0 or not modules:
            raise InvalidArgumentError(
                "layers", "Linear, act, ..., Linear: an odd number of modules", f"{len(modules)} modules"
            )
        linears = modules[::2]
        activation = None
        for i, module in enumerate(modules):
            where = f"layers[{i}]"
            if i % 2 == 0:
                if not isinstance(module, torch.nn.Linear):
                    raise InvalidArgumentError(where, "a torch.nn.Linear", type(module).__name__)
                if module.bias is None:
                    raise InvalidArgumentError(where, "a Linear with a bias", "a Linear without one (bias=False)")
                if i and module.in_features != modules[i - 2].out_features:
                    raise ShapeMismatchError(
                        where, f"{modules[i - 2].out_features} in_features", f"{module.in_features}"
                    )
                continue
            found = _activation_of(module)
            if found is None:
                raise InvalidArgumentError(
                    where, "torch.nn.ReLU or torch.nn.GELU(approximate='tanh')", _describe_module(module)
                )
            if activation is not None and found != activation:
                raise InvalidArgumentError(where, f"the same activation as layers[1] ({activation})", found)
            activation = found
        widths = [linears[0].in_features] + [lin.out_features for lin in linears]
        model = cls(widths, activation or "relu", relu_backward=relu_backward, device="meta")  # no storage made
        model.weights = torch.nn.ParameterList([lin.weight for lin in linears])
        model.biases = torch.nn.ParameterList([lin.bias for lin in linears])
        return model

    def to_sequential(self) -> torch.nn.Sequential:
        """The plain Torch model this one computes: ``torch.nn.Sequential(Linear, act, Linear, ..., Linear)``
        over this model's own parameters (the same tensors, not copies; the inverse of :meth:`from_sequential`),
        ``act`` ``torch.nn.ReLU()`` or ``torch.nn.GELU(approximate="tanh")``, in this model's training mode.

        Its ``state_dict()`` is a plain checkpoint (keys ``0.weight``, ``0.bias``, ``2.weight``, ...) that loads
        into a model built without nvdispatch, and its ``parameters()`` come in that model's order (layer by
        layer, weight then bias), which is the order an optimizer's checkpoint must match: an optimizer of this
        model whose state is saved for, or loaded from, the plain model is made over
        ``mlp.to_sequential().parameters()`` (``mlp.parameters()`` lists every weight, then every bias).

        Examples
        --------
        >>> import io
        >>> import torch
        >>> from nvdispatch.integrations.torch_mlp import FusedMLP
        >>> mlp = FusedMLP([16, 32, 4], activation="gelu")
        >>> seq = mlp.to_sequential()
        >>> seq
        Sequential(
          (0): Linear(in_features=16, out_features=32, bias=True)
          (1): GELU(approximate='tanh')
          (2): Linear(in_features=32, out_features=4, bias=True)
        )
        >>> seq[0].weight is mlp.weights[0]
        True
        >>> buffer = io.BytesIO()
        >>> torch.save(seq.state_dict(), buffer)
        >>> _ = buffer.seek(0)
        >>> plain = torch.nn.Sequential(
        ...     torch.nn.Linear(16, 32), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(32, 4))
        >>> plain.load_state_dict(torch.load(buffer))
        <All keys matched successfully>
        >>> x = torch.randn(8, 16)
        >>> bool(torch.allclose(plain(x), mlp(x), atol=1e-5))
        True
        """
        return torch_mlp_state.sequential_of(_listed(self.weights), _listed(self.biases), self.activation,
                                             self.training)  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused_mlp(x, _listed(self.weights), _listed(self.biases), self.activation,
                         relu_backward=self.relu_backward)  # fmt: skip

    def extra_repr(self) -> str:
        widths = [w.shape[1] for w in self.weights] + [self.weights[-1].shape[0]]
        return f"widths={widths}, activation={self.activation!r}, relu_backward={self.relu_backward!r}"


def _activation_of(module) -> str | None:
    """``"relu"``/``"gelu"`` for the activation modules FusedMLP computes, else None."""
    if type(module) is torch.nn.ReLU:  # in place or not: the same function of the Linear's output
        return "relu"
    if type(module) is torch.nn.GELU and module.approximate == "tanh":
        return "gelu"
    return None


def _describe_module(module) -> str:
    if type(module) is torch.nn.GELU:
        return f"GELU(approximate={module.approximate!r}) (FusedMLP's GELU is the tanh approximation)"
    return type(module).__name__


def _listed(params: torch.nn.ParameterList) -> list:
    """``list(params)``: eagerly read from the list's own parameter dict (in order: it holds them by index), which
    costs a tenth of iterating ``ParameterList`` (a string index and a module attribute lookup per item); while
    Torch traces a program, iterated as it is."""
    if torch.compiler.is_compiling():
        return list(params)
    own = params.__dict__.get("_parameters")
    if own is None or len(own) != len(params):  # not a ParameterList as this Torch lays it out
        return list(params)
    return [*own.values()]
