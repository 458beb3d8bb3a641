"""Shared helpers of the matmul tests: building operands in either framework and the float64 reference.

The reference is an independent oracle: each epilog is written here as plain NumPy float64 expressions, from
cuBLASLt's documented semantics, and nothing of nvdispatch's own epilog code is imported (a test that
compares the NumPy executor with the library's own step code could never fail).

Documented choices every executor is held to (see ``nvdispatch._epilog``):

* ``relu(x) = max(x, 0)`` with NaN propagated (NaN where ``x`` is NaN), as cuBLASLt's RELU epilogue, Torch and
  NumPy's ``maximum`` give; ``relu_aux`` is ``x > 0`` (False at NaN).
* DRELU passes the upstream gradient where the mask is set and gives 0 elsewhere, whatever the gradient
  there (inf/NaN included), as Torch's relu backward.
* the bias is added after alpha and beta: ``epilog(alpha * a @ b + beta * c + bias)``.
* GELU is the tanh approximation.
"""

from __future__ import annotations

import math

import numpy as np

#: (rtol, atol) per result dtype; operands are small integers, so most products are exact
TOLERANCE = {
    "float16": (2e-3, 2e-3),
    "bfloat16": (1.6e-2, 1.6e-2),
    "float32": (1e-5, 1e-5),
    "float64": (1e-12, 1e-12),
    "complex64": (1e-5, 1e-5),
    "complex128": (1e-12, 1e-12),
}


# -- the oracle -----------------------------------------------------------------------------------------------
def relu(x: np.ndarray) -> np.ndarray:
    return np.where((x > 0) | np.isnan(x), x, 0).astype(x.dtype)


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (Hendrycks & Gimpel): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def gelu_grad(x: np.ndarray) -> np.ndarray:
    """d gelu / dx, differentiated by hand from :func:`gelu`."""
    u = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)
    du = math.sqrt(2.0 / math.pi) * (1.0 + 3 * 0.044715 * x**2)
    return 0.5 * (1.0 + np.tanh(u)) + 0.5 * x * du / np.cosh(u) ** 2


def _bias_gradient(g: np.ndarray, bgrad_axis: str) -> np.ndarray:
    return g.sum(axis=-2) if bgrad_axis == "n" else g.sum(axis=-1, keepdims=True)


def epilog_reference(name: str, d: np.ndarray, inputs: dict, a=None, b=None, bgrad_axis: str = "n"):
    """``(result, aux)`` of epilog ``name`` applied to ``d = alpha a@b + beta c`` (float64/complex128, shape
    ``(..., m, n)``; ``a``/``b`` promoted to matrices; inputs broadcast against ``d``)."""
    bias, mask, pre = inputs.get("bias"), inputs.get("relu_aux"), inputs.get("gelu_aux")
    z = d + bias if bias is not None else d
    if name in ("DEFAULT", "BIAS"):
        return z, {}
    if name in ("RELU", "RELU_BIAS"):
        return relu(z), {}
    if name in ("RELU_AUX", "RELU_AUX_BIAS"):
        return relu(z), {"relu_aux": z > 0}
    if name in ("GELU", "GELU_BIAS"):
        return gelu(z), {}
    if name in ("GELU_AUX", "GELU_AUX_BIAS"):
        return gelu(z), {"gelu_aux": z.copy()}
    if name in ("DRELU", "DRELU_BGRAD"):
        g = np.where(mask.astype(bool), d, 0)
        return g, ({"drelu_bgrad": _bias_gradient(g, bgrad_axis)} if name == "DRELU_BGRAD" else {})
    if name in ("DGELU", "DGELU_BGRAD"):
        g = d * gelu_grad(pre)
        return g, ({"dgelu_bgrad": _bias_gradient(g, bgrad_axis)} if name == "DGELU_BGRAD" else {})
    if name == "BGRADA":
        return d, {"bgrada": a.sum(axis=-1)}
    if name == "BGRADB":
        return d, {"bgradb": b.sum(axis=-2)}
    raise AssertionError(f"no reference for epilog {name}")


# -- operands -------------------------------------------------------------------------------------------------
def to_numpy(x) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    import torch

    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.dtype == torch.bfloat16:
            x = x.float()
        return x.numpy()
    return np.asarray(x)


def dtype_name(x) -> str:
    return str(x.dtype).removeprefix("torch.")


def expected(a, b, c, alpha, beta, epilog, inputs, bgrad_axis="n"):
    """The float64 (complex128) reference of ``epilog(alpha a@b + beta c)`` for operands of any framework."""
    epilog_name = epilog.name if hasattr(epilog, "name") else ("DEFAULT" if epilog is None else str(epilog).upper())
    na, nb = to_numpy(a), to_numpy(b)
    wide = np.complex128 if np.iscomplexobj(na) or np.iscomplexobj(nb) else np.float64
    pa = (na[None, :] if na.ndim == 1 else na).astype(wide)
    pb = (nb[:, None] if nb.ndim == 1 else nb).astype(wide)
    d = alpha * np.matmul(pa, pb)
    result_shape = np.matmul(na.astype(wide), nb.astype(wide)).shape
    if c is not None:
        d = d + (1 if beta is None else beta) * np.broadcast_to(to_numpy(c).astype(wide), result_shape).reshape(d.shape)
    ref_inputs = {}
    for name, value in (inputs or {}).items():
        v = to_numpy(value)
        if name == "bias":
            v = v.astype(wide)
            ref_inputs[name] = v.reshape(1, -1) if v.ndim == 1 else v
        elif name == "gelu_aux":
            ref_inputs[name] = v.astype(wide).reshape(d.shape)
        else:
            ref_inputs[name] = v.reshape(d.shape)
    out, aux = epilog_reference(epilog_name, d, ref_inputs, a=pa, b=pb, bgrad_axis=bgrad_axis)
    out = out.reshape(result_shape)
    for name in ("relu_aux", "gelu_aux"):
        if name in aux:
            aux[name] = aux[name].reshape(result_shape)
    return out, aux


def assert_close(got, want, dtype: str, what: str = "result", scale: float = 1.0):
    got = to_numpy(got)
    if dtype in TOLERANCE:
        rtol, atol = TOLERANCE[dtype]
        np.testing.assert_allclose(
            got.astype(np.complex128 if np.iscomplexobj(got) else np.float64),
            want,
            rtol=rtol * scale,
            atol=atol * scale * max(1.0, float(np.max(np.abs(want), initial=0.0))),
            err_msg=what,
        )
    else:  # integers and booleans: exact
        np.testing.assert_array_equal(got, want.astype(got.dtype) if got.dtype != bool else want, err_msg=what)


def assert_relu_mask(got, a, b, c, alpha, beta, epilog, inputs, bgrad_axis="n"):
    """``relu_aux`` as a boolean mask against ``x > 0`` of the float64 pre-activation ``x``, except where ``x`` is
    exactly zero: cuBLASLt's bit is set there and the CPU executors' mask is not (both subgradients of ReLU at
    0; ``nvdispatch._epilog`` documents the difference), so either is accepted at those elements only."""
    name = epilog.name if hasattr(epilog, "name") else str(epilog).upper()
    linear = "BIAS" if "BIAS" in name else "DEFAULT"
    pre, _ = expected(a, b, c, alpha, beta, linear, {k: v for k, v in (inputs or {}).items() if k == "bias"}, bgrad_axis)
    got = np.asarray(got)
    assert got.shape == pre.shape and got.dtype == bool, (got.shape, got.dtype, pre.shape)
    np.testing.assert_array_equal(np.where(pre == 0, False, got), pre > 0, err_msg="relu_aux")


def assert_engine_matches_oracle(make_plan, data, dtype, epilog, m, k, n, a_order, b_order, scale: float = 1.0):
    """A NumPy-executor engine's plan (``make_plan(a, b, **matmul keywords)``) against :func:`expected`: its
    ``execute`` and, where it has one and no ``c`` is given, its direct call; ``epilog`` DEFAULT with alpha and
    beta * c; the inputs unmodified. ``data(shape, dtype, seed, order)`` makes the operands. Returns ``execute``'s
    result."""
    a, b = data((m, k), dtype, 1, a_order), data((k, n), dtype, 2, b_order)
    bias = data((n,), dtype, 3) if "BIAS" in epilog.name else None
    kw = {"epilog": epilog, "epilog_inputs": None if bias is None else {"bias": bias}}
    ops = {"a": a, "b": b, "alpha": 1, "beta": None}
    if bias is not None:
        ops["bias"] = bias
    c = beta = None
    alpha = 1
    if epilog.name == "DEFAULT":  # alpha and beta * c: through the engine's own route for them
        c, alpha, beta = data((m, n), dtype, 4), 0.5, 2.0
        kw.update(c=c, alpha=alpha, beta=beta)
        ops.update(c=c, alpha=alpha, beta=beta)
    inputs = [x for x in (a, b, c, bias) if x is not None]
    before = [x.copy() for x in inputs]
    plan = make_plan(a, b, **kw)
    want, _ = expected(a, b, c, alpha, beta, epilog, None if bias is None else {"bias": bias})
    got = plan.execute(ops)
    assert got.dtype == np.dtype(dtype) and got.shape == (m, n)
    assert_close(got, want, dtype, scale=scale)
    if plan.direct is not None and c is None:
        assert_close(plan.direct(a, b, *(() if bias is None else (bias,))), want, dtype, scale=scale)
    for x, was in zip(inputs, before):
        np.testing.assert_array_equal(x, was)  # inputs never modified
    return got
