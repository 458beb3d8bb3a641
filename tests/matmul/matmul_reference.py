"""Shared helpers of the matmul tests: building operands in either framework and the float64 reference."""

from __future__ import annotations

import numpy as np

from nvdispatch._epilog import reference, spec_of

#: (rtol, atol) per result dtype; operands are small integers, so most products are exact
TOLERANCE = {
    "float16": (2e-3, 2e-3),
    "bfloat16": (1.6e-2, 1.6e-2),
    "float32": (1e-5, 1e-5),
    "float64": (1e-12, 1e-12),
    "complex64": (1e-5, 1e-5),
    "complex128": (1e-12, 1e-12),
}


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
    spec = spec_of(epilog)
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
    out, aux = reference(spec, d, ref_inputs, a=pa, b=pb, bgrad_axis=bgrad_axis)
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
