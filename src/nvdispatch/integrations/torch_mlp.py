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

Process-wide options (:mod:`.mlp_options`) change how the GEMMs run, not what they compute: ``autotune`` times
each GEMM site's cuBLASLt algorithms once per problem, ``gelu_forward="split"`` runs a GELU chain's hidden layers
as a ``BIAS`` GEMM and Torch's GELU (the pre-activation kept as ``GELU_AUX_BIAS`` keeps it).

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
import operator
from collections import OrderedDict
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
    if x.dim() == 0:
        raise ShapeMismatchError("x", "a tensor of shape (..., in_0)", "a 0-d tensor")
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
    rows = x.reshape(math.prod(x.shape[:-1]), x.shape[-1])  # 2-D for the GEMMs; no -1: features may be 0
    y = torch_mlp_ops.apply(rows, weights, biases, activation, relu_backward, weight_layout)
    return y.reshape(*x.shape[:-1], y.shape[-1])


class FusedMLP(torch.nn.Sequential):
    """``torch.nn.Sequential(Linear, act, Linear, act, ..., Linear)`` of ``widths`` (``widths[0]`` inputs,
    ``widths[-1]`` outputs) whose forward and backward GEMMs are fused by nvdispatch, the whole chain one autograd
    node (:func:`fused_mlp`, whose ``relu_backward`` this takes).

    It *is* that Sequential: its children are ``torch.nn.Linear`` layers at ``"0"``, ``"2"``, ... and the
    activation modules (``torch.nn.ReLU`` or ``torch.nn.GELU(approximate="tanh")``) at the odd indices, built and
    initialised as the Sequential builds them, so ``state_dict()`` keys (``0.weight``, ``0.bias``, ``2.weight``,
    ...), ``parameters()`` order (layer by layer, weight then bias), and hence an optimizer's checkpoint, are the
    Sequential's, and indexing, iteration, ``len`` and the Sequential's editing methods behave as a Sequential's.
    The fused forward is only an optimization of calling the children in order: it runs while the children are
    such a chain (every Linear of exactly that class with a bias, one activation between every two, no forward or
    backward hooks on a child); a FusedMLP edited into anything else (another activation, a Dropout appended, a
    hook registered on a layer) computes ``torch.nn.Sequential.forward``, the children one by one. A slice is a
    plain ``torch.nn.Sequential`` over the same modules.

    Examples
    --------
    >>> import torch
    >>> from nvdispatch.integrations.torch_mlp import FusedMLP
    >>> mlp = FusedMLP([16, 32, 4], activation="gelu")
    >>> mlp
    FusedMLP(
      relu_backward='mask'
      (0): Linear(in_features=16, out_features=32, bias=True)
      (1): GELU(approximate='tanh')
      (2): Linear(in_features=32, out_features=4, bias=True)
    )
    >>> isinstance(mlp, torch.nn.Sequential), len(mlp), mlp.widths, mlp.activation
    (True, 3, [16, 32, 4], 'gelu')
    >>> x = torch.randn(8, 16)
    >>> bool(torch.allclose(mlp(x), mlp[2](mlp[1](mlp[0](x))), atol=1e-5))
    True

    Checkpoints are the Sequential's: the state dict of the ``torch.nn.Sequential`` it replaces loads as it is,
    and the other way round.

    >>> seq = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    >>> mlp = FusedMLP([16, 32, 4])
    >>> mlp.load_state_dict(seq.state_dict())
    <All keys matched successfully>
    >>> list(mlp.state_dict())
    ['0.weight', '0.bias', '2.weight', '2.bias']
    >>> bool(torch.allclose(mlp(x), seq(x), atol=1e-5))
    True

    A checkpoint of an earlier FusedMLP, which kept its parameters as ``weights.0``, ``biases.0``, ..., loads too
    (a load-state-dict pre-hook renames its keys; what a strict load reports is named by that checkpoint's keys).
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
        widths = _checked_widths(widths)
        _check_choices(activation, relu_backward)
        modules = []
        for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:])):
            if i:
                modules.append(torch_mlp_state.activation_module(activation))
            modules.append(torch.nn.Linear(fan_in, fan_out, device=device, dtype=dtype))
        super().__init__(*modules)
        self._adopt(relu_backward)

    def _adopt(self, relu_backward: str) -> None:
        """What ``__init__`` adds to the Sequential of the children already in place."""
        self.relu_backward = relu_backward
        self.register_load_state_dict_pre_hook(torch_mlp_state.accept_fused_keys)
        self.register_load_state_dict_post_hook(torch_mlp_state.report_fused_keys)
        epilog, _ = torch_mlp_ops.hidden_epilog(self.activation or "relu", relu_backward, True)
        log.debug("FusedMLP %s: hidden layers %s, relu_backward=%s, weights (out, in)", self.widths, epilog,
                  relu_backward)  # fmt: skip

    @classmethod
    def from_sequential(cls, layers, *, relu_backward: str = "mask") -> FusedMLP:
        """The ``FusedMLP`` of an existing Torch model: ``layers`` (a ``torch.nn.Sequential``, or any iterable of
        modules) ``Linear, act, Linear, act, ..., Linear``, the same activation between every two Linear layers
        (``torch.nn.ReLU``, or ``torch.nn.GELU(approximate="tanh")``) and every Linear with a bias. The new model
        holds the modules themselves (not copies) as its children, so it holds the same parameter tensors: an
        optimizer made over the old model's parameters trains the new one, and the gradients land where they did.

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
        "relu_backward='mask'"
        >>> mlp[0] is seq[0], mlp[0].weight is seq[0].weight
        (True, True)
        >>> x = torch.randn(8, 16)
        >>> bool(torch.allclose(mlp(x), seq(x), atol=1e-5))
        True
        """
        _check_choices("relu", relu_backward)
        modules = list(layers)
        if len(modules) % 2 == 0 or not modules:
            raise InvalidArgumentError(
                "layers", "Linear, act, ..., Linear: an odd number of modules", f"{len(modules)} modules"
            )
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
        model = cls.__new__(cls)
        torch.nn.Sequential.__init__(model, *modules)
        model._adopt(relu_backward)
        return model

    def to_sequential(self) -> torch.nn.Sequential:
        """The plain Torch model this one computes: a ``torch.nn.Sequential`` over this model's own children (the
        same modules, so the same parameters, not copies; the inverse of :meth:`from_sequential`), in this model's
        training mode. Its ``state_dict()`` and ``parameters()`` are this model's, and load without nvdispatch.

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
        >>> seq[0] is mlp[0]
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
        return torch.nn.Sequential(OrderedDict(self._modules)).train(self.training)

    def __getitem__(self, idx):
        if isinstance(idx, slice):  # a part of the chain need not be an MLP: a plain Sequential of those modules
            return torch.nn.Sequential(OrderedDict(list(self._modules.items())[idx]))
        return super().__getitem__(idx)

    @property
    def weights(self) -> list[torch.nn.Parameter]:
        """The Linear layers' weights, in order (``self[0].weight``, ``self[2].weight``, ...)."""
        return [module.weight for module in list(self._modules.values())[::2]]

    @property
    def biases(self) -> list[torch.nn.Parameter]:
        """The Linear layers' biases, in order (``self[0].bias``, ``self[2].bias``, ...)."""
        return [module.bias for module in list(self._modules.values())[::2]]

    @property
    def widths(self) -> list[int]:
        """``[in_features of the first Linear, out_features of each Linear...]``."""
        linears = list(self._modules.values())[::2]
        return [linears[0].in_features] + [linear.out_features for linear in linears]

    @property
    def activation(self) -> str | None:
        """``"relu"`` or ``"gelu"`` while the children are a chain the fused forward computes, else None."""
        chain = _chain(self)
        return chain[2] if chain is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chain = _chain(self)
        if chain is None:
            log.debug("FusedMLP: children are not a fusable Linear/activation chain; forward is Sequential's")
            return super().forward(x)
        weights, biases, activation = chain
        return fused_mlp(x, weights, biases, activation, relu_backward=self.relu_backward)

    def extra_repr(self) -> str:
        return f"relu_backward={self.relu_backward!r}"


def _checked_widths(widths: object) -> list[int]:
    if isinstance(widths, (str, bytes)) or not hasattr(widths, "__len__") or len(widths) < 2:
        raise InvalidArgumentError("widths", "a sequence of at least two widths (inputs and outputs)", repr(widths))
    checked = []
    for i, width in enumerate(widths):
        try:
            value = None if isinstance(width, bool) else operator.index(width)
        except TypeError:
            value = None
        if value is None or value < 0:
            raise InvalidArgumentError(f"widths[{i}]", "a non-negative int", repr(width))
        checked.append(value)
    return checked


def _chain(model: torch.nn.Module) -> tuple[list, list, str] | None:
    """The weights, biases and activation of ``model``'s children when they are ``Linear, act, ..., Linear`` the
    fused forward computes exactly (no hooks on a child, each Linear of that class with a bias), else None."""
    modules = model.__dict__["_modules"].values()  # read as Module.__getattr__ would, without its lookup
    weights, biases = [], []
    activation = None
    for i, module in enumerate(modules):
        if module._forward_hooks or module._forward_pre_hooks or module._backward_hooks or \
                module._backward_pre_hooks:  # fmt: skip
            return None
        if i % 2:
            found = _activation_of(module)
            if found is None or (activation is not None and found != activation):
                return None
            activation = found
            continue
        if type(module) is not torch.nn.Linear:
            return None
        params = module._parameters
        weight, bias = params["weight"], params["bias"]
        if bias is None:
            return None
        weights.append(weight)
        biases.append(bias)
    if not weights or len(modules) % 2 == 0:
        return None
    return weights, biases, activation or "relu"


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
