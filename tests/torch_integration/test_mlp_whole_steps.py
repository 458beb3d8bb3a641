"""The MLP training steps compiled_mlp_bench.py compiles whole (forward and backward in one program): written by
hand (benchmarks/_mlp_by_hand.py: the nvdispatch epilogs and plain Torch ops) and as a function of the parameters
(benchmarks/_mlp_functional.py: torch.func over FusedMLP and over a plain Torch model). Eagerly and compiled with
fullgraph=True, each leaves in ``.grad`` the gradients a float64 NumPy backward gives."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from nvdispatch.integrations.torch_mlp import FusedMLP  # noqa: E402

from . import mlp_oracle  # noqa: E402


def _benchmark_module(name):
    """A helper module of benchmarks/, loaded by path (benchmarks/ stays off ``sys.path``)."""
    path = pathlib.Path(__file__).parents[2] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_mlp_by_hand = _benchmark_module("_mlp_by_hand")
_mlp_functional = _benchmark_module("_mlp_functional")


def _oracle(x, weights, biases, activation):
    """(loss, weight gradients, bias gradients) of ``mean(mlp(x)²)`` in float64 NumPy."""
    y = mlp_oracle.forward(x, weights, biases, activation)
    _, _, dws, dbs = mlp_oracle.chain(x, weights, biases, 2 * y / y.size, activation)
    return float(np.mean(y**2)), dws, dbs


def _check_step(make, activation, plain=False):
    torch.manual_seed(0)
    fused = FusedMLP([24, 40, 40, 40, 8], activation=activation)
    model = fused.to_sequential() if plain else fused  # the same Linear modules, run by Torch's own layers
    x = torch.randn(32, 24)
    weights = [w.detach().double().numpy() for w in fused.weights]
    biases = [b.detach().double().numpy() for b in fused.biases]
    before = [p.detach().clone() for p in model.parameters()]
    x_before = x.clone()
    loss_ref, dws, dbs = _oracle(x.double().numpy(), weights, biases, activation)
    step = make(model)
    for _ in range(2):  # the second step runs the compiled program as cached, its gradients replacing the first's
        loss = step(x)
    assert float(loss) == pytest.approx(loss_ref, rel=1e-5)
    for w, dw in zip(fused.weights, dws):
        np.testing.assert_allclose(w.grad.double().numpy(), dw, rtol=1e-4, atol=1e-6)
    for b, db in zip(fused.biases, dbs):
        np.testing.assert_allclose(b.grad.double().numpy(), db, rtol=1e-4, atol=1e-6)
    for p, q in zip(model.parameters(), before):  # the step reads the parameters, never writes them
        assert torch.equal(p.detach(), q)
    assert torch.equal(x, x_before)


@pytest.mark.parametrize("mode", [None, "default"], ids=["eager", "compiled"])
@pytest.mark.parametrize("which", _mlp_by_hand.VERSIONS)
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_step_by_hand_gives_the_oracle_gradients(activation, which, mode):
    _check_step(lambda model: _mlp_by_hand.make_step(torch, model, which, mode), activation)


@pytest.mark.parametrize("mode", [None, "default"], ids=["eager", "compiled"])
@pytest.mark.parametrize("plain", [False, True], ids=["FusedMLP", "plain"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_functional_step_gives_the_oracle_gradients(activation, plain, mode):
    _check_step(lambda model: _mlp_functional.make_step(torch, model, mode), activation, plain)


def test_unknown_version_is_refused():
    with pytest.raises(ValueError, match="which"):
        _mlp_by_hand.make_step(torch, FusedMLP([4, 4]), "jax", None)


# -- CUDA (GPU machine): the whole step as one CUDA graph, replayed over changing inputs -------------------------------
STEPS = {
    "nvdispatch by hand": lambda model, mode: _mlp_by_hand.make_step(torch, model, "nvdispatch", mode),
    "FusedMLP functional": lambda model, mode: _mlp_functional.make_step(torch, model, mode),
}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch with CUDA")
@pytest.mark.parametrize("step", list(STEPS))
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_whole_step_cuda_graph_replays(activation, step):
    """Under ``mode="reduce-overhead"`` each step replays one CUDA graph: every replay, on a new input, leaves the
    oracle's gradients of *that* input (float32, Torch's default full-precision matmuls)."""
    torch.manual_seed(0)
    model = FusedMLP([48, 64, 64, 64, 16], activation=activation, device="cuda")
    weights = [w.detach().double().cpu().numpy() for w in model.weights]
    biases = [b.detach().double().cpu().numpy() for b in model.biases]
    run = STEPS[step](model, "reduce-overhead")
    for seed in range(4):
        x = torch.randn(128, 48, generator=torch.Generator().manual_seed(seed)).cuda()
        loss = run(x)
        loss_ref, dws, dbs = _oracle(x.double().cpu().numpy(), weights, biases, activation)
        assert float(loss) == pytest.approx(loss_ref, rel=1e-4)
        for p, want in zip([*model.weights, *model.biases], [*dws, *dbs]):
            np.testing.assert_allclose(p.grad.double().cpu().numpy(), want, rtol=2e-3, atol=1e-6)
