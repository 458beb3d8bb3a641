"""FusedMLP is the ``torch.nn.Sequential(Linear, act, ..., Linear)`` it replaces: the same children, keys and
parameter order, so an optimizer's checkpoint crosses as it is; indexing, iteration, ``len`` and the Sequential's
editing methods behave as a Sequential's, and whatever the children become, the result is that of calling them in
order (the fused forward is an optimization of it). Also empty batches and zero features, against the plain model."""

from __future__ import annotations

import copy
import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from nvdispatch.errors import InvalidArgumentError, ShapeMismatchError  # noqa: E402
from nvdispatch.integrations import torch_mlp_ops  # noqa: E402
from nvdispatch.integrations.torch_mlp import FusedMLP, fused_mlp  # noqa: E402

nn = torch.nn
WIDTHS = (6, 10, 7, 3)


def _plain(activation="relu", widths=WIDTHS, dtype=torch.float64):
    mods = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        if i:
            mods.append(nn.ReLU() if activation == "relu" else nn.GELU(approximate="tanh"))
        mods.append(nn.Linear(a, b, dtype=dtype))
    return nn.Sequential(*mods)


def _numpy_forward(model, x, activation):
    """float64 NumPy oracle over ``model``'s Linear layers (``model[0]``, ``model[2]``, ...)."""
    h = np.asarray(x, dtype=np.float64)
    layers = [model[i] for i in range(0, len(model), 2)]
    for i, lin in enumerate(layers):
        h = h @ lin.weight.detach().double().numpy().T + lin.bias.detach().double().numpy()
        if i < len(layers) - 1:
            h = np.maximum(h, 0) if activation == "relu" else \
                0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))  # fmt: skip
    return h


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_the_layout_is_the_sequentials(activation):
    torch.manual_seed(3)
    plain = _plain(activation)
    torch.manual_seed(3)
    mlp = FusedMLP(WIDTHS, activation=activation, dtype=torch.float64)
    assert isinstance(mlp, nn.Sequential) and len(mlp) == len(plain) == 5
    assert [name for name, _ in mlp.named_children()] == ["0", "1", "2", "3", "4"]
    assert [type(m) for m in mlp] == [type(m) for m in plain]
    assert list(mlp.state_dict()) == list(plain.state_dict())
    assert [n for n, _ in mlp.named_parameters()] == [n for n, _ in plain.named_parameters()]
    assert [p.shape for p in mlp.parameters()] == [p.shape for p in plain.parameters()]
    # built and initialised as the Sequential is: the same draws from the same seed
    for (name, got), want in zip(mlp.state_dict().items(), plain.state_dict().values()):
        assert torch.equal(got, want), name
    assert mlp.widths == list(WIDTHS) and mlp.activation == activation
    assert mlp.weights == [mlp[0].weight, mlp[2].weight, mlp[4].weight]
    assert mlp.biases == [mlp[0].bias, mlp[2].bias, mlp[4].bias]


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_an_optimizer_checkpoint_of_the_sequential_continues_in_the_fused_model(activation):
    """Adam over the plain model, two steps; its model and optimizer state load into a FusedMLP and its Adam,
    which continues three steps; the plain model continuing three steps is the oracle (float64, CPU)."""
    torch.manual_seed(4)
    plain = _plain(activation)
    rng = np.random.default_rng(5)
    batches = [torch.from_numpy(rng.standard_normal((8, WIDTHS[0]))) for _ in range(5)]

    def step(model, opt, x):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    opt = torch.optim.Adam(plain.parameters(), lr=1e-2)
    for x in batches[:2]:
        step(plain, opt, x)
    saved = io.BytesIO()
    torch.save({"model": plain.state_dict(), "opt": opt.state_dict()}, saved)

    mlp = FusedMLP(WIDTHS, activation=activation, dtype=torch.float64)
    checkpoint = torch.load(io.BytesIO(saved.getvalue()), weights_only=True)
    mlp.load_state_dict(checkpoint["model"])
    fused_opt = torch.optim.Adam(mlp.parameters(), lr=1e-2)
    fused_opt.load_state_dict(checkpoint["opt"])
    for x in batches[2:]:
        step(plain, opt, x)
        step(mlp, fused_opt, x)
    for (name, got), want in zip(mlp.named_parameters(), plain.parameters()):
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-9, atol=1e-12, err_msg=name)
    for got, want in zip(fused_opt.state_dict()["state"].values(), opt.state_dict()["state"].values()):
        assert int(got["step"]) == int(want["step"]) == 5
        np.testing.assert_allclose(got["exp_avg_sq"].numpy(), want["exp_avg_sq"].numpy(), rtol=1e-9, atol=1e-15)
    # and back: the fused model's optimizer checkpoint continues in the plain model
    again = _plain(activation)
    again.load_state_dict(mlp.state_dict())
    again_opt = torch.optim.Adam(again.parameters(), lr=1e-2)
    again_opt.load_state_dict(copy.deepcopy(fused_opt.state_dict()))  # its own state
    x = batches[0]
    step(again, again_opt, x)
    step(mlp, fused_opt, x)
    for got, want in zip(mlp.parameters(), again.parameters()):
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-9, atol=1e-12)


def test_indexing_iteration_and_the_children_in_order_give_the_fused_result():
    torch.manual_seed(6)
    mlp = FusedMLP(WIDTHS, activation="gelu", dtype=torch.float64)
    x = torch.from_numpy(np.random.default_rng(7).standard_normal((9, WIDTHS[0])))
    h = x
    for module in mlp:
        h = module(h)
    fused = mlp(x)
    np.testing.assert_allclose(fused.detach().numpy(), h.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(fused.detach().numpy(), _numpy_forward(mlp, x.numpy(), "gelu"), rtol=1e-10, atol=1e-12)
    assert mlp[-1] is mlp[4] and isinstance(mlp[1], nn.GELU)
    head = mlp[:3]  # a part of the chain: a plain Sequential over the same modules
    assert type(head) is nn.Sequential and head[0] is mlp[0] and len(head) == 3
    plain = mlp.to_sequential()
    assert type(plain) is nn.Sequential and all(a is b for a, b in zip(plain, mlp))


def _calls(monkeypatch):
    calls = []
    real = torch_mlp_ops.apply

    def counting(*args, **kwargs):
        calls.append(args[3])
        return real(*args, **kwargs)

    monkeypatch.setattr(torch_mlp_ops, "apply", counting)
    return calls


@pytest.mark.parametrize("edit", ["append", "setitem", "hook", "gelu_exact", "no_bias", "subclass", "del_tail"])
def test_an_edited_model_computes_its_children_in_order(monkeypatch, edit):
    """Edited into a stack the fused forward does not compute, the model runs the children one by one; edited
    into another fusable chain, it fuses that one."""
    torch.manual_seed(8)
    mlp = FusedMLP(WIDTHS, dtype=torch.float64)
    fused = True
    if edit == "append":
        mlp.append(nn.Tanh())
        fused = False
    elif edit == "setitem":
        mlp[3] = nn.Sigmoid()
        fused = False
    elif edit == "hook":
        mlp[2].register_forward_hook(lambda module, args, out: out * 2)
        fused = False
    elif edit == "gelu_exact":
        mlp[1] = nn.GELU()
        fused = False
    elif edit == "no_bias":
        mlp[2] = nn.Linear(10, 7, bias=False, dtype=torch.float64)
        fused = False
    elif edit == "subclass":

        class Scaled(nn.Linear):
            def forward(self, x):
                return super().forward(x) * 3

        mlp[4] = Scaled(7, 3, dtype=torch.float64)
        fused = False
    elif edit == "del_tail":
        del mlp[3:]  # Linear, ReLU, Linear: still an MLP, fused
    calls = _calls(monkeypatch)
    x = torch.from_numpy(np.random.default_rng(9).standard_normal((5, WIDTHS[0]))).requires_grad_()
    got = mlp(x)
    want = x
    for module in list(mlp._modules.values()):
        want = module(want)
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-10, atol=1e-12)
    assert bool(calls) == fused
    assert (mlp.activation is not None) == fused


def test_a_model_from_sequential_holds_the_modules_themselves():
    plain = _plain("gelu")
    mlp = FusedMLP.from_sequential(plain)
    assert all(a is b for a, b in zip(mlp, plain))
    assert list(mlp.state_dict()) == list(plain.state_dict())
    assert mlp.activation == "gelu" and mlp.widths == list(WIDTHS)


def test_deepcopy_and_pickling_keep_a_working_fused_model(tmp_path):
    mlp = FusedMLP(WIDTHS, activation="gelu", relu_backward="mask", dtype=torch.float64)
    copied = copy.deepcopy(mlp)
    torch.save(mlp, tmp_path / "m.pt")
    loaded = torch.load(tmp_path / "m.pt", weights_only=False)
    x = torch.from_numpy(np.random.default_rng(10).standard_normal((4, WIDTHS[0])))
    for model in (copied, loaded):
        assert type(model) is FusedMLP and model.relu_backward == "mask"
        np.testing.assert_allclose(model(x).detach().numpy(), mlp(x).detach().numpy(), rtol=0, atol=0)


# -- empty batches and zero features -------------------------------------------------------------------------------
SHAPES = [
    ((0, 6), (6, 10, 3)),  # an empty batch
    ((2, 0, 6), (6, 10, 3)),  # an empty batch, batched
    ((5, 0), (0, 10, 3)),  # no input features
    ((2, 3, 0), (0, 10, 3)),  # no input features, batched: flattened without reshape(-1, 0)
    ((0, 0), (0, 4, 3)),
    ((5, 6), (6, 0, 3)),  # an empty hidden layer
    ((4, 6), (6, 10, 0)),  # no outputs
    ((6,), (6, 10, 3)),  # one sample, unbatched
]


@pytest.mark.parametrize("shape,widths", SHAPES, ids=[f"{s}-{w}" for s, w in SHAPES])
@pytest.mark.parametrize("activation,relu_backward", [("relu", "mask"), ("relu", "drelu"), ("gelu", "mask")])
def test_empty_batches_and_zero_features_match_the_sequential(shape, widths, activation, relu_backward):
    torch.manual_seed(11)
    mlp = FusedMLP(widths, activation=activation, relu_backward=relu_backward, dtype=torch.float64)
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(torch.randn(p.shape, dtype=torch.float64))
    plain = copy.deepcopy(mlp.to_sequential())
    x = torch.from_numpy(np.random.default_rng(12).standard_normal(shape)).requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    got, want = mlp(x), plain(x_ref)
    assert got.shape == want.shape == (*shape[:-1], widths[-1])
    np.testing.assert_allclose(got.detach().numpy(), _numpy_forward(plain, x.detach().numpy(), activation),
                               rtol=1e-10, atol=1e-12)  # fmt: skip
    (got * 1.5).sum().backward()
    (want * 1.5).sum().backward()
    assert x.grad.shape == x.shape
    np.testing.assert_allclose(x.grad.numpy(), x_ref.grad.numpy(), rtol=1e-10, atol=1e-12)
    for (name, p), q in zip(mlp.named_parameters(), plain.parameters()):
        assert p.grad is not None and p.grad.shape == p.shape, name
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("shape", [(0, 6), (3, 0, 6)])
def test_fused_mlp_of_an_empty_batch_compiles_without_breaks(shape):
    mlp = FusedMLP((6, 10, 3), activation="gelu", dtype=torch.float64)
    compiled = torch.compile(mlp, backend="eager", fullgraph=True)
    x = torch.zeros(shape, dtype=torch.float64, requires_grad=True)
    y = compiled(x)
    y.sum().backward()
    assert y.shape == (*shape[:-1], 3) and x.grad.shape == x.shape and not x.grad.any()
    np.testing.assert_array_equal(mlp[0].weight.grad.numpy(), np.zeros((10, 6)))
    torch.compiler.reset()


def test_widths_are_checked_and_numpy_ints_accepted():
    assert FusedMLP(np.array([6, 4, 2])).widths == [6, 4, 2]
    assert FusedMLP((np.int64(3), 2)).widths == [3, 2]
    for widths, argument in [("64", "widths"), ([5], "widths"), (5, "widths"), ([4, -1], r"widths\[1\]"),
                             ([4, 2.0], r"widths\[1\]"), ([True, 2], r"widths\[0\]")]:  # fmt: skip
        with pytest.raises(InvalidArgumentError, match=argument):
            FusedMLP(widths)


def test_a_zero_dimensional_input_is_a_typed_error():
    with pytest.raises(ShapeMismatchError, match=r"\bx\b.*0-d"):
        fused_mlp(torch.tensor(1.0), [torch.ones(2, 1)], [torch.ones(2)])


# -- CUDA (run on a GPU machine) -----------------------------------------------------------------------------------
CUDA_SHAPES = [((33, 64), (64, 128, 32)), ((0, 64), (64, 128, 32)), ((2, 0, 64), (64, 128, 32)),
               ((5, 0), (0, 128, 32)), ((3, 4, 0), (0, 128, 32))]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch with CUDA")
@pytest.mark.parametrize("shape,widths", CUDA_SHAPES, ids=[f"{s}-{w}" for s, w in CUDA_SHAPES])
@pytest.mark.parametrize("activation,relu_backward", [("relu", "mask"), ("relu", "drelu"), ("gelu", "mask")])
def test_on_cuda_the_children_in_order_are_the_oracle(shape, widths, activation, relu_backward):
    torch.manual_seed(13)
    mlp = FusedMLP(widths, activation=activation, relu_backward=relu_backward, device="cuda", dtype=torch.float32)
    plain = copy.deepcopy(mlp.to_sequential()).double()
    x = torch.randn(shape, device="cuda", requires_grad=True)
    x_ref = x.detach().double().requires_grad_()
    got, want = mlp(x), plain(x_ref)
    assert got.shape == want.shape
    torch.testing.assert_close(got.double(), want, rtol=2e-3, atol=2e-3)
    got.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(x.grad.double(), x_ref.grad, rtol=2e-3, atol=2e-3)
    for (name, p), q in zip(mlp.named_parameters(), plain.parameters()):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad.double(), q.grad, rtol=2e-3, atol=2e-3, msg=name)
