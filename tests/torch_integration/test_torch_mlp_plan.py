"""FusedMLP's prepared chain (``integrations/torch_mlp_plan.py``): each operator call's GEMMs prepared once per
problem and kept in the plan cache; a repeated step runs them without a call key per GEMM, a change of backend
state or of shape takes another plan, and the values stay those of a float64 NumPy oracle."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
from nvdispatch import linalg

torch = pytest.importorskip("torch")

from nvdispatch.integrations import torch_mlp_plan  # noqa: E402
from nvdispatch.integrations.torch_mlp import FusedMLP, fused_mlp  # noqa: E402

from . import mlp_oracle  # noqa: E402

WIDTHS = [6, 12, 10, 3]


def _numpy(t):
    return t.detach().double().cpu().numpy()


def _check_step(mlp, fn, x, tol=1e-4):
    for p in mlp.parameters():
        p.grad = None
    x = x.detach().requires_grad_()
    out = fn(x)
    g = torch.randn(out.shape, dtype=out.dtype, device=out.device)
    out.backward(g)
    ws, bs = [_numpy(w) for w in mlp.weights], [_numpy(b) for b in mlp.biases]
    y, dx, dws, dbs = mlp_oracle.chain(_numpy(x), ws, bs, _numpy(g), mlp.activation)
    np.testing.assert_allclose(_numpy(out), y, rtol=tol, atol=tol)
    np.testing.assert_allclose(_numpy(x.grad), dx, rtol=tol, atol=tol)
    for p, want in zip([*mlp.weights, *mlp.biases], [*dws, *dbs]):
        np.testing.assert_allclose(_numpy(p.grad), want, rtol=tol, atol=tol)


def _chain_plans():
    return [p for p in nvdispatch.plan_cache.plans() if isinstance(p, torch_mlp_plan.MlpChainPlan)]


@pytest.fixture
def prepared(monkeypatch):
    """The calls ``linalg.prepare_call`` makes from now on (``(epilog, executor plan class)`` each), the plan cache
    emptied first."""
    made = []
    prepare = linalg.prepare_call

    def counting(a, b, epilog=None, epilog_inputs=None):
        hold, call = prepare(a, b, epilog, epilog_inputs)
        made.append((epilog, type(hold.plan).__name__))
        return hold, call

    nvdispatch.plan_cache.clear()
    monkeypatch.setattr(linalg, "prepare_call", counting)
    yield made
    nvdispatch.plan_cache.clear()


def _model(activation="relu", relu_backward="mask", widths=WIDTHS):
    torch.manual_seed(3)
    return FusedMLP(widths, activation=activation, relu_backward=relu_backward, dtype=torch.float64)


@pytest.mark.parametrize("mode", ["eager", "aot_eager"])
@pytest.mark.parametrize(("activation", "relu_backward"), [("relu", "mask"), ("relu", "drelu"), ("gelu", "mask")])
def test_prepared_steps_match_a_float64_oracle(prepared, activation, relu_backward, mode):
    mlp = _model(activation, relu_backward)
    fn = mlp if mode == "eager" else torch.compile(mlp, backend="aot_eager", fullgraph=True)
    for _ in range(3):  # the first step prepares the chain's GEMMs, the others run them
        _check_step(mlp, fn, torch.randn(5, WIDTHS[0], dtype=torch.float64), tol=1e-10)
    assert prepared  # the GEMMs went through prepared calls


def test_the_second_step_runs_the_cached_chain_plans(prepared):
    mlp = _model()
    _check_step(mlp, mlp, torch.randn(5, WIDTHS[0], dtype=torch.float64), tol=1e-10)
    layers = len(WIDTHS) - 1
    # forward: one GEMM per layer; backward: the weight gradients of each layer and the gradient below each
    assert len(prepared) == layers + 2 * layers
    plans = _chain_plans()
    assert sorted(p.what for p in plans) == ["nvdispatch::mlp_backward", "nvdispatch::mlp_forward"]
    hits = nvdispatch.plan_cache.stats()["hits"]
    _check_step(mlp, mlp, torch.randn(5, WIDTHS[0], dtype=torch.float64), tol=1e-10)
    assert len(prepared) == 3 * layers  # nothing prepared again
    assert _chain_plans() == plans and nvdispatch.plan_cache.stats()["hits"] >= hits + 2
    forward = next(p for p in plans if p.what == "nvdispatch::mlp_forward")
    assert forward.sites == tuple(("forward", i) for i in range(layers))


def test_a_backend_change_takes_another_chain_plan(prepared):
    mlp = _model()
    x = torch.randn(5, WIDTHS[0], dtype=torch.float64)
    _check_step(mlp, mlp, x, tol=1e-10)
    first = len(prepared)
    assert {cls for _, cls in prepared} == {"TorchMatmulPlan"}
    with nvdispatch.set_backend("numpy", coerce=True):
        _check_step(mlp, mlp, x, tol=1e-10)
        assert len(prepared) == 2 * first  # every GEMM prepared again, for the NumPy executor
        assert all("Torch" not in cls for _, cls in prepared[first:])
        assert len(_chain_plans()) == 4
        _check_step(mlp, mlp, x, tol=1e-10)
    _check_step(mlp, mlp, x, tol=1e-10)  # the state as before: its plans again
    assert len(prepared) == 2 * first


def test_a_new_shape_takes_another_chain_plan(prepared):
    mlp = _model("gelu")
    _check_step(mlp, mlp, torch.randn(5, WIDTHS[0], dtype=torch.float64), tol=1e-10)
    first = len(prepared)
    _check_step(mlp, mlp, torch.randn(7, WIDTHS[0], dtype=torch.float64), tol=1e-10)
    assert len(prepared) == 2 * first
    assert len(_chain_plans()) == 4
    _check_step(mlp, mlp, torch.randn(5, WIDTHS[0], dtype=torch.float64), tol=1e-10)
    assert len(prepared) == 2 * first


def test_a_strided_input_takes_another_chain_plan(prepared):
    mlp = _model()
    _check_step(mlp, mlp, torch.randn(5, WIDTHS[0], dtype=torch.float64), tol=1e-10)
    first = len(prepared)
    _check_step(mlp, mlp, torch.randn(WIDTHS[0], 5, dtype=torch.float64).T, tol=1e-10)
    assert len(prepared) > first


def test_clearing_the_cache_releases_the_chain_gemms(prepared):
    mlp = _model()
    _check_step(mlp, mlp, torch.randn(5, WIDTHS[0], dtype=torch.float64), tol=1e-10)
    plans = _chain_plans()
    assert all(p.sites for p in plans)
    nvdispatch.plan_cache.clear()
    assert all(not p.sites for p in plans)  # released: their GEMM plans let go
    _check_step(mlp, mlp, torch.randn(5, WIDTHS[0], dtype=torch.float64), tol=1e-10)
    assert len(_chain_plans()) == 2


def test_in_out_weights_and_float32(prepared):
    torch.manual_seed(5)
    ws = [torch.randn(i, o, requires_grad=True) for i, o in zip(WIDTHS[:-1], WIDTHS[1:])]
    bs = [torch.randn(o, requires_grad=True) for o in WIDTHS[1:]]
    for _ in range(2):
        for p in ws + bs:
            p.grad = None
        x = torch.randn(4, WIDTHS[0])
        g = torch.randn(4, WIDTHS[-1])
        fused_mlp(x, ws, bs, "gelu", weight_layout="in_out").backward(g)
        y, _, dws, dbs = mlp_oracle.chain(
            _numpy(x), [_numpy(w).T for w in ws], [_numpy(b) for b in bs], _numpy(g), "gelu"
        )
        for p, want in zip(ws + bs, [d.T for d in dws] + dbs):
            np.testing.assert_allclose(_numpy(p.grad), want, rtol=1e-4, atol=1e-4)


def test_a_chain_plan_repr_and_steps(prepared):
    mlp = _model()
    mlp(torch.randn(2, WIDTHS[0], dtype=torch.float64)).sum().backward()
    forward = next(p for p in _chain_plans() if p.what == "nvdispatch::mlp_forward")
    assert repr(forward) == "<MlpChainPlan nvdispatch::mlp_forward: 3 GEMMs>"
    assert len(forward.steps) == 3 and forward.call_of(("forward", 0)) is not None
    assert forward.call_of(("nowhere",)) is None


# -- CUDA: the prepared calls are the GEMM plans' compiled direct calls ------------------------------------------
def _cuda():
    return pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch with CUDA")


def _cuda_reference_check(mlp, out, x, g, tol):
    """Output and gradients of a CUDA step against the float64 oracle (relative to each reference's norm)."""
    ws, bs = [_numpy(w) for w in mlp.weights], [_numpy(b) for b in mlp.biases]
    y, _, dws, dbs = mlp_oracle.chain(_numpy(x), ws, bs, _numpy(g), mlp.activation)
    for got, want in zip([out, *[p.grad for p in mlp.weights], *[p.grad for p in mlp.biases]], [y, *dws, *dbs]):
        error = np.linalg.norm(_numpy(got) - want) / max(np.linalg.norm(want), 1e-30)
        assert error <= tol, error


@pytest.mark.gpu
@_cuda()
@pytest.mark.parametrize(("activation", "relu_backward"), [("relu", "mask"), ("relu", "drelu"), ("gelu", "mask")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_prepared_cuda_steps_run_compiled_direct_calls(prepared, activation, relu_backward, dtype):
    from nvdispatch._compiled import hotpath

    torch.manual_seed(9)
    mlp = FusedMLP([64, 128, 128, 32], activation=activation, relu_backward=relu_backward, device="cuda", dtype=dtype)
    tol = 2e-4 if dtype == torch.float32 else 0.05
    for _ in range(3):
        for p in mlp.parameters():
            p.grad = None
        x = torch.randn(48, 64, device="cuda").to(dtype)
        out = mlp(x)
        g = torch.randn(out.shape, device="cuda").to(dtype)
        out.backward(g)
        _cuda_reference_check(mlp, out, x, g, tol)
    if hotpath() is not None:
        forward = next(p for p in _chain_plans() if p.what == "nvdispatch::mlp_forward")
        calls = [forward.call_of(site) for site in forward.sites]
        assert calls and all(type(c).__name__ == "builtin_function_or_method" for c in calls), calls


@pytest.mark.gpu
@_cuda()
@pytest.mark.parametrize(("activation", "relu_backward"), [("relu", "mask"), ("gelu", "mask")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_a_prepared_step_captures_into_a_cuda_graph(activation, relu_backward, dtype):
    torch.manual_seed(13)
    mlp = FusedMLP([64, 128, 128, 32], activation=activation, relu_backward=relu_backward, device="cuda", dtype=dtype)
    static_x = torch.randn(48, 64, device="cuda", dtype=dtype)
    static_g = torch.randn(48, 32, device="cuda", dtype=dtype)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # prepares the chain and times the backward's forms, outside the capture
            for p in mlp.parameters():
                p.grad = None
            mlp(static_x).backward(static_g)
    torch.cuda.current_stream().wait_stream(side)
    for p in mlp.parameters():
        p.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = mlp(static_x)
        static_out.backward(static_g)
    for seed in (1, 2):
        gen = torch.Generator("cuda").manual_seed(seed)
        static_x.copy_(torch.randn(48, 64, device="cuda", generator=gen))
        static_g.copy_(torch.randn(48, 32, device="cuda", generator=gen))
        graph.replay()
        torch.cuda.synchronize()
        _cuda_reference_check(mlp, static_out, static_x, static_g, 2e-4 if dtype == torch.float32 else 0.05)


def test_the_backward_runs_under_the_forwards_backend_state(prepared):
    # autograd runs the backward of CUDA tensors on its device thread, which a ``set_backend`` block (a
    # ContextVar) around the step does not reach: the backward takes the state its forward ran under. Simulated
    # on the CPU by a backward outside the block (before, it took the default executor, Torch's)
    mlp = _model()

    def forward_under_numpy(x):
        with nvdispatch.set_backend("numpy", coerce=True):
            return mlp(x)

    _check_step(mlp, forward_under_numpy, torch.randn(5, WIDTHS[0], dtype=torch.float64), tol=1e-10)
    first = len(prepared)
    assert first == 3 * (len(WIDTHS) - 1)  # each layer's forward GEMM, its dW and its dx GEMMs
    assert all(cls != "TorchMatmulPlan" for _, cls in prepared), prepared
    _check_step(mlp, forward_under_numpy, torch.randn(5, WIDTHS[0], dtype=torch.float64), tol=1e-10)
    assert len(prepared) == first  # the same chain plans again


@pytest.mark.gpu
@_cuda()
def test_a_backend_change_on_cuda_takes_the_torch_executor(prepared):
    torch.manual_seed(17)
    mlp = FusedMLP([64, 128, 32], device="cuda", dtype=torch.float32)
    x = torch.randn(48, 64, device="cuda")
    g = torch.randn(48, 32, device="cuda")

    def step():
        for p in mlp.parameters():
            p.grad = None
        out = mlp(x)
        out.backward(g)
        _cuda_reference_check(mlp, out, x, g, 2e-4)

    step()
    first = len(prepared)
    # every fused product runs on cuBLASLt (a plain one, such as the one-pass backward's g @ W, may go to Torch's)
    assert first and all(cls != "TorchMatmulPlan" for epilog, cls in prepared if epilog != "DEFAULT")
    with nvdispatch.set_backend("torch", only=True):
        step()
        assert len(prepared) == 2 * first
        assert all(cls == "TorchMatmulPlan" for _, cls in prepared[first:])
    step()
    assert len(prepared) == 2 * first
