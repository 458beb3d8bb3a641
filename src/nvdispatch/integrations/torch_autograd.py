"""Backward formulas of the ``nvdispatch::`` operators, written with the operators themselves (so a compiled
backward graph runs nvdispatch's GEMMs and transforms too).

``nvdispatch::matmul``: with ``t = alpha * a @ b + beta * c (+ bias)`` and ``y = epilog(t)``, the gradient ``gt``
of ``t`` comes from the saved forward outputs — ``y > 0`` for the ReLU family (Torch's ``threshold_backward``,
as Torch's own ReLU), the pre-activation for the GELU family (the operator keeps it: a GELU/GELU_BIAS call that
autograd records runs as GELU_AUX/GELU_AUX_BIAS), the mask or ``gelu_aux`` input for DRELU/DGELU — then:

* ``gb = conj(alpha) * a^H @ gt``, and the bias gradient (bias along N) fused into that product: one call with
  the **BGRADB** epilog (``b`` of cuBLASLt's product summed over K is ``gt`` summed over rows), the weight
  gradient and the bias gradient from one GEMM; where ``b`` is a transposed view (``w.mT`` of a
  ``torch.nn.Linear``-style ``(out, in)`` weight), ``gb^T = gt^T @ a`` instead, with **BGRADA** (``gt^T`` summed
  over K), so the gradient reaches ``w`` in its own layout, with no transposing copy;
* ``ga = conj(alpha) * gt @ b^H``, with the bias gradient of a bias along M fused into it (**BGRADA**);
* ``gc = conj(beta) * gt`` reduced to ``c``'s shape; aux outputs' own gradients added where they are
  differentiable (``gelu_aux``, bias gradients, operand sums).

Why not DRELU/DGELU in a backward GEMM: they multiply a GEMM's *result* by the activation's derivative, and the
one GEMM whose result is ``dy`` (the upstream gradient) belongs to the next layer's backward, i.e. to another
operator call; inside one call's backward ``dy`` is given, so its activation derivative is one elementwise pass
(fused by inductor into its neighbours under ``torch.compile``). DRELU_BGRAD/DGELU_BGRAD fuse it across two
layers: see ``nvdispatch.integrations.torch_mlp``.

``nvdispatch::fft``: the adjoint transforms, Torch's conventions for real and complex tensors (those of
``torch.fft``'s own formulas): the inverse direction with the dual norm (backward <-> forward, ortho), the
adjoint of zero-padding (trimming) and of trimming (zero-padding), zero-filled missing half of a one-sided
spectrum for r2c transforms, and the doubled non-self-conjugate terms for c2r ones; ``hfft``/``ihfft`` through
their ``irfft``/``rfft`` forms (``hfft(x, n, norm) = irfft(conj(x), n, dual norm)``).

``nvdispatch::convolve``: ``y = inverse(forward(x) * h)`` differentiated by the same rules (the gradient of ``x``
is a convolution of the upstream gradient with ``conj(h)``).
"""

from __future__ import annotations

from typing import Any

import torch

from .._epilog import GELU_C, GELU_K
from .._fft_problem import FUNCS
from .torch_arguments import decode
from .torch_func import call

__all__ = ["register", "matmul_context", "matmul_grads"]

_DUAL = {"backward": "forward", "forward": "backward", "ortho": "ortho"}


def product(x, y, epilog: str = "DEFAULT", alpha: Any = 1):
    """``x @ y`` through ``nvdispatch::matmul`` (a list: the result, then the epilog's aux output); under a
    ``torch.func`` transform through its Function (:mod:`.torch_func`), so that transforms compose."""
    return call("matmul", x, y, None, None, None, None, None, None, None, None, alpha, None, epilog, "", "", "")


def _fft(x, func: str, s, axes, norm: str):
    return call("fft", x, func, None, -1, list(s), list(axes), norm)


def _conj(value):
    return value.conjugate() if isinstance(value, complex) else value


# -- matmul -----------------------------------------------------------------------------------------------------
def _column_major(t) -> bool:
    """Whether 2-D ``t`` is stored column by column (the transposed view of a row-major matrix)."""
    return t.dim() == 2 and t.shape[0] > 1 and t.shape[1] > 1 and t.stride(0) == 1 and t.stride(1) >= t.shape[0]


def promoted(t, p):
    """A result-shaped tensor in the promoted ``(..., m, n)`` shape (PEP 465's added axes back)."""
    if p.a_vector and p.b_vector:
        return t[..., None, None]
    if p.a_vector:
        return t.unsqueeze(-2)
    if p.b_vector:
        return t.unsqueeze(-1)
    return t


def squeezed(t, p):
    return p.squeeze(t)


def _reduce_to(t, shape):
    """``t`` summed over the dimensions it was broadcast along from ``shape``."""
    shape = tuple(shape)
    if len(shape) == t.dim():
        # traced, the sizes are not compared (sum_to_size returns t where they are equal): each comparison would
        # add a guard relating two unrelated symbolic sizes, and recompile where they happen to be equal; eagerly
        # the comparison is the cheaper test
        if not torch.compiler.is_compiling() and tuple(t.shape) == shape:
            return t
        return t.sum_to_size(shape)
    return t.sum_to_size((1,) * (t.dim() - len(shape)) + shape).reshape(shape)


def relu_mask(aux, p):
    """A relu mask input (boolean of the result's shape, or cuBLASLt's bits) as a boolean ``(..., m, n)``."""
    if aux.dtype == torch.bool:
        return aux.reshape(*p.batch_shape, p.m, p.n)
    from .._adapters.torch import TorchDeviceOps

    ops = TorchDeviceOps()
    if aux.stride(-1) == 1 and aux.shape[-2] == p.m:  # row orientation: (..., m, ceil128(n)/8)
        return ops.unpack_mask(aux.contiguous(), p.n)
    return ops.unpack_mask(aux.transpose(-1, -2).contiguous(), p.m).transpose(-1, -2)


def gelu_second(x):
    """The second derivative of the tanh-approximated GELU at ``x``."""
    u = GELU_K * (x + GELU_C * x * x * x)
    du = GELU_K * (1 + 3 * GELU_C * x * x)
    t = torch.tanh(u)
    s = 1 - t * t
    return s * du + 0.5 * x * s * (6 * GELU_K * GELU_C * x - 2 * t * du * du)


def matmul_context(ctx, problem, specs, a, b, c, bias, alpha, beta) -> None:
    """Set what :func:`matmul_grads` reads of a matmul call on ``ctx`` (an autograd context, or any object):
    ``problem`` and the output ``specs`` (from the layout), the operands' shapes and dtypes, the scalars."""
    ctx.problem, ctx.names = problem, tuple(s.name for s in specs)
    ctx.alpha, ctx.beta = alpha, (1 if beta is None else beta)
    ctx.shapes = {"c": None if c is None else tuple(c.shape), "bias": None if bias is None else tuple(bias.shape)}
    ctx.dtypes = {
        "a": a.dtype,
        "b": b.dtype,
        "c": None if c is None else c.dtype,
        "bias": None if bias is None else bias.dtype,
    }


def matmul_setup(layout):
    def setup_context(ctx, inputs, output):
        a, b, c, bias, relu_aux, gelu_aux, sa, sb, sc, sd, alpha, beta, epilog, options, preferences, hs = inputs
        named = {k: v for k, v in (("bias", bias), ("relu_aux", relu_aux), ("gelu_aux", gelu_aux)) if v is not None}
        p, specs = layout(a, b, c, named, alpha, beta, epilog, decode(options), decode(preferences), None)
        matmul_context(ctx, p, specs, a, b, c, bias, alpha, beta)
        pre = output[ctx.names.index("gelu_aux")] if "gelu_aux" in ctx.names else None
        ctx.save_for_backward(a, b, c, output[0], pre, relu_aux, gelu_aux)

    return setup_context


def matmul_backward(ctx, grads):
    a, b, c, bias, gelu_in = matmul_grads(ctx, ctx.saved_tensors, grads, ctx.needs_input_grad[:6])
    return (a, b, c, bias, None, gelu_in, *([None] * 10))


def matmul_grads(ctx, saved, grads, needs):
    """The gradients ``(a, b, c, bias, gelu_aux)`` (None where not needed) of a matmul operator call: ``ctx``
    holds the call's ``problem``, output ``names``, ``alpha``, ``beta``, ``shapes`` and ``dtypes`` (see
    :func:`matmul_context`), ``saved`` its tensors ``(a, b, c, result, pre-activation, relu_aux input, gelu_aux
    input)``, ``grads`` those of its outputs, ``needs`` whether each of ``a, b, c, bias, relu_aux, gelu_aux``
    needs one."""
    p = ctx.problem
    a, b, c, y, pre, relu_in, gelu_in = saved
    name = p.epilog.epilog.name
    need = dict(zip(("a", "b", "c", "bias", "relu_aux", "gelu_aux"), needs))
    named = dict(zip(ctx.names, grads))
    gy = named["result"]
    gy = torch.zeros_like(y) if gy is None else gy
    gy = promoted(gy, p)
    # the gradient of the bias-gradient outputs of DRELU_BGRAD/DGELU_BGRAD flows back into the result
    gbg = next((named[k] for k in ("drelu_bgrad", "dgelu_bgrad") if named.get(k) is not None), None)
    if gbg is not None:
        gy = gy + (gbg.unsqueeze(-2) if p.options.bgrad_axis == "n" else gbg)
    gelu_in_grad = None
    if p.epilog.activation == "relu" and not p.epilog.backward:
        gt = torch.ops.aten.threshold_backward(gy, promoted(y, p), 0)
    elif p.epilog.activation == "gelu" and not p.epilog.backward:
        gt = torch.ops.aten.gelu_backward(gy, promoted(pre, p), approximate="tanh")
        if named.get("gelu_aux") is not None:
            gt = gt + promoted(named["gelu_aux"], p)
    elif name in ("DRELU", "DRELU_BGRAD"):
        gt = torch.where(relu_mask(relu_in, p), gy, torch.zeros((), dtype=gy.dtype, device=gy.device))
    elif name in ("DGELU", "DGELU_BGRAD"):
        g_aux = promoted(gelu_in, p)
        gt = torch.ops.aten.gelu_backward(gy, g_aux, approximate="tanh")
        if need["gelu_aux"]:
            z = product(a, b, alpha=ctx.alpha)[0]
            z = promoted(z, p)
            if c is not None:
                z = z + ctx.beta * c.broadcast_to(p.result_shape).reshape(z.shape)
            gelu_in_grad = squeezed(gy * z * gelu_second(g_aux), p).to(gelu_in.dtype)
    else:
        gt = gy
    alpha = _conj(ctx.alpha)
    a_p = a.unsqueeze(0) if p.a_vector else a
    b_p = b.unsqueeze(-1) if p.b_vector else b
    grad = dict.fromkeys(("a", "b", "c", "bias"))
    bias_shape = ctx.shapes["bias"]
    bias_n = bias_shape is not None and p.bias_axis == "n" and all(d == 1 for d in bias_shape[:-1])
    bias_m = bias_shape is not None and p.bias_axis == "m" and all(d == 1 for d in bias_shape[:-2])
    real = not gt.is_complex()
    if need["b"]:
        if b_p.dim() == 2 and real:
            a2, g2 = a_p.flatten(0, -2), gt.flatten(0, -2)  # not reshape(-1, k): k may be 0
            if _column_major(b_p):  # b a transposed view (a Linear weight's W^T): its gradient in that layout
                got = product(g2.mT, a2, "BGRADA" if need["bias"] and bias_n else "DEFAULT", alpha)
                gb = got[0].mT
                if need["bias"] and bias_n:  # the sums of g^T along K, g's column sums
                    grad["bias"] = got[1].reshape(bias_shape)
            elif need["bias"] and bias_n:  # weight and bias gradient from one GEMM
                gb, bg = product(a2.mT, g2, "BGRADB", alpha)
                grad["bias"] = bg.reshape(bias_shape)
            else:
                gb = product(a2.mT, g2, alpha=alpha)[0]
        else:
            gb = _reduce_to(product(a_p.mH, gt, alpha=alpha)[0], b_p.shape)
        grad["b"] = gb.reshape(b.shape)
    if need["a"]:
        if need["bias"] and bias_m and gt.dim() == 2 and real:  # input and bias gradient from one GEMM
            ga, bg = product(gt, b_p.mH, "BGRADA", alpha)
            grad["bias"] = bg.reshape(bias_shape)
        else:
            ga = product(gt, b_p.mH, alpha=alpha)[0]
        grad["a"] = _reduce_to(ga, a_p.shape).reshape(a.shape)
    if need["bias"] and grad["bias"] is None:
        shape = (1, bias_shape[0]) if len(bias_shape) == 1 else bias_shape
        grad["bias"] = _reduce_to(gt, shape).reshape(bias_shape)
    if need["c"]:
        grad["c"] = _reduce_to(squeezed(gt, p) * _conj(ctx.beta), ctx.shapes["c"])
    if named.get("bgrada") is not None and need["a"]:
        extra = named["bgrada"].unsqueeze(-1)
        grad["a"] = grad["a"] + (extra.reshape(-1) if p.a_vector else extra)
    if named.get("bgradb") is not None and need["b"]:
        extra = named["bgradb"].unsqueeze(-2)
        grad["b"] = grad["b"] + (extra.reshape(-1) if p.b_vector else extra)
    out = [None if grad[k] is None else grad[k].to(ctx.dtypes[k]) for k in ("a", "b", "c", "bias")]
    return (*out, gelu_in_grad)


# -- fft ----------------------------------------------------------------------------------------------------------
def _resize_back(g, shape, axes, lengths):
    """The adjoint of resizing an input of ``shape`` to ``lengths`` along ``axes``: trim what was zero-padded,
    zero-pad what was trimmed."""
    for ax, length in zip(axes, lengths):
        size = shape[ax]
        if length > size:
            g = g.narrow(ax, 0, size)
        elif length < size:
            pad = [0, 0] * (g.dim() - 1 - ax) + [0, size - length]
            g = torch.nn.functional.pad(g, pad)
    return g


def _pad_last(g, axis: int, length: int):
    """A one-sided spectrum zero-filled to the full ``length`` along ``axis``."""
    missing = length - g.shape[axis]
    if missing <= 0:
        return g
    return torch.nn.functional.pad(g, [0, 0] * (g.dim() - 1 - axis) + [0, missing])


def _doubled(g, axis: int, length: int):
    """``g`` with the terms of a one-sided spectrum that stand for two (their mirror image is not kept) doubled."""
    twice = length - g.shape[axis]  # terms 1 .. length - (length // 2 + 1)
    if twice <= 0:
        return g
    idx = torch.arange(g.shape[axis], device=g.device)
    weight = torch.where((idx >= 1) & (idx <= twice), 2.0, 1.0).to(g.real.dtype if g.is_complex() else g.dtype)
    return g * weight.reshape([-1] + [1] * (g.dim() - 1 - axis))


def _c2r_adjoint(g, axes, lengths, norm):
    """The adjoint of a c2r (``irfftn``) transform with ``norm``: an r2c transform with the dual norm, doubled."""
    return _doubled(_fft(g, "rfftn", lengths, axes, _DUAL[norm]), axes[-1], lengths[-1])


def _r2c_adjoint(g, axes, lengths, norm):
    """The adjoint of an r2c (``rfftn``) transform with ``norm``: the full spectrum's inverse, real part."""
    return torch.real(_fft(_pad_last(g, axes[-1], lengths[-1]), "ifftn", lengths, axes, _DUAL[norm]))


def fft_setup(ctx, inputs, output):
    from .torch_layouts import fft_problem

    x, func, n, axis, s, axes, norm = inputs
    p = fft_problem(func, x, n, axis, s, axes, norm)
    ctx.problem, ctx.x_dtype, ctx.x_shape = p, x.dtype, tuple(x.shape)


def fft_backward(ctx, g):
    p = ctx.problem
    kind, direction, _ = FUNCS[p.func]
    axes, lengths, norm = p.axes, p.lengths, p.norm
    if kind == "c2c":
        gx = _fft(g, "ifftn" if direction == "forward" else "fftn", lengths, axes, _DUAL[norm])
        gx = _resize_back(gx, ctx.x_shape, axes, lengths)
    elif p.func == "ihfft":  # conj(rfft(x, n, dual norm))
        gx = _r2c_adjoint(g.conj().resolve_conj(), axes, lengths, _DUAL[norm])
        gx = _resize_back(gx, ctx.x_shape, axes, lengths)
    elif kind == "r2c":
        gx = _resize_back(_r2c_adjoint(g, axes, lengths, norm), ctx.x_shape, axes, lengths)
    else:
        if p.func == "hfft":  # irfft(conj(x), n, dual norm)
            gx = _c2r_adjoint(g, axes, lengths, _DUAL[norm]).conj().resolve_conj()
        else:
            gx = _c2r_adjoint(g, axes, lengths, norm)
        gx = _resize_back(gx, ctx.x_shape, axes, p.in_lengths)
    if not ctx.x_dtype.is_complex and gx.is_complex():
        gx = torch.real(gx)
    return gx.to(ctx.x_dtype), None, None, None, None, None, None


# -- convolve -------------------------------------------------------------------------------------------------
def convolve_setup(ctx, inputs, output):
    from .torch_layouts import convolve_problem

    x, h, n, axis = inputs
    ctx.problem = convolve_problem(x, h, n, axis)
    ctx.x_dtype, ctx.h_dtype, ctx.x_shape, ctx.h_shape = x.dtype, h.dtype, tuple(x.shape), tuple(h.shape)
    ctx.save_for_backward(x if ctx.needs_input_grad[1] else None, h)


def convolve_backward(ctx, g):
    p = ctx.problem
    x, h = ctx.saved_tensors
    fwd = p.forward
    axes, lengths = fwd.axes, fwd.lengths
    real = fwd.kind == "r2c"
    gz = _c2r_adjoint(g, axes, lengths, "backward") if real else _fft(g, "fftn", lengths, axes, "forward")
    spectrum = getattr(torch, fwd.result_dtype)
    gx = gh = None
    if ctx.needs_input_grad[0]:
        gxh = (gz * h.conj().resolve_conj()).to(spectrum)
        if real:
            gx = _r2c_adjoint(gxh, axes, lengths, "backward")
        else:
            gx = _fft(gxh, "ifftn", lengths, axes, "forward")
        gx = _resize_back(gx, ctx.x_shape, axes, lengths).to(ctx.x_dtype)
    if ctx.needs_input_grad[1]:
        xh = _fft(x, "rfftn" if real else "fftn", lengths, axes, "backward")
        gh = _reduce_to(gz * xh.conj().resolve_conj(), ctx.h_shape)
        if not ctx.h_dtype.is_complex:
            gh = torch.real(gh)
        gh = gh.to(ctx.h_dtype)
    return gx, gh, None, None


def _function(name: str, kernel, setup_context, backward, many: bool):
    """An autograd Function running ``kernel`` with the operator's formula (``many``: a list of outputs). Its
    forward takes ``ctx`` (no separate ``setup_context``: ``Function.apply`` would bind every call's arguments to
    the forward's signature with ``inspect``, costing more than the rest of the call)."""

    def forward(ctx, *args):
        out = kernel(*args)
        setup_context(ctx, args, out)
        return tuple(out) if many else out

    def backward_(ctx, *grads):
        return backward(ctx, list(grads) if many else grads[0])

    body = {"forward": staticmethod(forward), "backward": staticmethod(backward_)}
    return type(f"nvdispatch_{name}", (torch.autograd.Function,), body)


def register(lib, kernels: dict, matmul_layout) -> dict[str, type]:
    """Register the formulas on the operators of ``lib`` (``kernels``: name -> real kernel; ``matmul_layout(a, b,
    c, inputs, alpha, beta, epilog, options, preferences, scales)`` gives a matmul call's problem and output
    specs); returns, per operator, an autograd Function running its real kernel with the same formula."""
    formulas = {
        "matmul": (matmul_setup(matmul_layout), matmul_backward, True),
        "fft": (fft_setup, fft_backward, False),
        "convolve": (convolve_setup, convolve_backward, False),
    }
    functions = {}
    for name, (setup, backward, many) in formulas.items():
        torch.library.register_autograd(f"nvdispatch::{name}", backward, setup_context=setup, lib=lib)
        functions[name] = _function(name, kernels[name], setup, backward, many)
    return functions
