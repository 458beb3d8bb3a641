"""A float64 NumPy oracle of a plain MLP and its gradients, backpropagated by hand (nothing of nvdispatch or of
JAX's differentiation), and the checks the CPU and GPU tests of ``jax_mlp.fused_mlp`` share: values against it,
and which GEMMs a traced training step stages."""

from __future__ import annotations

import numpy as np
from matmul_reference import gelu, gelu_grad


def act(z: np.ndarray, activation: str) -> np.ndarray:
    return np.maximum(z, 0) if activation == "relu" else gelu(z)


def act_grad(z: np.ndarray, activation: str) -> np.ndarray:
    return (z > 0).astype(np.float64) if activation == "relu" else gelu_grad(z)


def f64(v) -> np.ndarray:
    return np.asarray(v).astype(np.float64)


def forward(x, ws, bs, activation: str):
    """``(y, zs, hs)``: the output, each layer's pre-activation and input, in float64 — each layer's output (and
    pre-activation) rounded once to ``x``'s dtype, as a model storing its activations in that dtype does (so that a
    ReLU mask of bfloat16 activations is the model's)."""
    dtype = np.asarray(x).dtype

    def stored(v):
        return v.astype(dtype).astype(np.float64)

    h = f64(x).reshape(-1, np.shape(x)[-1])
    zs, hs = [], []
    for i, (w, b) in enumerate(zip(ws, bs)):
        hs.append(h)
        z = h @ f64(w) + f64(b)
        zs.append(stored(z))
        h = z if i == len(ws) - 1 else stored(act(z, activation))
    return h.reshape(*np.shape(x)[:-1], h.shape[-1]), zs, hs


def gradients(x, ws, bs, activation: str, gy):
    """``(dx, dws, dbs)`` of ``sum(y * gy)``."""
    _, zs, hs = forward(x, ws, bs, activation)
    dz = f64(gy).reshape(-1, np.shape(gy)[-1])
    dws, dbs = [None] * len(ws), [None] * len(ws)
    for i in reversed(range(len(ws))):
        dws[i], dbs[i] = hs[i].T @ dz, dz.sum(0)
        dh = dz @ f64(ws[i]).T
        dz = dh if i == 0 else dh * act_grad(zs[i - 1], activation)
    return dz.reshape(np.shape(x)), dws, dbs


def model(rng, widths, rows, dtype):
    """``(x, ws, bs, gy)`` as NumPy arrays of ``dtype`` (``"bfloat16"``: ml_dtypes')."""
    import jax.numpy as jnp

    dt = jnp.dtype(dtype)

    def make(shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32).astype(dt)

    rows = rows if isinstance(rows, tuple) else (rows,)
    ws = [make((a, b), 1 / np.sqrt(a)) for a, b in zip(widths[:-1], widths[1:])]
    bs = [make((b,), 0.3) for b in widths[1:]]
    return make((*rows, widths[0])), ws, bs, make((*rows, widths[-1]))


def assert_close(got, want, tol: float, what: str = "") -> None:
    """``got`` within ``tol`` of ``want`` relative to ``want``'s largest entry."""
    got = np.asarray(got).astype(np.float64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    scale = max(float(np.abs(want).max()), 1e-30)
    err = float(np.abs(got - want).max()) / scale
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol}"


def tolerance(dtype: str) -> float:
    return {"float32": 1e-4, "float64": 1e-10, "bfloat16": 4e-2, "float16": 5e-3}[dtype]


def staged_epilogs(monkeypatch, fn, *args) -> list[tuple[str, bool, bool]]:
    """``(epilog, transpose_a, transpose_b)`` of every matmul ``fn`` stages when traced."""
    import jax

    from nvdispatch.integrations import jax_matmul

    seen = []
    kernel = jax_matmul.matmul_kernel

    def counting(call, operands):
        seen.append((call.epilog, call.transpose_a, call.transpose_b))
        return kernel(call, operands)

    monkeypatch.setattr(jax_matmul, "matmul_kernel", counting)
    jax.clear_caches()
    jax.make_jaxpr(fn)(*args)
    return seen


def check_staged_gemms(monkeypatch, activation: str, relu_backward: str) -> None:
    """A 3-layer chain's gradient (of x, weights, biases) stages, per layer: its forward GEMM; backward, one
    ``BGRADB`` GEMM (``h^T`` read in place) and the GEMM of the upstream gradient with the activation's
    derivative in its epilog (``DGELU``/``DRELU``; ``DEFAULT`` where a mask follows; ``dx``'s for the first)."""
    import jax
    import jax.numpy as jnp

    from nvdispatch.integrations.jax_mlp import fused_mlp

    x, ws, bs, gy = model(np.random.default_rng(6), [8, 16, 12, 4], 10, "float32")

    def loss(x, ws, bs):
        return jnp.sum(fused_mlp(x, ws, bs, activation, relu_backward=relu_backward) * gy)

    seen = staged_epilogs(monkeypatch, jax.grad(loss, argnums=(0, 1, 2)), x, ws, bs)
    hidden = {("relu", "mask"): ("RELU_BIAS", "DEFAULT"), ("relu", "drelu"): ("RELU_AUX_BIAS", "DRELU"),
              ("gelu", "mask"): ("GELU_AUX_BIAS", "DGELU")}[activation, relu_backward]
    forward_calls = [(hidden[0], False, False)] * 2 + [("BIAS", False, False)]
    backward_layer = [("BGRADB", True, False), (hidden[1], False, True)]
    backward_calls = backward_layer * 2 + [("BGRADB", True, False), ("DEFAULT", False, True)]  # the last: dx
    # jax.custom_vjp may trace the primal (kept for undifferentiated calls, not run here) besides the forward pass
    # (it does on the CPU; on the GPU JAX reuses one trace)
    assert seen in (forward_calls + backward_calls, forward_calls + forward_calls + backward_calls), seen


def chain_loss(activation, relu_backward="mask"):
    """``sum(fused_mlp(x, ...) * gy)`` in float32: its gradient is the chain's backward for upstream ``gy``."""
    import jax.numpy as jnp

    from nvdispatch.integrations.jax_mlp import fused_mlp

    def loss(x, ws, bs, gy):
        y = fused_mlp(x, ws, bs, activation, relu_backward=relu_backward)
        return jnp.sum(y.astype(jnp.float32) * gy.astype(jnp.float32))

    return loss


def check_grads(got, x, ws, bs, activation, gy, tol, dtypes: bool = True):
    """``got`` = (dx, dws, dbs) against the oracle's; ``dtypes``: each parameter's gradient in its dtype."""
    dx, dws, dbs = gradients(x, ws, bs, activation, gy)
    assert_close(got[0], dx, tol, "dx")
    for i in range(len(ws)):
        assert_close(got[1][i], dws[i], tol, f"dw[{i}]")
        assert_close(got[2][i], dbs[i], tol, f"db[{i}]")
        if dtypes:
            assert got[1][i].dtype == ws[i].dtype and got[2][i].dtype == bs[i].dtype


def jnp_network(x, ws, bs, activation: str):
    """The same model in ``jax.numpy`` (GELU: the tanh approximation): the oracle of derivatives by JAX's own
    rules (forward mode, second order) the hand-written float64 gradients do not cover."""
    import jax
    import jax.numpy as jnp

    h = x
    for i, (w, b) in enumerate(zip(ws, bs)):
        z = jnp.dot(h, w, precision="highest") + b
        h = z if i == len(ws) - 1 else (jax.nn.relu(z) if activation == "relu" else jax.nn.gelu(z, approximate=True))
    return h
