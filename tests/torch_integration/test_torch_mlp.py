"""FusedMLP: every GEMM of its forward and backward pass one fused nvdispatch call; its output and the gradients of
its input, weights and biases are those of the same model written with Torch's linear layers (float64 reference),
eagerly and compiled."""

from __future__ import annotations

import pytest

from nvdispatch.errors import InvalidArgumentError

torch = pytest.importorskip("torch")

from nvdispatch.integrations.torch_mlp import FusedMLP, fused_mlp  # noqa: E402


def _reference(mlp, x):
    ws = [w.detach().double().requires_grad_() for w in mlp.weights]
    bs = [b.detach().double().requires_grad_() for b in mlp.biases]
    x = x.detach().double().requires_grad_()
    h = x
    for i, (w, b) in enumerate(zip(ws, bs)):
        h = torch.nn.functional.linear(h, w.T, b)
        if i < len(ws) - 1:
            h = torch.relu(h) if mlp.activation == "relu" else torch.nn.functional.gelu(h, approximate="tanh")
    return h, x, ws, bs


@pytest.mark.parametrize("mode", ["eager", "compiled"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("shape", [(16,), (2, 8)], ids=["rows", "batched"])
def test_fused_mlp_matches_torch_linear_layers(activation, mode, shape):
    torch.manual_seed(0)
    mlp = FusedMLP([6, 12, 10, 3], activation=activation, dtype=torch.float64)
    x = torch.randn(*shape, 6, dtype=torch.float64, requires_grad=True)
    fn = mlp if mode == "eager" else torch.compile(mlp, backend="aot_eager", fullgraph=True)
    out = fn(x)
    weight = torch.randn(out.shape, dtype=torch.float64)
    (out * weight).sum().backward()
    want, xr, ws, bs = _reference(mlp, x)
    (want * weight).sum().backward()
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(x.grad, xr.grad)
    for got, ref in zip([*mlp.weights, *mlp.biases], [*ws, *bs]):
        torch.testing.assert_close(got.grad, ref.grad)


def test_bad_arguments_are_typed_errors():
    with pytest.raises(InvalidArgumentError, match="activation"):
        FusedMLP([4, 4], activation="tanh")
    with pytest.raises(InvalidArgumentError, match="widths"):
        FusedMLP([4])
    with pytest.raises(InvalidArgumentError, match="biases"):
        fused_mlp(torch.ones(2, 4), [torch.ones(4, 4)], [])
