"""The MLP training step written by hand (benchmarks/_mlp_by_hand.py, issue #31's "step written by hand on the
fused epilogs", timed by compiled_mlp_bench.py): eagerly and compiled with fullgraph=True, both versions (the
nvdispatch epilogs and plain Torch ops) leave in ``.grad`` the gradients a float64 NumPy backward gives."""

from __future__ import annotations

import math
import pathlib
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "benchmarks"))
import _mlp_by_hand  # noqa: E402

from nvdispatch.integrations.torch_mlp import FusedMLP  # noqa: E402

C = math.sqrt(2 / math.pi)


def _act(z, activation):
    if activation == "relu":
        return np.maximum(z, 0)
    return 0.5 * z * (1 + np.tanh(C * (z + 0.044715 * z**3)))


def _act_grad(z, activation):
    if activation == "relu":
        return (z > 0).astype(z.dtype)
    t = np.tanh(C * (z + 0.044715 * z**3))
    return 0.5 * (1 + t) + 0.5 * z * (1 - t**2) * C * (1 + 3 * 0.044715 * z**2)


def _oracle(x, weights, biases, activation):
    """(loss, weight gradients, bias gradients) of ``mean(mlp(x)²)`` in float64 NumPy, Linear's (out, in) weights."""
    hs, zs, h = [x], [], x
    for i, (w, b) in enumerate(zip(weights, biases)):
        z = h @ w.T + b
        zs.append(z)
        h = z if i == len(weights) - 1 else _act(z, activation)
        if i < len(weights) - 1:
            hs.append(h)
    g = 2 * h / h.size
    dws, dbs = [None] * len(weights), [None] * len(weights)
    for i in range(len(weights) - 1, -1, -1):
        dws[i], dbs[i] = g.T @ hs[i], g.sum(0)
        if i:
            g = (g @ weights[i]) * _act_grad(zs[i - 1], activation)
    return float(np.mean(h**2)), dws, dbs


@pytest.mark.parametrize("mode", [None, "default"], ids=["eager", "compiled"])
@pytest.mark.parametrize("which", _mlp_by_hand.VERSIONS)
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_step_by_hand_gives_the_oracle_gradients(activation, which, mode):
    torch.manual_seed(0)
    model = FusedMLP([24, 40, 40, 40, 8], activation=activation)
    x = torch.randn(32, 24)
    weights = [w.detach().double().numpy() for w in model.weights]
    biases = [b.detach().double().numpy() for b in model.biases]
    before = [p.detach().clone() for p in model.parameters()]
    x_before = x.clone()
    loss_ref, dws, dbs = _oracle(x.double().numpy(), weights, biases, activation)
    step = _mlp_by_hand.make_step(torch, model, which, mode)
    for _ in range(2):  # the second step runs the compiled program as cached, its gradients replacing the first's
        loss = step(x)
    assert float(loss) == pytest.approx(loss_ref, rel=1e-5)
    for w, dw in zip(model.weights, dws):
        np.testing.assert_allclose(w.grad.double().numpy(), dw, rtol=1e-4, atol=1e-6)
    for b, db in zip(model.biases, dbs):
        np.testing.assert_allclose(b.grad.double().numpy(), db, rtol=1e-4, atol=1e-6)
    for p, q in zip(model.parameters(), before):  # the step reads the parameters, never writes them
        assert torch.equal(p.detach(), q)
    assert torch.equal(x, x_before)


def test_unknown_version_is_refused():
    with pytest.raises(ValueError, match="which"):
        _mlp_by_hand.make_step(torch, FusedMLP([4, 4]), "jax", None)
