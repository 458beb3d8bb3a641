"""FusedMLP checkpoints: a Sequential's state dict loads into a FusedMLP, a FusedMLP's into a plain model (through
``to_sequential``), with Torch's strict checks, across dtypes and devices, through files, with optimizer state."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from nvdispatch.integrations.torch_mlp import FusedMLP  # noqa: E402

nn = torch.nn
WIDTHS = (6, 10, 7, 3)


def _sequential(activation="relu", widths=WIDTHS, dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    mods = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        if i:
            mods.append(nn.ReLU() if activation == "relu" else nn.GELU(approximate="tanh"))
        mods.append(nn.Linear(a, b, dtype=dtype))
    return nn.Sequential(*mods)


def _numpy_forward(weights, biases, x, activation):
    """float64 NumPy oracle: ``weights[i]`` (out, in), activation between layers (GELU: tanh approximation)."""
    h = np.asarray(x, dtype=np.float64)
    for i, (w, b) in enumerate(zip(weights, biases)):
        h = h @ np.asarray(w, dtype=np.float64).T + np.asarray(b, dtype=np.float64)
        if i < len(weights) - 1:
            h = np.maximum(h, 0) if activation == "relu" else \
                0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))  # fmt: skip
    return h


def _state_arrays(state, keys):
    return [state[k].detach().cpu().double().numpy() for k in keys]


def _sequential_keys(layers, prefix=""):
    return [f"{prefix}{2 * i}.weight" for i in range(layers)], [f"{prefix}{2 * i}.bias" for i in range(layers)]


def _x(rows=9, dtype=torch.float64):
    return torch.from_numpy(np.random.default_rng(1).standard_normal((rows, WIDTHS[0]))).to(dtype)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_a_sequential_checkpoint_loads_into_a_fused_mlp(activation):
    seq = _sequential(activation)
    state = seq.state_dict()
    mlp = FusedMLP(WIDTHS, activation=activation, dtype=torch.float64)
    result = mlp.load_state_dict(state)
    assert result.missing_keys == [] and result.unexpected_keys == []
    ws, bs = _sequential_keys(3)
    for got, want in zip([*mlp.weights, *mlp.biases], _state_arrays(state, ws + bs)):
        np.testing.assert_array_equal(got.detach().numpy(), want)  # copied exactly
    x = _x()
    want = _numpy_forward(_state_arrays(state, ws), _state_arrays(state, bs), x.numpy(), activation)
    np.testing.assert_allclose(mlp(x).detach().numpy(), want, rtol=1e-10, atol=1e-12)
    assert list(state) == ws[:1] + bs[:1] + ws[1:2] + bs[1:2] + ws[2:] + bs[2:]  # the caller's dict is untouched


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_a_fused_checkpoint_loads_into_a_plain_model_through_to_sequential(activation):
    torch.manual_seed(3)
    mlp = FusedMLP(WIDTHS, activation=activation, dtype=torch.float64)
    state = mlp.to_sequential().state_dict()
    assert list(state) == ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]
    plain = _sequential(activation, seed=99)  # other values, Torch's own modules
    assert plain.load_state_dict(state).missing_keys == []
    x = _x()
    want = _numpy_forward([w.detach().numpy() for w in mlp.weights], [b.detach().numpy() for b in mlp.biases],
                          x.numpy(), activation)  # fmt: skip
    np.testing.assert_allclose(plain(x).detach().numpy(), want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(mlp(x).detach().numpy(), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_to_sequential_is_from_sequentials_inverse_over_the_same_parameters(activation):
    mlp = FusedMLP(WIDTHS, activation=activation, relu_backward="mask", dtype=torch.float64)
    seq = mlp.to_sequential()
    linears = seq[::2]
    assert all(lin.weight is w and lin.bias is b for lin, w, b in zip(linears, mlp.weights, mlp.biases))
    assert [type(m) for m in seq[1::2]] == [nn.ReLU if activation == "relu" else nn.GELU] * 2
    if activation == "gelu":
        assert all(m.approximate == "tanh" for m in seq[1::2])
    again = FusedMLP.from_sequential(seq)
    assert again.activation == activation
    assert all(p is q for p, q in zip(again.parameters(), mlp.parameters()))
    x = _x()
    want = _numpy_forward([w.detach().numpy() for w in mlp.weights], [b.detach().numpy() for b in mlp.biases],
                          x.numpy(), activation)  # fmt: skip
    np.testing.assert_allclose(seq(x).detach().numpy(), want, rtol=1e-10, atol=1e-12)
    with torch.no_grad():
        seq[0].weight.mul_(2)  # shared: the FusedMLP sees it
    np.testing.assert_array_equal(mlp.weights[0].detach().numpy(), seq[0].weight.detach().numpy())


def test_to_sequential_keeps_the_training_mode_and_gradients_land_on_the_shared_parameters():
    mlp = FusedMLP(WIDTHS, dtype=torch.float64).eval()
    assert not mlp.to_sequential().training
    seq = mlp.train().to_sequential()
    assert seq.training
    seq(_x()).sum().backward()
    assert all(w.grad is not None for w in mlp.weights)


def _earlier_form(state, layers=3, prefix=""):
    """``state`` (the Sequential's keys) as an earlier FusedMLP kept it: every ``weights.i``, then ``biases.i``."""
    ws, bs = _sequential_keys(layers)
    return {**{f"{prefix}weights.{i}": state[k] for i, k in enumerate(ws)},
            **{f"{prefix}biases.{i}": state[k] for i, k in enumerate(bs)}}  # fmt: skip


def test_the_fused_models_own_checkpoint_is_the_sequentials():
    src = FusedMLP(WIDTHS, activation="gelu", dtype=torch.float64)
    state = src.state_dict()
    assert list(state) == list(_sequential("gelu").state_dict())
    dst = FusedMLP(WIDTHS, activation="gelu", dtype=torch.float64)
    assert dst.load_state_dict(state).missing_keys == []
    for p, q in zip(dst.parameters(), src.parameters()):
        np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy())


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_an_earlier_fused_mlp_checkpoint_still_loads(activation):
    seq = _sequential(activation, seed=31)
    state = _earlier_form(seq.state_dict())
    assert list(state) == ["weights.0", "weights.1", "weights.2", "biases.0", "biases.1", "biases.2"]
    mlp = FusedMLP(WIDTHS, activation=activation, dtype=torch.float64)
    result = mlp.load_state_dict(state)
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert list(state) == ["weights.0", "weights.1", "weights.2", "biases.0", "biases.1", "biases.2"]  # not modified
    x = _x()
    ws, bs = _sequential_keys(3)
    want = _numpy_forward(_state_arrays(seq.state_dict(), ws), _state_arrays(seq.state_dict(), bs), x.numpy(),
                          activation)  # fmt: skip
    np.testing.assert_allclose(mlp(x).detach().numpy(), want, rtol=1e-10, atol=1e-12)


def test_strict_reports_an_earlier_checkpoints_own_keys():
    state = _earlier_form(_sequential().state_dict())
    del state["biases.1"]
    state["weights.0"] = torch.zeros(11, 6, dtype=torch.float64)
    mlp = FusedMLP(WIDTHS, dtype=torch.float64)
    with pytest.raises(RuntimeError) as info:
        mlp.load_state_dict(state)
    message = str(info.value)
    assert 'Missing key(s) in state_dict: "biases.1"' in message
    assert "size mismatch for weights.0: copying a param with shape torch.Size([11, 6])" in message
    assert "2.bias" not in message and "0.weight" not in message
    assert mlp.load_state_dict(_earlier_form(_sequential().state_dict())).missing_keys == []  # the hook's state reset


def test_an_earlier_checkpoint_loads_inside_a_larger_model():
    seq = _sequential(seed=32)
    model = _Model(FusedMLP(WIDTHS, dtype=torch.float64))
    state = {"embed.weight": model.embed.weight.detach().clone(), "embed.bias": model.embed.bias.detach().clone(),
             **_earlier_form(seq.state_dict(), prefix="mlp.")}  # fmt: skip
    assert model.load_state_dict(state).missing_keys == []
    assert list(model.state_dict()) == ["embed.weight", "embed.bias", *[f"mlp.{k}" for k in seq.state_dict()]]
    for got, want in zip(model.mlp.parameters(), seq.parameters()):
        np.testing.assert_array_equal(got.detach().numpy(), want.detach().numpy())


def test_strict_reports_a_sequential_checkpoints_own_keys():
    state = _sequential().state_dict()
    del state["2.bias"]
    state["6.weight"] = torch.zeros(3, 3, dtype=torch.float64)
    mlp = FusedMLP(WIDTHS, dtype=torch.float64)
    with pytest.raises(RuntimeError) as info:
        mlp.load_state_dict(state)
    assert str(info.value) == (
        'Error(s) in loading state_dict for FusedMLP:\n\tMissing key(s) in state_dict: "2.bias". \n\t'
        'Unexpected key(s) in state_dict: "6.weight". '
    )


def test_non_strict_loads_what_matches_and_returns_the_rest():
    seq = _sequential()
    state = seq.state_dict()
    del state["2.bias"]
    state["1.weight"] = torch.zeros(1)  # an activation with parameters: not this model's
    mlp = FusedMLP(WIDTHS, dtype=torch.float64)
    before = mlp.biases[1].detach().clone()
    result = mlp.load_state_dict(state, strict=False)
    assert result.missing_keys == ["2.bias"] and result.unexpected_keys == ["1.weight"]
    np.testing.assert_array_equal(mlp.weights[1].detach().numpy(), seq[2].weight.detach().numpy())
    np.testing.assert_array_equal(mlp.biases[1].detach().numpy(), before.numpy())  # not loaded, not changed


def test_a_size_mismatch_names_the_checkpoints_key():
    state = _sequential(widths=(6, 11, 7, 3)).state_dict()
    mlp = FusedMLP(WIDTHS, dtype=torch.float64)
    with pytest.raises(RuntimeError, match=r"size mismatch for 0\.weight: copying a param with shape") as info:
        mlp.load_state_dict(state)
    assert "weights.0" not in str(info.value)


def test_a_checkpoint_holding_both_forms_reports_the_duplicate():
    state = {**FusedMLP(WIDTHS, dtype=torch.float64).state_dict(), "weights.0": torch.zeros(10, 6)}
    mlp = FusedMLP(WIDTHS, dtype=torch.float64)
    with pytest.raises(RuntimeError, match=r'Unexpected key\(s\) in state_dict: "weights\.0"'):
        mlp.load_state_dict(state)
    assert mlp.load_state_dict(state, strict=False).unexpected_keys == ["weights.0"]


class _Model(nn.Module):
    def __init__(self, mlp):
        super().__init__()
        self.embed = nn.Linear(4, WIDTHS[0], dtype=torch.float64)
        self.mlp = mlp

    def forward(self, x):
        return self.mlp(self.embed(x))


def test_a_larger_models_checkpoint_loads_both_ways():
    torch.manual_seed(5)
    plain = _Model(_sequential(seed=5))
    fused = _Model(FusedMLP(WIDTHS, dtype=torch.float64))
    assert fused.load_state_dict(plain.state_dict()).missing_keys == []
    x = torch.from_numpy(np.random.default_rng(2).standard_normal((5, 4)))
    state = plain.state_dict()
    ws, bs = _sequential_keys(3, "mlp.")
    h = x.numpy() @ state["embed.weight"].numpy().T + state["embed.bias"].numpy()
    want = _numpy_forward(_state_arrays(state, ws), _state_arrays(state, bs), h, "relu")
    np.testing.assert_allclose(fused(x).detach().numpy(), want, rtol=1e-10, atol=1e-12)

    broken = plain.state_dict()
    del broken["mlp.4.weight"]
    with pytest.raises(RuntimeError, match=r'Missing key\(s\) in state_dict: "mlp\.4\.weight"'):
        fused.load_state_dict(broken)

    fused.mlp = fused.mlp.to_sequential()  # the plain checkpoint of the whole model
    back = _Model(_sequential(seed=6))
    assert back.load_state_dict(fused.state_dict()).missing_keys == []
    np.testing.assert_allclose(back(x).detach().numpy(), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_checkpoint_converts_to_the_models_dtype(dtype):
    state = _sequential(dtype=torch.float64 if dtype == torch.float32 else torch.float32).state_dict()
    mlp = FusedMLP(WIDTHS, dtype=dtype)
    mlp.load_state_dict(state)
    assert all(p.dtype == dtype for p in mlp.parameters())
    ws, bs = _sequential_keys(3)
    for got, want in zip([*mlp.weights, *mlp.biases], _state_arrays(state, ws + bs)):
        np.testing.assert_allclose(got.detach().double().numpy(), want, rtol=1e-6)
    seq = mlp.to_sequential()
    assert all(lin.weight.dtype == dtype for lin in seq[::2])


def test_files_round_trip_with_map_location(tmp_path):
    torch.manual_seed(7)
    mlp = FusedMLP(WIDTHS, activation="gelu", dtype=torch.float32)
    path = tmp_path / "plain.pt"
    torch.save(mlp.to_sequential().state_dict(), path)
    state = torch.load(path, map_location="cpu", weights_only=True)  # what a plain Torch user loads
    plain = _sequential("gelu", dtype=torch.float32, seed=8)
    plain.load_state_dict(state)
    again = FusedMLP(WIDTHS, activation="gelu", dtype=torch.float32)
    again.load_state_dict(torch.load(path, map_location=torch.device("cpu"), weights_only=True))
    own = tmp_path / "fused.pt"
    torch.save(mlp.state_dict(), own)
    third = FusedMLP(WIDTHS, activation="gelu", dtype=torch.float32)
    third.load_state_dict(torch.load(own, map_location="cpu", weights_only=True))
    x = _x(dtype=torch.float32)
    want = _numpy_forward([w.detach().numpy() for w in mlp.weights], [b.detach().numpy() for b in mlp.biases],
                          x.numpy(), "gelu")  # fmt: skip
    for model in (plain, again, third):
        np.testing.assert_allclose(model(x).detach().numpy(), want, rtol=1e-5, atol=1e-6)


def test_a_checkpoint_loads_onto_the_models_device_meta_to_cpu():
    """``load_state_dict(assign=True)`` into a FusedMLP made on the meta device (no storage): the usual way to load
    a large checkpoint; the parameters are then the checkpoint's, on its device."""
    seq = _sequential()
    mlp = FusedMLP(WIDTHS, dtype=torch.float64, device="meta")
    mlp.load_state_dict(seq.state_dict(), assign=True)
    assert all(p.device.type == "cpu" for p in mlp.parameters())
    assert all(isinstance(p, nn.Parameter) for p in mlp.parameters())
    x = _x()
    ws, bs = _sequential_keys(3)
    state = seq.state_dict()
    want = _numpy_forward(_state_arrays(state, ws), _state_arrays(state, bs), x.numpy(), "relu")
    np.testing.assert_allclose(mlp(x).detach().numpy(), want, rtol=1e-10, atol=1e-12)


@pytest.mark.gpu
def test_a_cpu_checkpoint_loads_onto_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    state = _sequential(dtype=torch.float32).state_dict()
    mlp = FusedMLP(WIDTHS, dtype=torch.float32, device="cuda")
    mlp.load_state_dict(state)
    assert all(p.device.type == "cuda" for p in mlp.parameters())
    x = _x(dtype=torch.float32)
    ws, bs = _sequential_keys(3)
    want = _numpy_forward(_state_arrays(state, ws), _state_arrays(state, bs), x.numpy(), "relu")
    np.testing.assert_allclose(mlp(x.cuda()).detach().cpu().numpy(), want, rtol=1e-4, atol=1e-4)
    plain = _sequential(dtype=torch.float32, seed=3)
    plain.load_state_dict(mlp.to_sequential().state_dict())  # CUDA tensors copied into the CPU model
    np.testing.assert_allclose(plain(x).detach().numpy(), want, rtol=1e-4, atol=1e-4)


def _adam_steps(params_of, model, steps, rows=8, seed=0):
    rng = np.random.default_rng(seed)
    opt = torch.optim.Adam(params_of(model), lr=1e-2)
    for _ in range(steps):
        opt.zero_grad()
        x = torch.from_numpy(rng.standard_normal((rows, WIDTHS[0])))
        model(x).square().mean().backward()
        opt.step()
    return opt


def test_an_optimizer_checkpoint_round_trips_through_the_plain_model(tmp_path):
    """Train the plain model two steps, save model and Adam state; resume as a FusedMLP with an optimizer over
    ``to_sequential().parameters()`` (the plain model's order), two more steps; save again and resume as the
    plain model. Each resumed run ends where the plain model trained four steps without a break ends."""
    plain = _sequential(seed=11)
    straight = copy.deepcopy(plain)
    opt = _adam_steps(nn.Module.parameters, plain, 2)
    path = tmp_path / "step2.pt"
    torch.save({"model": plain.state_dict(), "opt": opt.state_dict()}, path)

    checkpoint = torch.load(path, weights_only=True)
    mlp = FusedMLP(WIDTHS, dtype=torch.float64)
    mlp.load_state_dict(checkpoint["model"])
    opt = torch.optim.Adam(mlp.to_sequential().parameters(), lr=1e-2)
    opt.load_state_dict(checkpoint["opt"])
    rng = np.random.default_rng(0)
    for _ in range(2):  # the same inputs as the steps the straight run takes next
        rng.standard_normal((8, WIDTHS[0]))
    for _ in range(2):
        opt.zero_grad()
        mlp(torch.from_numpy(rng.standard_normal((8, WIDTHS[0])))).square().mean().backward()
        opt.step()
    torch.save({"model": mlp.to_sequential().state_dict(), "opt": opt.state_dict()}, tmp_path / "step4.pt")

    _adam_steps(nn.Module.parameters, straight, 4)
    back = _sequential(seed=12)
    checkpoint = torch.load(tmp_path / "step4.pt", weights_only=True)
    back.load_state_dict(checkpoint["model"])
    resumed_opt = torch.optim.Adam(back.parameters(), lr=1e-2)
    resumed_opt.load_state_dict(checkpoint["opt"])
    for got, want in zip(back.parameters(), straight.parameters()):
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-9, atol=1e-12)
    assert [s["exp_avg"].shape for s in resumed_opt.state.values()] == [p.shape for p in back.parameters()]
    assert all(int(s["step"]) == 4 for s in resumed_opt.state.values())


def test_a_fused_models_own_optimizer_checkpoint_round_trips(tmp_path):
    torch.manual_seed(13)
    mlp = FusedMLP(WIDTHS, activation="gelu", dtype=torch.float64)
    straight = copy.deepcopy(mlp)
    opt = _adam_steps(nn.Module.parameters, mlp, 2)
    torch.save({"model": mlp.state_dict(), "opt": opt.state_dict()}, tmp_path / "ckpt.pt")
    checkpoint = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    again = FusedMLP(WIDTHS, activation="gelu", dtype=torch.float64)
    again.load_state_dict(checkpoint["model"])
    opt2 = torch.optim.Adam(again.parameters(), lr=1e-2)
    opt2.load_state_dict(checkpoint["opt"])
    plain = straight.to_sequential()  # the oracle trains Torch's own modules over a copy of the start
    _adam_steps(nn.Module.parameters, plain, 2)
    linears = plain[::2]
    for got, want in zip([*again.weights, *again.biases], [m.weight for m in linears] + [m.bias for m in linears]):
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-9, atol=1e-12)
    assert [s["exp_avg"].shape for s in opt2.state.values()] == [p.shape for p in again.parameters()]


def test_a_model_from_sequential_or_copied_accepts_sequential_checkpoints():
    state = _sequential(seed=21).state_dict()
    adopted = FusedMLP.from_sequential(_sequential(seed=22))
    copied = copy.deepcopy(FusedMLP(WIDTHS, dtype=torch.float64))
    x = _x()
    ws, bs = _sequential_keys(3)
    want = _numpy_forward(_state_arrays(state, ws), _state_arrays(state, bs), x.numpy(), "relu")
    for model in (adopted, copied):
        assert model.load_state_dict(state).missing_keys == []
        np.testing.assert_allclose(model(x).detach().numpy(), want, rtol=1e-10, atol=1e-12)


def test_a_whole_pickled_model_keeps_accepting_sequential_checkpoints(tmp_path):
    torch.save(FusedMLP(WIDTHS, dtype=torch.float64), tmp_path / "model.pt")
    model = torch.load(tmp_path / "model.pt", weights_only=False)  # the whole module, pickled
    seq = _sequential(seed=23)
    assert model.load_state_dict(seq.state_dict()).unexpected_keys == []
    np.testing.assert_array_equal(model.weights[2].detach().numpy(), seq[4].weight.detach().numpy())


def test_an_earlier_fused_mlps_optimizer_checkpoint_continues_after_reordering():
    """An earlier FusedMLP listed every weight, then every bias; its optimizer's checkpoint, reordered by
    ``earlier_optimizer_state``, continues training to the plain model's values (Adam, float64)."""
    from nvdispatch.integrations.torch_mlp_state import earlier_optimizer_state

    plain = _sequential(seed=41)
    earlier = FusedMLP(WIDTHS, dtype=torch.float64)
    earlier.load_state_dict(plain.state_dict())
    rng = np.random.default_rng(42)
    batches = [torch.from_numpy(rng.standard_normal((8, WIDTHS[0]))) for _ in range(5)]
    opt = torch.optim.Adam([*earlier.weights, *earlier.biases], lr=1e-2)  # the earlier parameters() order
    plain_opt = torch.optim.Adam(plain.parameters(), lr=1e-2)

    def step(model, optimizer, x):
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()

    for x in batches[:2]:
        step(earlier, opt, x)
        step(plain, plain_opt, x)
    saved = copy.deepcopy(opt.state_dict())
    before = copy.deepcopy(saved)
    converted = earlier_optimizer_state(saved, layers=3)
    assert saved["param_groups"] == before["param_groups"]  # not modified
    mlp = FusedMLP(WIDTHS, dtype=torch.float64)
    mlp.load_state_dict(_earlier_form(earlier.state_dict()))
    resumed = torch.optim.Adam(mlp.parameters(), lr=1e-2)
    resumed.load_state_dict(converted)
    for x in batches[2:]:
        step(mlp, resumed, x)
        step(plain, plain_opt, x)
    for got, want in zip(mlp.parameters(), plain.parameters()):
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-9, atol=1e-12)


def test_earlier_optimizer_state_refuses_what_it_cannot_reorder():
    from nvdispatch.errors import InvalidArgumentError
    from nvdispatch.integrations.torch_mlp_state import earlier_optimizer_state

    mlp = FusedMLP(WIDTHS, dtype=torch.float64)
    state = torch.optim.SGD(mlp.parameters(), lr=0.1).state_dict()
    with pytest.raises(InvalidArgumentError, match=r"state_dict.*one group of 4 parameters.*\[6\]"):
        earlier_optimizer_state(state, layers=2)
    with pytest.raises(InvalidArgumentError, match="state_dict"):
        earlier_optimizer_state({"weights.0": 1}, layers=3)
    with pytest.raises(InvalidArgumentError, match="layers"):
        earlier_optimizer_state(state, layers=True)
