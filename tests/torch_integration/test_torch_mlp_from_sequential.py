"""FusedMLP.from_sequential: an existing Linear/activation stack becomes a FusedMLP over its own parameters."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from nvdispatch.errors import InvalidArgumentError, ShapeMismatchError  # noqa: E402
from nvdispatch.integrations.torch_mlp import FusedMLP  # noqa: E402

nn = torch.nn


def _stack(act, widths=(6, 10, 7, 3)):
    torch.manual_seed(0)
    mods = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        if i:
            mods.append(act())
        mods.append(nn.Linear(a, b, dtype=torch.float64))
    return nn.Sequential(*mods)


def _numpy_forward(seq, x, activation):
    h = x
    linears = [m for m in seq if isinstance(m, nn.Linear)]
    for i, lin in enumerate(linears):
        h = h @ lin.weight.detach().numpy().T + lin.bias.detach().numpy()
        if i < len(linears) - 1:
            if activation == "relu":
                h = np.maximum(h, 0)
            else:
                h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))
    return h


@pytest.mark.parametrize(
    "act,activation", [(nn.ReLU, "relu"), (lambda: nn.ReLU(inplace=True), "relu"),
                       (lambda: nn.GELU(approximate="tanh"), "gelu")]
)  # fmt: skip
def test_values_and_gradients_are_the_stacks(act, activation):
    seq = _stack(act)
    mlp = FusedMLP.from_sequential(seq)
    assert mlp.activation == activation
    x = np.random.default_rng(1).standard_normal((9, 6))
    got = mlp(torch.from_numpy(x))
    np.testing.assert_allclose(got.detach().numpy(), _numpy_forward(seq, x, activation), rtol=1e-10, atol=1e-12)

    got.square().mean().backward()
    fused_grads = [p.grad.clone() for p in seq.parameters()]
    for p in seq.parameters():
        p.grad = None
    seq(torch.from_numpy(x)).square().mean().backward()  # Torch's own ops, float64
    for g, want in zip(fused_grads, (p.grad for p in seq.parameters())):
        np.testing.assert_allclose(g.numpy(), want.numpy(), rtol=1e-9, atol=1e-12)


def test_the_model_holds_the_layers_own_parameters():
    seq = _stack(nn.ReLU)
    mlp = FusedMLP.from_sequential(seq)
    linears = [m for m in seq if isinstance(m, nn.Linear)]
    assert all(w is lin.weight for w, lin in zip(mlp.weights, linears))
    assert all(b is lin.bias for b, lin in zip(mlp.biases, linears))
    assert {id(p) for p in mlp.parameters()} == {id(p) for p in seq.parameters()}
    before = linears[0].weight.detach().clone()
    opt = torch.optim.SGD(seq.parameters(), lr=0.1)  # made over the old model
    mlp(torch.randn(4, 6, dtype=torch.float64)).sum().backward()
    opt.step()
    assert not torch.equal(linears[0].weight.detach(), before)


def test_a_single_linear_and_a_list_of_modules():
    lin = nn.Linear(5, 2)
    mlp = FusedMLP.from_sequential([lin])
    x = torch.randn(3, 5)
    np.testing.assert_allclose(
        mlp(x).detach().numpy(), x.numpy() @ lin.weight.detach().numpy().T + lin.bias.detach().numpy(), rtol=1e-5,
        atol=1e-6,
    )  # fmt: skip
    assert (
        FusedMLP.from_sequential([nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 2)], relu_backward="drelu").relu_backward
        == "drelu"
    )


@pytest.mark.parametrize(
    "layers,argument,fragment",
    [
        (lambda: [], "layers", "odd number"),
        (lambda: [nn.Linear(4, 4), nn.ReLU()], "layers", "odd number"),
        (lambda: [nn.ReLU(), nn.Linear(4, 4), nn.ReLU()], "layers[0]", "torch.nn.Linear"),
        (lambda: [nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4)], "layers[1]", "Tanh"),
        (lambda: [nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 4)], "layers[1]", "tanh approximation"),
        (lambda: [nn.Linear(4, 4, bias=False), nn.ReLU(), nn.Linear(4, 4)], "layers[0]", "bias"),
        (lambda: [nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.GELU(approximate="tanh"), nn.Linear(4, 2)],
         "layers[3]", "same activation"),
    ],
)  # fmt: skip
def test_a_stack_it_cannot_compute_is_refused_naming_the_module(layers, argument, fragment):
    with pytest.raises(InvalidArgumentError) as info:
        FusedMLP.from_sequential(layers())
    assert info.value.argument == argument and fragment in str(info.value)


def test_widths_that_do_not_chain_are_refused():
    with pytest.raises(ShapeMismatchError) as info:
        FusedMLP.from_sequential([nn.Linear(4, 8), nn.ReLU(), nn.Linear(6, 2)])
    assert info.value.argument == "layers[2]" and "8 in_features" in str(info.value)
