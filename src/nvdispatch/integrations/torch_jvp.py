"""Forward-mode formulas (``jvp``) of the ``nvdispatch::`` operators, for ``torch.func.jvp``/``jacfwd``/``hessian``
and ``torch.autograd.forward_ad``: the Functions of :mod:`.torch_func` run them.

``nvdispatch::matmul``: with ``t = alpha * a @ b + beta * c (+ bias)`` and ``y = epilog(t)``, the tangent
``dt = alpha * (da @ b + a @ db) + beta * dc (+ dbias)`` (each product one operator call), then the epilog's
derivative: ``relu'(t) dt`` from the result (``y > 0``), ``gelu'(t) dt`` from the pre-activation (a call under a
transform keeps it, as a recorded one does), ``mask * dt`` for DRELU, ``gelu'(g) dt + t gelu''(g) dg`` for DGELU
(``g`` the ``gelu_aux`` input); aux outputs: the pre-activation's tangent is ``dt``, the bias gradients' and the
operand sums' are the same sums of the tangents; the ReLU mask has none. The FFTs are real-linear maps (the
transform of the tangent), and ``convolve`` is bilinear (``convolve(dx, h) + convolve(x, dh)``).
"""

from __future__ import annotations

import torch

from . import torch_autograd as formulas
from . import torch_func

__all__ = ["install"]


def _sum(x, y):
    return y if x is None else x + y


def matmul_setup(setup):
    def setup_context(ctx, inputs, output):
        setup(ctx, inputs, output)
        a, b, c, _bias, relu_aux, gelu_aux = inputs[:6]
        pre = output[ctx.names.index("gelu_aux")] if "gelu_aux" in ctx.names else None
        ctx.save_for_forward(a, b, c, output[0], pre, relu_aux, gelu_aux)
        ctx.out_shapes = [tuple(o.shape) for o in output]
        ctx.mark_non_differentiable(*(o for o in output if not (o.is_floating_point() or o.is_complex())))

    return setup_context


def _matmul_jvp(ctx, da, db, dc, dbias, _drelu, dgelu, *_scales):
    p = ctx.problem
    a, b, c, y, pre, _relu_in, gelu_in = ctx.saved_tensors
    name = p.epilog.epilog.name
    alpha, beta = ctx.alpha, ctx.beta
    y_p = formulas.promoted(y, p)
    dt = None
    if da is not None:
        dt = formulas.product(da, b, alpha=alpha)[0]
    if db is not None:
        dt = _sum(dt, formulas.product(a, db, alpha=alpha)[0])
    if dc is not None:
        dt = _sum(dt, beta * dc)
    dt = torch.zeros_like(y_p) if dt is None else formulas.promoted(dt.broadcast_to(y.shape), p)
    if dbias is not None:
        dt = dt + (dbias.reshape(-1, 1) if dbias.dim() == 1 and p.bias_axis == "m" else dbias)
    dt = dt.to(y.dtype).broadcast_to(y_p.shape)
    if p.epilog.activation == "relu" and not p.epilog.backward:
        dy = torch.ops.aten.threshold_backward(dt, y_p, 0)
    elif p.epilog.activation == "gelu" and not p.epilog.backward:
        if pre is None:
            raise RuntimeError(f"nvdispatch::matmul's jvp needs the pre-activation of {name} (a *_AUX epilog)")
        dy = torch.ops.aten.gelu_backward(dt, formulas.promoted(pre, p), approximate="tanh")
    elif name in ("DRELU", "DRELU_BGRAD"):
        dy = torch.where(formulas.relu_mask(_relu_in, p), dt, torch.zeros((), dtype=dt.dtype, device=dt.device))
    elif name in ("DGELU", "DGELU_BGRAD"):
        g = formulas.promoted(gelu_in, p)
        dy = torch.ops.aten.gelu_backward(dt, g, approximate="tanh")
        if dgelu is not None:
            t = formulas.product(a, b, alpha=alpha)[0]
            if c is not None:
                t = t + beta * c
            t = formulas.promoted(t.broadcast_to(y.shape), p)
            dy = dy + t * formulas.gelu_second(g) * formulas.promoted(dgelu, p)
    else:
        dy = dt
    a_p = a.unsqueeze(0) if p.a_vector else a
    b_p = b.unsqueeze(-1) if p.b_vector else b
    tangents = []
    for out_name, shape in zip(ctx.names, ctx.out_shapes):
        if out_name == "result":
            t = formulas.squeezed(dy, p)
        elif out_name == "gelu_aux":
            t = formulas.squeezed(dt, p)
        elif out_name in ("drelu_bgrad", "dgelu_bgrad"):
            t = dy.sum(-2) if p.options.bgrad_axis == "n" else dy.sum(-1, keepdim=True)
        elif out_name == "bgrada":
            t = torch.zeros_like(a_p).sum(-1) if da is None else (da.unsqueeze(0) if p.a_vector else da).sum(-1)
        elif out_name == "bgradb":
            t = torch.zeros_like(b_p).sum(-2) if db is None else (db.unsqueeze(-1) if p.b_vector else db).sum(-2)
        else:  # the ReLU mask (not differentiable), result_amax (FP8: no derivatives)
            tangents.append(None)
            continue
        tangents.append(t.reshape(shape).to(y.dtype))
    return tangents


def fft_setup(ctx, inputs, output):
    formulas.fft_setup(ctx, inputs, output)
    ctx.arguments = tuple(inputs[1:])


def _fft_jvp(ctx, dx, *_):
    return torch_func.call("fft", dx, *ctx.arguments)


def convolve_setup(ctx, inputs, output):
    formulas.convolve_setup(ctx, inputs, output)
    x, h, n, axis = inputs
    ctx.save_for_backward(x, h)  # the same tensors for the backward formula and the jvp (both read saved_tensors)
    ctx.save_for_forward(x, h)
    ctx.arguments, ctx.y_dtype = (n, axis), output.dtype


def _convolve_jvp(ctx, dx, dh, *_):
    x, h = ctx.saved_tensors
    dy = None
    if dx is not None:
        dy = torch_func.call("convolve", dx, h, *ctx.arguments)
    if dh is not None:
        dy = _sum(dy, torch_func.call("convolve", x, dh, *ctx.arguments))
    return dy.to(ctx.y_dtype)


def install(matmul_layout) -> None:
    """Build the operators' Functions for transforms (:func:`.torch_func.install`) with these formulas."""
    torch_func.install("matmul", matmul_setup(formulas.matmul_setup(matmul_layout)), formulas.matmul_backward,
                       _matmul_jvp, many=True)  # fmt: skip
    torch_func.install("fft", fft_setup, formulas.fft_backward, _fft_jvp, many=False)
    torch_func.install("convolve", convolve_setup, formulas.convolve_backward, _convolve_jvp, many=False)
