"""``torch.func`` over the ``nvdispatch::`` Torch operators: batching rules, and the autograd Functions that carry
the operators' formulas (reverse and forward mode) through ``vmap``, ``grad``, ``jacrev``, ``jacfwd``, ``jvp``...

* **Batching rules** (``torch.library.register_vmap``). The vmapped dimension becomes one more batch dimension of
  the one operator call, so a vmapped call stays one fused call: for ``matmul`` a leading batch dimension of every
  batched operand (``a``, ``b``, ``c``, the epilog inputs), aligned with the others' batch dimensions as PEP 465
  broadcasts them (a 1-D operand is promoted to a matrix first, and a batched vector ``a`` times an unbatched
  matrix is one ``(B, k) @ (k, n)`` product); for the transforms a leading axis that is not transformed (the
  transformed axes are renumbered from the end); for ``convolve`` a leading axis of the signal, with a batched
  filter aligned to it.
* **Formulas under transforms.** Inside a ``torch.func`` transform (or an eager ``torch.autograd.forward_ad``
  level) an operator call goes through :func:`call`: an autograd Function whose ``setup_context``/``backward``
  are the operators' own formulas (:mod:`.torch_autograd`), with a ``jvp`` (:mod:`.torch_jvp`), and whose vmap
  rule is generated (``generate_vmap_rule``: its forward, backward and jvp run under ``vmap``, where the
  operators' batching rules fold the vmapped dimension in). The formulas call the operators through
  :func:`call` too, so transforms compose (``vmap(grad(f))``, ``jacfwd(jacrev(f))``).
"""

from __future__ import annotations

import math

import torch

from .torch_errors import refuse

__all__ = ["transforms_active", "call", "install", "register_batching_rules"]

_OPS = {
    "matmul": lambda: torch.ops.nvdispatch.matmul.default,
    "fft": lambda: torch.ops.nvdispatch.fft.default,
    "convolve": lambda: torch.ops.nvdispatch.convolve.default,
}
#: operator name -> its autograd Function for calls under transforms (see :func:`install`)
_FUNCTIONS: dict[str, type] = {}
_forward_ad = torch.autograd.forward_ad
_TransformType = torch._C._functorch.TransformType


_functorch_active = torch._C._are_functorch_transforms_active


def transforms_active() -> bool:
    """Whether a ``torch.func`` transform is active, or an eager forward-mode AD level is open."""
    return _functorch_active() or _forward_ad._current_level >= 0


def _pack(args: tuple) -> tuple:
    """A Function's arguments: ``args`` with each list argument spread into its items, then a layout string
    (each argument's item count, ``.`` for one that is not a list; ``""`` where none is).

    Functorch's generated vmap rule of a Function matches the in-dims of its inputs, flattened as pytrees (a list
    counts as its items), with one tangent or gradient per input: a list among the inputs (``s``/``axes`` of an
    n-D transform) breaks ``jvp``/``backward`` under ``vmap`` (``hessian``, ``jacfwd`` of ``jacrev``...) with
    "flat_bdims must not be None". Spread, every input is a leaf."""
    if not any(isinstance(a, list) for a in args):
        return (*args, "")
    flat, layout = [], []
    for a in args:
        if isinstance(a, list):
            flat.extend(a)
            layout.append(str(len(a)))
        else:
            flat.append(a)
            layout.append(".")
    return (*flat, ",".join(layout))


def _unpack(flat: tuple) -> tuple:
    """The arguments :func:`_pack` gave ``flat`` for."""
    layout = flat[-1]
    if not layout:
        return flat[:-1]
    args, i = [], 0
    for token in layout.split(","):
        if token == ".":
            args.append(flat[i])
            i += 1
        else:
            args.append(list(flat[i : i + int(token)]))
            i += int(token)
    return tuple(args)


def _spread(grads, layout: str) -> tuple:
    """One gradient per packed input from one per argument (None for a list's items and for the layout)."""
    if not layout:
        return (*grads, None)
    out = []
    for g, token in zip(grads, layout.split(",")):
        out.extend([g] if token == "." else [None] * int(token))
    return (*out, None)


def _gather(tangents, layout: str) -> tuple:
    """One tangent per argument from one per packed input (None for a list: integers have none)."""
    if not layout:
        return tangents[:-1]
    out, i = [], 0
    for token in layout.split(","):
        out.append(tangents[i] if token == "." else None)
        i += 1 if token == "." else int(token)
    return tuple(out)


@torch._dynamo.allow_in_graph
def _apply(name: str, *args):
    """Operator ``name``'s Function for transforms applied to ``args``.

    Dynamo takes this call into the graph as it is (``allow_in_graph``) instead of tracing the Function: under a
    ``torch.func`` transform that Dynamo inlines (``grad``, ``vjp``, ``jacrev``, ``jvp``, ``jacfwd``...) its
    operands are the transform's wrapped tensors, and the operator's own autograd kernel (``register_autograd``'s
    generated Function, which has no ``setup_context``) cannot run on them, while Dynamo cannot trace a Function
    with a ``jvp``. Taken as it is, the call runs through functorch's ``custom_function_call`` when Dynamo
    propagates fake tensors and when AOTAutograd traces the graph, as it does eagerly: the graph holds the
    operator calls the formulas make."""
    return _FUNCTIONS[name].apply(*_pack(args))


@torch.compiler.assume_constant_result
def _differentiating() -> str | None:
    """The differentiating transform in effect (named for an error), or None where only ``vmap`` is (Dynamo runs
    it for real: the transforms it traces are in effect while it traces)."""
    if _forward_ad._current_level >= 0:
        return "torch.autograd.forward_ad"
    for interpreter in torch._C._functorch.get_interpreter_stack() or ():
        kind = interpreter.key()
        if kind == _TransformType.Grad:
            return "torch.func.grad/vjp/jacrev/hessian"
        if kind == _TransformType.Jvp:
            return "torch.func.jvp/jacfwd/hessian"
    return None


@torch.compiler.assume_constant_result
def _exporting() -> bool:
    """Whether ``torch.export`` is tracing, read for real: Dynamo in Torch 2.11 answers ``is_exporting()`` with
    True under every ``torch.compile`` too."""
    return torch.compiler.is_exporting()


def _exported(name: str, args):
    """Operator ``name`` under a transform inside ``torch.export``: under ``vmap`` alone the operator itself (its
    batching rule folds the vmapped dimension in, and the exported graph holds the batched call); a
    differentiating transform is refused, naming it. Torch 2.13 exports no autograd Function under one:
    non-strict, functorch's ``custom_function_call`` has no rule for export's proxy mode ("Current active mode
    ProxyTorchDispatchMode not registered", a plain Function with ``setup_context`` under ``torch.func.grad``
    alike); strict, Dynamo inlines a Function's forward there (its formulas ignored), and the operator's own
    autograd kernel has no ``setup_context``."""
    transform = _differentiating()
    if transform is not None:
        refuse("InvalidArgumentError", f"nvdispatch::{name}",
               "no differentiating torch.func transform inside torch.export (Torch exports no autograd Function "
               "under one)", f"{transform}",
               "export the model and differentiate the exported module, or compile the transform with "
               "torch.compile")  # fmt: skip
    return _OPS[name]()(*args)


def call(name: str, *args):
    """Operator ``name`` on ``args``; under a transform (:func:`transforms_active`) its autograd Function, also
    in a program that Dynamo traces (see :func:`_apply`), but not inside ``torch.export`` (:func:`_exported`)."""
    if transforms_active():
        if _exporting():
            return _exported(name, args)
        return _apply(name, *args)
    return _OPS[name]()(*args)


def install(name: str, setup_context, backward, jvp, many: bool) -> None:
    """Build operator ``name``'s Function for transforms: ``setup_context(ctx, inputs, output)`` and
    ``backward(ctx, grads)`` (``grads`` a list where ``many``: the operator returns a list), ``jvp(ctx, *tangents)``
    (a list where ``many``). The Function takes the arguments packed (:func:`_pack`); the formulas see them as the
    operator does."""
    op = _OPS[name]

    def forward(*flat):
        out = op()(*_unpack(flat))
        return tuple(out) if many else out

    def setup_context_(ctx, inputs, output):
        ctx.packing = inputs[-1]
        setup_context(ctx, _unpack(inputs), output)

    def backward_(ctx, *grads):
        return _spread(backward(ctx, list(grads) if many else grads[0]), ctx.packing)

    def jvp_(ctx, *tangents):
        out = jvp(ctx, *_gather(tangents, ctx.packing))
        return tuple(out) if many else out

    body = {
        "generate_vmap_rule": True,
        "forward": staticmethod(forward),
        "setup_context": staticmethod(setup_context_),
        "backward": staticmethod(backward_),
        "jvp": staticmethod(jvp_),
    }
    _FUNCTIONS[name] = type(f"nvdispatch_{name}_func", (torch.autograd.Function,), body)


# -- batching rules ---------------------------------------------------------------------------------------------
def _front(x, bdim):
    """``x`` with its vmapped dimension first (None: not batched)."""
    return x if x is None or bdim is None else x.movedim(bdim, 0)


def _align(x, rank: int):
    """A batched ``x`` (vmapped dimension first) with size-1 dims inserted after it, up to ``rank`` + 1 dims, so
    that its vmapped dimension lines up with the others' when the per-sample shapes broadcast from the right."""
    missing = rank + 1 - x.dim()
    return x.reshape(x.shape[0], *([1] * missing), *x.shape[1:]) if missing > 0 else x


def _outputs(outs, samples, size: int):
    """``(outputs, out_dims)``: each batched output reshaped to the vmapped dimension then the per-sample shape
    ``samples[i]`` (the shape one call on one sample returns); an output of one sample's size is unbatched."""
    results, dims = [], []
    for out, shape in zip(outs, samples):
        per = math.prod(shape)
        if out.dim() >= 1 and out.numel() == size * per and (out.shape[0] == size or per == 0):
            results.append(out.reshape(size, *shape))
            dims.append(0)
        else:
            results.append(out.reshape(shape))
            dims.append(None)
    return results, dims


def _per_sample(size: int, in_dims, tensors, rest):
    """A matmul call with a vmapped quantization scale, as one call per sample: cuBLASLt's FP8 scales are one
    number per product (and ``scale_d`` quantizes the result, ``result_amax`` is one per product), so samples
    with their own scales are separate products. The outputs stacked along a leading vmapped dimension."""
    if size == 0:
        refuse("InvalidArgumentError", "quantization_scales", "a vmapped scale over at least one sample",
               "a vmapped dimension of size 0")  # fmt: skip
    op = torch.ops.nvdispatch.matmul.default
    outs = []
    for i in range(size):
        sample = [x if d is None or x is None else x.select(d, i) for x, d in zip(tensors, in_dims[:10])]
        outs.append(op(*sample, *rest))
    return [torch.stack(column) for column in zip(*outs)], [0] * len(outs[0])


def _matmul_rule(layout):
    def rule(info, in_dims, a, b, c, bias, relu_aux, gelu_aux, sa, sb, sc, sd, alpha, beta, epilog, options,
             preferences, host_scales):  # fmt: skip
        from .torch_arguments import decode

        size = info.batch_size
        if any(d is not None for d in in_dims[6:10]):
            return _per_sample(size, in_dims, (a, b, c, bias, relu_aux, gelu_aux, sa, sb, sc, sd),
                               (alpha, beta, epilog, options, preferences, host_scales))  # fmt: skip
        tensors = [a, b, c, bias, relu_aux, gelu_aux]
        fronted = [_front(x, d) for x, d in zip(tensors, in_dims[:6])]
        batched = [d is not None for d in in_dims[:6]]
        # one sample's problem: the shapes each output has for one call (metadata only)
        one = [x[0] if bd else x for x, bd in zip(fronted, batched)]
        named = {k: v for k, v in zip(("bias", "relu_aux", "gelu_aux"), one[3:]) if v is not None}
        scales = {k: v for k, v in zip("abcd", (sa, sb, sc, sd)) if v is not None}
        scales.update(decode(host_scales) or {})
        p, specs = layout(one[0], one[1], one[2], named, alpha, beta, epilog, decode(options), decode(preferences),
                          scales or None)  # fmt: skip
        a_, b_, c_, bias_, relu_, gelu_ = fronted
        ba, bb = batched[0], batched[1]
        a_vec, b_vec = p.a_vector, p.b_vector
        if not (ba and a_vec and not any(batched[1:]) and b_.dim() <= 2 and relu_ is None and gelu_ is None):
            # (B, k) @ b is the vmapped product as it is (the vmapped dimension its M); elsewhere 1-D operands
            # become matrices, and every operand shaped like the result is promoted as the result is
            if a_vec:
                a_ = a_.unsqueeze(-2)
            if b_vec:
                b_ = b_.unsqueeze(-1)
            rank = max(a_.dim() - ba, b_.dim() - bb)  # the promoted product's rank, per sample

            def result_like(x, bd):
                if x is None or x.dtype == torch.uint8:  # cuBLASLt's packed mask: no PEP 465 axes to add
                    return x
                if x.dim() - bd == 0:
                    return x.reshape(*x.shape, 1, 1) if a_vec and b_vec else x
                return x.unsqueeze(-2) if a_vec else x.unsqueeze(-1) if b_vec else x

            c_ = result_like(c_, batched[2])
            relu_, gelu_ = result_like(relu_, batched[4]), result_like(gelu_, batched[5])
            if bias_ is not None and bias_.dim() - batched[3] == 1:
                bias_ = bias_.unsqueeze(-2)  # (n,) -> (1, n): one bias row per vmapped sample
            if not (ba or bb):  # only c or an epilog input is vmapped: the product is broadcast over them
                a_, ba = a_.expand(size, *a_.shape), True
            a_ = _align(a_, rank) if ba else a_
            b_ = _align(b_, rank) if bb else b_
            c_ = _align(c_, rank) if batched[2] else c_
            bias_ = _align(bias_, rank) if batched[3] else bias_
            # the aux inputs have the result's exact shape
            full = (*torch.broadcast_shapes(a_.shape[:-2], b_.shape[:-2]), a_.shape[-2], b_.shape[-1])
            if relu_ is not None:
                relu_ = _align(relu_, rank) if batched[4] else relu_
                # a boolean mask has the result's shape; cuBLASLt's packed one (..., m, bytes) its batch dims
                relu_ = relu_.expand(full if relu_.dtype == torch.bool else (*full[:-2], *relu_.shape[-2:]))
            if gelu_ is not None:
                gelu_ = (_align(gelu_, rank) if batched[5] else gelu_).expand(full)
        op = torch.ops.nvdispatch.matmul.default
        outs = op(a_, b_, c_, bias_, relu_, gelu_, sa, sb, sc, sd, alpha, beta, epilog, options, preferences,
                  host_scales)  # fmt: skip
        return _outputs(outs, [s.shape for s in specs], size)

    return rule


def _axis(ax: int, ndim: int, argument: str) -> int:
    """A per-sample axis as a negative index (unchanged by a leading vmapped dimension)."""
    if not -ndim <= ax < ndim:
        refuse("AxisError", argument, f"an axis in [-{ndim}, {ndim}) (the per-sample rank)", str(ax))
    return ax - ndim if ax >= 0 else ax


def _fft_rule(info, in_dims, x, func, n, axis, s, axes, norm):
    """The transform's batching rule: the vmapped dimension leads, the transformed axes count from the end."""
    ndim = x.dim() - 1
    x = x.movedim(in_dims[0], 0)
    if func in ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft"):
        axis = _axis(axis, ndim, "axis")
    else:
        if axes is None:
            count = ndim if s is None else len(s)
            axes = list(range(ndim - count, ndim))
        axes = [_axis(a, ndim, "axes") for a in axes]
    return torch.ops.nvdispatch.fft.default(x, func, n, axis, s, axes, norm), 0


def _convolve_rule(info, in_dims, x, h, n, axis):
    """The convolution's batching rule: the signal's vmapped dimension leads, a batched filter lined up with it."""
    xd, hd = in_dims[:2]
    ndim = x.dim() - (xd is not None)
    axis = _axis(axis, ndim, "axis")
    if xd is None:
        x = x.expand(info.batch_size, *x.shape)
    else:
        x = x.movedim(xd, 0)
    if hd is not None:
        h = _align(h.movedim(hd, 0), ndim)
    return torch.ops.nvdispatch.convolve.default(x, h, n, axis), 0


def register_batching_rules(lib, matmul_layout) -> None:
    """Register the three operators' batching rules on ``lib`` (``matmul_layout`` as :mod:`.torch_ops` gives)."""
    torch.library.register_vmap("nvdispatch::matmul", _matmul_rule(matmul_layout), lib=lib)
    torch.library.register_vmap("nvdispatch::fft", _fft_rule, lib=lib)
    torch.library.register_vmap("nvdispatch::convolve", _convolve_rule, lib=lib)
