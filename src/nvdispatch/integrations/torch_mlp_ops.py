"""A multi-layer perceptron's whole training pass as two ``nvdispatch::`` operators, and the autograd Function that
runs their kernels eagerly (:mod:`.torch_mlp` holds the model and the rules of its math).

``nvdispatch::mlp_forward(Tensor x, Tensor[] weights, Tensor[] biases, str activation, str relu_backward,
str weight_layout, bool for_backward) -> Tensor[]``
    ``x`` (rows) through the layers, each one fused call (``weight_layout``: ``"out_in"``, ``weights[i]`` of shape
    ``(out, in)`` as ``torch.nn.Linear`` stores them, each layer ``h @ W^T`` on the transposed view; ``"in_out"``,
    ``(in, out)``, each layer ``h @ W``) (hidden layers ``RELU_BIAS``, ``RELU_AUX_BIAS`` or
    ``GELU_AUX_BIAS`` — with the ``gelu_forward="split"`` option of :mod:`.mlp_options` a ``BIAS`` GEMM and Torch's
    GELU —, the output layer ``BIAS``). Returns ``[y]``, and with ``for_backward`` what the backward
    reads: ``[y, h_1 .. h_{L-1}, aux_1 .. aux_{L-1}]`` (the hidden outputs; the aux outputs where the backward
    takes them: GELU's pre-activations, or ReLU's masks with ``relu_backward="drelu"``, in the formats of
    :mod:`.torch_layouts`). Autograd may record a call only with ``for_backward`` (else a typed error).
``nvdispatch::mlp_backward(Tensor grad, Tensor x, Tensor[] weights, Tensor[] hidden, Tensor[] aux, str activation,
str relu_backward, str weight_layout, bool input_grad) -> Tensor[]``
    From the output's gradient: ``[dx, dW_1 .. dW_L, db_1 .. db_L]`` (``dx`` only with ``input_grad``; each ``dW``
    in its weight's layout). Per layer one GEMM for the weight and bias gradients (``"out_in"``:
    ``dz^T @ h_prev`` with ``BGRADA``, the bias gradient being the sum of ``dz^T`` along K; ``"in_out"``:
    ``h_prev^T @ dz`` with ``BGRADB``) and one GEMM for the gradient of the layer below (``dz @ W``, or
    ``dz @ W^T``): ``DGELU`` / ``DRELU`` fused, or with ``relu_backward="mask"`` a plain GEMM masked by ``h > 0``
    (one elementwise op). On CUDA bfloat16 tensors, where it is timed faster for the problem, the derivative and
    the bias gradient come from one pass (:mod:`.torch_activation_grad`) after a plain GEMM, and the weight
    gradients from plain GEMMs.

``nvdispatch::mlp_forward_kernel`` / ``nvdispatch::mlp_backward_kernel`` (the same schemas)
    The same kernels as operators that autograd passes by (a fallthrough at the ``Autograd`` key, the kernels
    run with autograd off): never differentiated. ``mlp_forward``'s autograd records one node whose forward and
    backward call them, so a traced program holds these two, and a compiled graph reaches each kernel through the
    dispatcher alone, with no Python autograd step (``torch.library.register_autograd``'s kernel and redispatch)
    per call.

Registered as the other operators are (:mod:`.torch_ops`: ``torch.library.Library`` schemas, one
``CompositeExplicitAutograd`` kernel for every device, exact fake kernels), in the same namespace; ``mlp_forward``'s
``Autograd`` kernel is the chain's autograd Function, ``mlp_backward`` refuses a derivative
(``register_autograd``). In a compiled graph the step is two opaque nodes, whatever the number of layers. A kernel
runs its problem's prepared plan (:mod:`.torch_mlp_plan`, in the plan cache under a key holding the backend state
and precision settings current when it runs): each GEMM the plan ``nvdispatch.matmul`` would run for it, called
directly (on CUDA one compiled cuBLASLt launch), under :func:`.torch_reentry.in_kernel`.

Eagerly, :func:`apply` runs the same kernels as one autograd Function (its forward takes ``ctx``, so
``Function.apply`` binds no arguments with ``inspect``; no dispatcher in between): one autograd node per step, and
without one (no input requiring grad, or grad mode off) the forward kernel alone. Neither the operator's nor the
Function's extra outputs take part in autograd (they are saved for the backward, not differentiated), so no zero
gradient is ever made for them. The backward is not differentiable itself: a second backward pass through it is
refused with an error.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence

import torch
from torch import Tensor

from .._backends import get_state, set_state
from ..errors import InvalidArgumentError
from . import mlp_options
from . import torch_activation_grad as one_pass
from . import torch_layouts as layouts
from . import torch_mlp_plan as chain_plan
from .mlp_epilogs import ACTIVATIONS, RELU_BACKWARDS, chain_epilogs
from .torch_errors import fake_kernel
from .torch_func import transforms_active
from .torch_ops import call_matmul, matmul_layout
from .torch_reentry import in_kernel

__all__ = [
    "ACTIVATIONS",
    "RELU_BACKWARDS",
    "WEIGHT_LAYOUTS",
    "mlp_forward_op",
    "mlp_backward_op",
    "mlp_forward_kernel_op",
    "mlp_backward_kernel_op",
    "apply",
    "hidden_epilog",
    "forward_operand",
    "out_features",
]

log = logging.getLogger("nvdispatch")

#: how ``weights[i]`` is stored: ``"out_in"`` (``(out, in)``, as ``torch.nn.Linear``) or ``"in_out"`` (``(in, out)``)
WEIGHT_LAYOUTS = ("out_in", "in_out")
_INFERENCE = {"relu": "RELU_BIAS", "gelu": "GELU_BIAS"}
_THRESHOLD_BACKWARD = torch.ops.aten.threshold_backward.default
_GELU = torch.ops.aten.gelu.default

_LIB = torch.library.Library("nvdispatch", "FRAGMENT")  # kept: the registrations live as long as this module
_LIB.define(
    "mlp_forward(Tensor x, Tensor[] weights, Tensor[] biases, str activation, str relu_backward, "
    "str weight_layout, bool for_backward) -> Tensor[]"
)
_LIB.define(
    "mlp_backward(Tensor grad, Tensor x, Tensor[] weights, Tensor[] hidden, Tensor[] aux, str activation, "
    "str relu_backward, str weight_layout, bool input_grad) -> Tensor[]"
)
_LIB.define(
    "mlp_forward_kernel(Tensor x, Tensor[] weights, Tensor[] biases, str activation, str relu_backward, "
    "str weight_layout, bool for_backward) -> Tensor[]"
)
_LIB.define(
    "mlp_backward_kernel(Tensor grad, Tensor x, Tensor[] weights, Tensor[] hidden, Tensor[] aux, str activation, "
    "str relu_backward, str weight_layout, bool input_grad) -> Tensor[]"
)


def hidden_epilog(activation: str, relu_backward: str, for_backward: bool) -> tuple[str, str | None]:
    """``(epilog, aux output name or None)`` of the hidden layers' forward calls.

    Examples
    --------
    >>> hidden_epilog("relu", "mask", True), hidden_epilog("gelu", "mask", True), hidden_epilog("gelu", "mask", False)
    (('RELU_BIAS', None), ('GELU_AUX_BIAS', 'gelu_aux'), ('GELU_BIAS', None))
    """
    if not for_backward:
        return _INFERENCE[activation], None
    hidden = chain_epilogs(2, activation, relu_backward)[0]
    return hidden.forward, hidden.aux


def forward_operand(w: Tensor, weight_layout: str) -> Tensor:
    """The ``b`` of a layer's forward product ``h @ b``: ``w`` stored ``(in, out)``, or the transposed view of ``w``
    stored ``(out, in)`` (no copy: the GEMM reads it transposed).

    Examples
    --------
    >>> import torch
    >>> w = torch.zeros(3, 5)
    >>> forward_operand(w, "out_in").shape, forward_operand(w, "in_out").shape
    (torch.Size([5, 3]), torch.Size([3, 5]))
    """
    return w.mT if weight_layout == "out_in" else w


def out_features(w: Tensor, weight_layout: str) -> int:
    """A layer's output width from its weight ``w`` stored in ``weight_layout``."""
    return w.shape[0] if weight_layout == "out_in" else w.shape[-1]


# -- the kernels ------------------------------------------------------------------------------------------------
def _forward_kernel(
    x, weights, biases, activation: str, relu_backward: str, weight_layout: str, for_backward: bool
) -> list[Tensor]:
    form = (len(weights), len(biases), activation, relu_backward, weight_layout, for_backward)
    with in_kernel():
        plan = chain_plan.acquire("nvdispatch::mlp_forward", form, (x, *weights, *biases))
        try:
            return _forward(plan, x, weights, biases, activation, relu_backward, weight_layout, for_backward)
        finally:
            chain_plan.let_go(plan)


def _forward(plan, x, weights, biases, activation: str, relu_backward: str, weight_layout: str, for_backward: bool):
    epilog, aux_name = hidden_epilog(activation, relu_backward, for_backward)
    split = aux_name == "gelu_aux" and _gelu_forward(plan) == "split"
    hidden: list[Tensor] = []
    aux: list[Tensor] = []
    h = x
    last = len(weights) - 1
    for i in range(last):
        h_in, w, b = h, forward_operand(weights[i], weight_layout), biases[i]
        if aux_name is None:
            h = plan.gemm(("forward", i), h_in, w, epilog, "bias", b)
        elif split:  # the pre-activation from a BIAS GEMM, the output from it by the framework's GELU
            z = plan.gemm(("forward", i, "BIAS"), h_in, w, "BIAS", "bias", b)
            h = _GELU(z, approximate="tanh")
            aux.append(z)
        else:
            h, extra = plan.gemm(("forward", i), h_in, w, epilog, "bias", b)
            aux.append(_aux_output(extra[aux_name], aux_name, h_in, w, b, epilog))
        hidden.append(h)
    w = forward_operand(weights[last], weight_layout)
    y = plan.gemm(("forward", last), h, w, "BIAS", "bias", biases[last])
    return [y, *hidden, *aux] if for_backward else [y]


def _gelu_forward(plan) -> str:
    """The ``gelu_forward`` option (:mod:`.mlp_options`) as this problem's plan first read it."""
    form = plan.memo.get("gelu_forward")
    if form is None:
        form = plan.memo["gelu_forward"] = mlp_options.gelu_forward()
    return form


def _aux_output(t, name: str, a, w, b, epilog: str) -> Tensor:
    """Aux output ``t`` of the call ``(a @ w + b)`` (``w`` the forward operand) in the operators' layout
    (:mod:`.torch_layouts`: GELU's pre-activation dense, a relu mask in its device's format, padding bits cleared)."""
    if name == "gelu_aux":
        return layouts.dense(t, a)
    problem, specs = matmul_layout(a, w, None, {"bias": b}, 1, None, epilog, None, None, None)
    return layouts.conform(t, specs[1], problem, a)


def _backward_kernel(
    grad, x, weights, hidden, aux, activation: str, relu_backward: str, weight_layout: str, input_grad: bool
):
    form = (len(weights), len(hidden), len(aux), activation, relu_backward, weight_layout, input_grad)
    with in_kernel():
        plan = chain_plan.acquire("nvdispatch::mlp_backward", form, (grad, x, *weights, *hidden, *aux))
        try:
            return _backward(plan, grad, x, weights, hidden, aux, activation, weight_layout, input_grad)
        finally:
            chain_plan.let_go(plan)


def _backward(plan, grad, x, weights, hidden, aux, activation: str, weight_layout: str, input_grad: bool):
    n = len(weights)
    dws: list = [None] * n
    dbs: list = [None] * n
    dx = None
    dz = grad
    db = _top_bias_gradient(plan, n - 1, grad, hidden[-1] if n > 1 else x, weight_layout)
    for i in range(n - 1, -1, -1):
        w = weights[i]
        h_in = hidden[i - 1] if i else x
        dw, db = _weight_gradients(plan, i, dz, h_in, weight_layout, db)
        dws[i] = dw if dw.dtype == w.dtype else layouts.dense(dw.to(w.dtype), x)
        dbs[i] = db if db.dtype == w.dtype and db.dim() == 1 and db.is_contiguous() else \
            layouts.dense(db.reshape(out_features(w, weight_layout)).to(w.dtype), x)  # fmt: skip
        w_t = w if weight_layout == "out_in" else w.mT  # dz @ W^T of the forward's h @ W
        if i:
            h_below = hidden[i - 2] if i > 1 else x
            dz, db = _layer_below(plan, i, dz, w_t, hidden[i - 1], aux[i - 1] if aux else None, activation, h_below,
                                  weight_layout)  # fmt: skip
        elif input_grad:
            dx = plan.gemm(("below", 0, "DEFAULT"), dz, w_t)
            dx = dx if dx.dtype == x.dtype else layouts.dense(dx.to(x.dtype), x)
    return ([dx] if input_grad else []) + dws + dbs


def _weight_gradients(plan, i: int, dz, h_in, weight_layout: str, db):
    """``(dW, db)`` of layer ``i`` from its pre-activation gradient ``dz``: one GEMM with the bias-gradient
    epilogue (``"out_in"``: ``dz^T @ h_in``, the bias gradient the sums of ``dz^T`` along K, ``BGRADA``;
    ``"in_out"``: ``h_in^T @ dz``, ``BGRADB``), or a plain GEMM where ``db`` is already known."""
    out_in = weight_layout == "out_in"
    a, b = (dz.mT, h_in) if out_in else (h_in.mT, dz)
    if db is not None:
        return plan.gemm(("weights", i, "DEFAULT"), a, b), db
    epilog = "BGRADA" if out_in else "BGRADB"
    dw, extra = plan.gemm(("weights", i, epilog), a, b, epilog)
    db = extra[epilog.lower()]
    return dw, db if isinstance(db, Tensor) else layouts.dense(db, dz)  # a coercing backend's executor's array


def _derivative_epilogue(plan, i: int, dz, w_t, h, aux, activation: str):
    """The gradient of the pre-activation below layer ``i``: ``(dz @ w_t) * act'(z)``, the derivative fused into
    the GEMM where ``aux`` is given, else (ReLU) the plain GEMM masked by the saved output ``h > 0``."""
    if aux is None:
        return _THRESHOLD_BACKWARD(plan.gemm(("below", i, "DEFAULT"), dz, w_t), h, 0)
    below = chain_epilogs(2, activation, "drelu")[0]  # an aux was kept: the derivative's epilog takes it
    epilog = below.backward_epilog
    return plan.gemm(("below", i, epilog), dz, w_t, epilog, below.aux, aux)


def _one_pass_kind(dz, h, aux, activation: str):
    """``(kind, saved)`` of the one-pass backward (:mod:`.torch_activation_grad`) for this layer, or None where it
    cannot run: a ReLU layer takes its output ``h`` (the derivative its mask) or the forward's bit mask where it
    kept one (``relu_backward="drelu"``), a GELU layer its pre-activation."""
    if not (dz.is_cuda and dz.dtype == torch.bfloat16):
        return None
    if activation == "gelu":
        kind, saved = "gelu", aux
    elif aux is None:  # relu_backward="mask"
        kind, saved = "relu", h
    else:  # "drelu": the forward kept cuBLASLt's bit mask
        kind, saved = "relu_bits", aux
    return (kind, saved) if one_pass.one_pass_reason(h, saved) is None else None


def _layer_below(plan, i: int, dz, w_t, h, aux, activation: str, h_below, weight_layout: str):
    """``(dz_below, db_below or None)``: the gradient of the pre-activation below layer ``i``, and its bias
    gradient where the form that runs gives it (then the weight gradients below need no bias-gradient epilogue).
    On CUDA the forms :func:`_below_labels` offers are timed once per problem, each with the weight gradients of
    the layer below, and the fastest kept (:func:`.torch_activation_grad.choose`); later calls look the choice
    up."""
    if not dz.is_cuda:
        return _derivative_epilogue(plan, i, dz, w_t, h, aux, activation), None
    key = plan.memo.get(("layer", i))
    if key is None:
        key = plan.memo[("layer", i)] = ("layer", dz.device, dz.dtype, dz.shape, w_t.shape, h_below.shape,
                                         activation, aux is None, weight_layout)  # fmt: skip
    label = one_pass.chosen(key)
    if label is None:
        forms = {}
        for form in _below_labels(dz, h, aux, activation):
            run = functools.partial(_below_form, plan, i, form, dz, w_t, h, aux, activation)
            forms[form] = functools.partial(_with_weights, plan, i - 1, run, h_below, weight_layout)
        label = one_pass.choose(key, forms, dz.device)
    return _below_form(plan, i, label, dz, w_t, h, aux, activation)


def _below_labels(dz, h, aux, activation: str) -> list[str]:
    """The forms of :func:`_below_form` that can run here: ``"epilogue"`` always; ``"epilogue-bgrad"`` where an aux
    was kept; ``"one-pass"`` where :func:`_one_pass_kind` finds one (CUDA bfloat16)."""
    labels = ["epilogue"]
    if aux is not None:
        labels.append("epilogue-bgrad")
    if _one_pass_kind(dz, h, aux, activation) is not None:
        labels.append("one-pass")
    return labels


def _below_form(plan, i: int, label: str, dz, w_t, h, aux, activation: str):
    """``(dz_below, db_below or None)`` below layer ``i`` by form ``label``: ``"epilogue"``
    (:func:`_derivative_epilogue`, no bias gradient); ``"epilogue-bgrad"`` (``DGELU_BGRAD``/``DRELU_BGRAD``: the
    bias gradient from the same GEMM); ``"one-pass"`` (a plain GEMM, then
    :func:`.torch_activation_grad.activation_backward`)."""
    if label == "epilogue":
        return _derivative_epilogue(plan, i, dz, w_t, h, aux, activation), None
    if label == "epilogue-bgrad":
        below = chain_epilogs(2, activation, "drelu")[0]
        name = below.backward_epilog + "_BGRAD"
        d, extra = plan.gemm(("below", i, name), dz, w_t, name, below.aux, aux)
        return d, extra[name.lower()]
    one = _one_pass_kind(dz, h, aux, activation)
    if one is None:  # chosen for this problem, but these tensors are not as the kernels need them
        return _derivative_epilogue(plan, i, dz, w_t, h, aux, activation), None
    return one_pass.activation_backward(one[0], plan.gemm(("below", i, "DEFAULT"), dz, w_t), one[1])


def _with_weights(plan, i: int, form, h_below, weight_layout: str):
    """One form of a layer's backward, then the weight gradients of layer ``i`` below (what a choice times)."""
    dz, db = form()
    return _weight_gradients(plan, i, dz, h_below, weight_layout, db)


def _top_bias_gradient(plan, top: int, grad, h_in, weight_layout: str):
    """The output layer's (``top``'s) bias gradient (the column sums of ``grad``) by the one-pass kernel where it
    runs and, with the plain weight-gradient GEMM, is faster for this problem than the GEMM's bias-gradient
    epilogue; else None (the epilogue gives it)."""
    if not grad.is_cuda:
        return None
    key = plan.memo.get("output")
    if key is None:
        key = plan.memo["output"] = ("output", grad.device, grad.dtype, grad.shape, h_in.shape, weight_layout)
    label = one_pass.chosen(key)
    if label is None:
        forms = {"epilogue": lambda: _weight_gradients(plan, top, grad, h_in, weight_layout, None)}
        if grad.dtype == torch.bfloat16 and grad.dim() == 2 and one_pass.one_pass_reason(grad, None) is None:
            forms["one-pass"] = lambda: _weight_gradients(plan, top, grad, h_in, weight_layout, _column_sums(grad))
        label = one_pass.choose(key, forms, grad.device)
    return _column_sums(grad) if label == "one-pass" else None


def _column_sums(grad):
    return one_pass.activation_backward("none", grad, None)[1]


# -- fake kernels: the same rule (the public function's problem per call) on fake tensors ----------------------------
def _spec_outputs(a, b, inputs: dict, epilog: str):
    problem, specs = matmul_layout(a, b, None, inputs, 1, None, epilog, None, None, None)
    return layouts.empty_outputs(specs, a)


def _forward_fake(x, weights, biases, activation, relu_backward, weight_layout, for_backward):
    epilog, aux_name = hidden_epilog(activation, relu_backward, for_backward)
    log.debug(
        "nvdispatch::mlp_forward traced: %d layers, hidden layers %s, output layer BIAS, relu_backward=%s, "
        "weights %s", len(weights), epilog, relu_backward, weight_layout,
    )  # fmt: skip
    hidden, aux = [], []
    h = x
    last = len(weights) - 1
    for i in range(last):
        outs = _spec_outputs(h, forward_operand(weights[i], weight_layout), {"bias": biases[i]}, epilog)
        h = outs[0]
        hidden.append(h)
        if aux_name is not None:
            aux.append(outs[1])
    y = _spec_outputs(h, forward_operand(weights[last], weight_layout), {"bias": biases[last]}, "BIAS")[0]
    return [y, *hidden, *aux] if for_backward else [y]


def _backward_fake(grad, x, weights, hidden, aux, activation, relu_backward, weight_layout, input_grad):
    dws = [w.new_empty(w.shape) for w in weights]
    dbs = [w.new_empty((out_features(w, weight_layout),)) for w in weights]
    return ([x.new_empty(x.shape)] if input_grad else []) + dws + dbs


def _below_autograd(kernel):
    """``kernel`` with autograd off for the Torch ops it runs (a kernel operator's outputs are never
    differentiated, whatever its inputs require)."""

    def run(*args):
        with torch._C._AutoDispatchBelowAutograd():
            return kernel(*args)

    return functools.update_wrapper(run, kernel)


for _name, _kernel, _fake in (
    ("mlp_forward", _forward_kernel, _forward_fake),
    ("mlp_backward", _backward_kernel, _backward_fake),
    ("mlp_forward_kernel", _below_autograd(_forward_kernel), _forward_fake),
    ("mlp_backward_kernel", _below_autograd(_backward_kernel), _backward_fake),
):
    _LIB.impl(_name, _kernel, "CompositeExplicitAutograd")
    torch.library.register_fake(f"nvdispatch::{_name}", fake_kernel(_fake), lib=_LIB)
# the kernel operators are not differentiated: the dispatcher passes their autograd key by, no Python step
_LIB.impl("mlp_forward_kernel", torch.library.fallthrough_kernel, "Autograd")
_LIB.impl("mlp_backward_kernel", torch.library.fallthrough_kernel, "Autograd")
mlp_forward_op = torch.ops.nvdispatch.mlp_forward.default
mlp_backward_op = torch.ops.nvdispatch.mlp_backward.default
mlp_forward_kernel_op = torch.ops.nvdispatch.mlp_forward_kernel.default
mlp_backward_kernel_op = torch.ops.nvdispatch.mlp_backward_kernel.default


# -- autograd -----------------------------------------------------------------------------------------------------
def _save(ctx, x, weights: Sequence[Tensor], outputs, activation: str, relu_backward: str, weight_layout: str):
    """What the backward reads, on ``ctx``; the extra outputs marked as not differentiated."""
    ctx.set_materialize_grads(False)
    ctx.activation, ctx.relu_backward, ctx.layers = activation, relu_backward, len(weights)
    ctx.weight_layout = weight_layout
    if len(outputs) > 1:
        ctx.mark_non_differentiable(*outputs[1:])
    ctx.save_for_backward(x, *weights, *outputs[1:])


def _saved(ctx):
    """``(x, weights, hidden, aux)`` of :func:`_save`."""
    saved = ctx.saved_tensors
    n = ctx.layers
    x, weights, rest = saved[0], list(saved[1 : n + 1]), list(saved[n + 1 :])
    return x, weights, rest[: n - 1], rest[n - 1 :]


def _chain_forward(ctx, x, activation, relu_backward, weight_layout, by_operators, n, *params):
    weights, biases = params[:n], params[n:]
    if by_operators:
        outputs = mlp_forward_kernel_op(x, list(weights), list(biases), activation, relu_backward, weight_layout, True)
    else:
        outputs = _forward_kernel(x, weights, biases, activation, relu_backward, weight_layout, True)
    _save(ctx, x, weights, outputs, activation, relu_backward, weight_layout)
    ctx.by_operators = by_operators
    # the backward runs under the forward's backend state: autograd runs the backward of CUDA tensors on its
    # device thread, which a ``set_backend`` block (a ContextVar) around the step does not reach
    ctx.backends = get_state()
    return tuple(outputs) if by_operators else outputs[0]


@torch.autograd.function.once_differentiable
def _chain_backward(ctx, gy, *_not_differentiated):
    n = ctx.layers
    needs = ctx.needs_input_grad
    if gy is None:
        return None, None, None, None, None, None, *([None] * (2 * n))
    x, weights, hidden, aux = _saved(ctx)
    args = (gy, x, weights, hidden, aux, ctx.activation, ctx.relu_backward, ctx.weight_layout, needs[0])
    if get_state().key == ctx.backends.key:
        got = _run_backward(ctx.by_operators, args)
    else:
        with set_state(ctx.backends):
            got = _run_backward(ctx.by_operators, args)
    dx = got[0] if needs[0] else None
    params = got[-2 * n :]
    return dx, None, None, None, None, None, *(g if k else None for g, k in zip(params, needs[6:]))


def _run_backward(by_operators: bool, args: tuple):
    return mlp_backward_kernel_op(*args) if by_operators else _backward_kernel(*args)


#: the chain as one autograd Function: ``apply(x, activation, relu_backward, weight_layout, by_operators,
#: n_layers, *weights, *biases)``; eagerly (``by_operators`` False) it runs the kernels and returns the output,
#: as ``nvdispatch::mlp_forward``'s autograd kernel (True) the kernel operators, returning every output
_Chain = type(
    "nvdispatch_mlp",
    (torch.autograd.Function,),
    {"forward": staticmethod(_chain_forward), "backward": staticmethod(_chain_backward), "__module__": __name__},
)


def _forward_autograd(x, weights, biases, activation, relu_backward, weight_layout, for_backward):
    """``nvdispatch::mlp_forward``'s Autograd kernel: recorded as one :data:`_Chain` node where an input requires
    grad (grad mode on), else the kernel operator."""
    if torch.is_grad_enabled() and (
        x.requires_grad or any(w.requires_grad for w in weights) or any(b.requires_grad for b in biases)
    ):
        if not for_backward:
            raise InvalidArgumentError(
                "for_backward", "True where autograd records the call (an input requires grad, grad mode on)", "False"
            )
        return list(_Chain.apply(x, activation, relu_backward, weight_layout, True, len(weights), *weights, *biases))
    return mlp_forward_kernel_op(x, weights, biases, activation, relu_backward, weight_layout, for_backward)


def _no_double_backward(ctx, grads):
    raise RuntimeError("nvdispatch::mlp_backward has no derivative: FusedMLP supports one backward pass, not two")


_LIB.impl("mlp_forward", _forward_autograd, "Autograd")
torch.library.register_autograd("nvdispatch::mlp_backward", _no_double_backward, lib=_LIB)


def _layers(x: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor], activation: str, weight_layout: str):
    """The chain as one ``nvdispatch::matmul`` call per layer (the hidden layers' activation and every bias fused
    in), for ``torch.func`` transforms: the matmul operator has their batching rules and formulas (``vmap`` folds
    the vmapped dimension into each layer's GEMM, ``grad`` takes each layer's weight and bias gradient from one
    BGRADA/BGRADB GEMM, ``jvp``/``jacfwd``/``hessian`` its forward-mode formulas), where the chain's two operators
    have neither (their backward is not differentiable, and has no forward mode). Compiled too."""
    h = x
    last = len(weights) - 1
    for i, (w, b) in enumerate(zip(weights, biases)):
        epilog = "BIAS" if i == last else _INFERENCE[activation]
        h = call_matmul(h, forward_operand(w, weight_layout), None, 1, None, epilog, {"bias": b}, None, None, None)
    return h


def apply(
    x: Tensor,
    weights: Sequence[Tensor],
    biases: Sequence[Tensor],
    activation: str,
    relu_backward: str,
    weight_layout: str = "out_in",
):
    """The output of the chain on rows ``x``: the operator while Torch traces a program (one node of its graph, its
    backward another), else the kernels as one autograd Function; under a ``torch.func`` transform its layers (see
    :func:`_layers`). Arguments are checked by the caller."""
    if transforms_active():
        return _layers(x, weights, biases, activation, weight_layout)
    for_backward = torch.is_grad_enabled() and (
        x.requires_grad or any(w.requires_grad for w in weights) or any(b.requires_grad for b in biases)
    )
    if torch.compiler.is_compiling():
        return mlp_forward_op(x, list(weights), list(biases), activation, relu_backward, weight_layout, for_backward)[0]
    if not for_backward:
        return _forward_kernel(x, weights, biases, activation, relu_backward, weight_layout, False)[0]
    return _Chain.apply(x, activation, relu_backward, weight_layout, False, len(weights), *weights, *biases)
