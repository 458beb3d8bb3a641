"""FusedMLP: every GEMM of its forward and backward pass one fused nvdispatch call, the chain one autograd node (two
``nvdispatch::`` operators in a compiled graph); its output and the gradients of its input, weights and biases are
those of the same model written with Torch's linear layers (float64 reference), eagerly and compiled."""

from __future__ import annotations

import pytest

import nvdispatch
from nvdispatch.errors import InvalidArgumentError, ShapeMismatchError

torch = pytest.importorskip("torch")

from nvdispatch.integrations import torch_mlp_ops  # noqa: E402
from nvdispatch.integrations.torch_mlp import FusedMLP, fused_mlp  # noqa: E402

WIDTHS = [6, 12, 10, 3]


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


def _compiled(mlp, mode):
    if mode == "eager":
        return mlp
    if mode == "aot_eager":
        return torch.compile(mlp, backend="aot_eager", fullgraph=True)
    return torch.compile(mlp, fullgraph=True, dynamic=mode == "inductor-dynamic")


def _close(got, want, tol):
    """``tol``: None (assert_close's defaults for the dtype), ``(rtol, atol)``, or a float: the largest error
    relative to ``want``'s norm (bfloat16 models: a ReLU mask flips where a pre-activation rounds across zero)."""
    if isinstance(tol, float):
        error = float((got.double() - want).norm() / want.norm().clamp_min(1e-30))
        assert error <= tol, error
    else:
        torch.testing.assert_close(got.double(), want, **({} if tol is None else {"rtol": tol[0], "atol": tol[1]}))


def _check_step(mlp, fn, x, rtol=None, atol=None, *, rel_norm=None):
    for p in mlp.parameters():
        p.grad = None
    out = fn(x)
    weight = torch.randn(out.shape, dtype=torch.float64, device=out.device).to(out.dtype)
    (out * weight).sum().backward()
    want, xr, ws, bs = _reference(mlp, x)
    (want * weight.double()).sum().backward()
    tol = rel_norm if rel_norm is not None else (None if rtol is None else (rtol, atol))
    _close(out, want, tol)
    if x.requires_grad:
        _close(x.grad, xr.grad, tol)
        x.grad = None
    for got, ref in zip([*mlp.weights, *mlp.biases], [*ws, *bs]):
        _close(got.grad, ref.grad, tol)


@pytest.mark.parametrize("mode", ["eager", "aot_eager", "inductor", "inductor-dynamic"])
@pytest.mark.parametrize("relu_backward", ["mask", "drelu"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_fused_mlp_matches_torch_linear_layers(activation, relu_backward, mode):
    if activation == "gelu" and relu_backward == "drelu" and mode != "eager":
        pytest.skip("relu_backward does not change a GELU model")
    torch.manual_seed(0)
    mlp = FusedMLP(WIDTHS, activation=activation, relu_backward=relu_backward, dtype=torch.float64)
    fn = _compiled(mlp, mode)
    for rows in (16, 9, 16):  # a second shape: a recompile, or the dynamic graph's other size
        _check_step(mlp, fn, torch.randn(rows, 6, dtype=torch.float64, requires_grad=True))


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_batched_input_and_an_input_without_grad(activation):
    torch.manual_seed(1)
    mlp = FusedMLP(WIDTHS, activation=activation, dtype=torch.float64)
    _check_step(mlp, mlp, torch.randn(2, 8, 6, dtype=torch.float64, requires_grad=True))
    _check_step(mlp, mlp, torch.randn(2, 8, 6, dtype=torch.float64))


@pytest.mark.parametrize("mode", ["eager", "inductor"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_float32_and_bfloat16_models(activation, mode):
    torch.manual_seed(2)
    for dtype, tol in ((torch.float32, {"rtol": 1e-5, "atol": 1e-5}), (torch.bfloat16, {"rel_norm": 0.1})):
        mlp = FusedMLP([16, 32, 32, 8], activation=activation, dtype=dtype)
        _check_step(mlp, _compiled(mlp, mode), torch.randn(24, 16).to(dtype).requires_grad_(), **tol)
        torch._dynamo.reset()


@pytest.mark.parametrize("mode", ["eager", "inductor"])
def test_inference_keeps_nothing_for_a_backward(mode):
    torch.manual_seed(3)
    mlp = FusedMLP(WIDTHS, activation="gelu", dtype=torch.float64)
    x = torch.randn(5, 6, dtype=torch.float64)
    with torch.no_grad():
        got = _compiled(mlp, mode)(x)
    want = _reference(mlp, x)[0]
    torch.testing.assert_close(got, want.detach())
    assert got.grad_fn is None


def test_the_chain_is_one_autograd_node():
    mlp = FusedMLP(WIDTHS)
    y = mlp(torch.randn(4, 6, requires_grad=True))
    assert type(y.grad_fn).__name__ == "nvdispatch_mlpBackward"
    # straight to the leaves: the input's and each parameter's AccumulateGrad, nothing in between
    nexts = [type(f).__name__ for f, _ in y.grad_fn.next_functions if f is not None]
    assert nexts == ["AccumulateGrad"] * (1 + 2 * (len(WIDTHS) - 1))


def _count_calls(monkeypatch):
    calls = []
    matmul = nvdispatch.linalg.matmul

    def counting(a, b, *args, **kwargs):
        calls.append(str(kwargs.get("epilog") or "DEFAULT"))
        return matmul(a, b, *args, **kwargs)

    monkeypatch.setattr(nvdispatch.linalg, "matmul", counting)
    return calls


@pytest.mark.parametrize(
    ("activation", "relu_backward", "forward", "below"),
    [
        ("relu", "mask", "RELU_BIAS", "DEFAULT"),
        ("relu", "drelu", "RELU_AUX_BIAS", "DRELU"),
        ("gelu", "mask", "GELU_AUX_BIAS", "DGELU"),
    ],
)
@pytest.mark.parametrize("input_grad", [False, True])
def test_each_gemm_is_one_fused_call(monkeypatch, activation, relu_backward, forward, below, input_grad):
    mlp = FusedMLP([8, 8, 8, 8, 8], activation=activation, relu_backward=relu_backward)
    x = torch.randn(4, 8, requires_grad=input_grad)
    calls = _count_calls(monkeypatch)
    mlp(x).sum().backward()
    backward = ["BGRADB", below] * 3 + ["BGRADB"] + (["DEFAULT"] if input_grad else [])
    assert calls == [forward] * 3 + ["BIAS"] + backward


def test_inference_runs_the_forward_epilogs_without_aux(monkeypatch):
    mlp = FusedMLP([8, 8, 8], activation="gelu")
    calls = _count_calls(monkeypatch)
    with torch.no_grad():
        mlp(torch.randn(4, 8))
    assert calls == ["GELU_BIAS", "BIAS"]


def _graphs(fn, *args):
    """The forward and backward FX graphs AOT autograd compiles for ``fn`` (after one step through it)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def keep(gm, _inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    compiled = torch.compile(fn, backend=aot_autograd(fw_compiler=keep, bw_compiler=keep), fullgraph=True)
    compiled(*args).sum().backward()
    return graphs


def _nvdispatch_nodes(gm):
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function" and "nvdispatch" in str(n.target)]


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_a_compiled_step_holds_two_operators_and_no_zero_fill(activation):
    mlp = FusedMLP([8, 16, 16, 16, 4], activation=activation)
    forward, backward = _graphs(mlp, torch.randn(5, 8))
    assert _nvdispatch_nodes(forward) == ["nvdispatch.mlp_forward.default"]
    assert _nvdispatch_nodes(backward) == ["nvdispatch.mlp_backward.default"]
    for gm in (forward, backward):
        targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
        assert not {t for t in targets if "zeros" in t or "fill" in t or "full" in t}, targets


@pytest.mark.parametrize("dynamic", [False, True])
def test_one_graph_without_breaks_static_or_dynamic(dynamic):
    graphs = []

    def counting(gm, _inputs):
        graphs.append(gm)
        return gm.forward

    mlp = FusedMLP(WIDTHS, activation="gelu")
    compiled = torch.compile(mlp, backend=counting, fullgraph=True, dynamic=dynamic)
    for rows in (7, 9, 11):
        compiled(torch.randn(rows, 6))
    assert len(graphs) == (1 if dynamic else 3)  # a static graph per shape (recompiles), not per break


def test_an_eager_step_makes_no_zero_gradient():
    from torch.profiler import profile

    mlp = FusedMLP([8, 16, 16, 4], activation="gelu")
    x, g = torch.randn(5, 8), torch.randn(5, 4)
    mlp(x).backward(g)
    with profile() as prof:
        mlp(x).backward(g)
    # a reduction's own output initialisation (the CPU executor's bias-gradient sums) is no gradient made
    fills = [
        e.name
        for e in prof.events()
        if e.name in ("aten::zeros", "aten::zeros_like", "aten::zero_", "aten::fill_")
        and getattr(e.cpu_parent, "name", None) != "aten::sum"
    ]
    assert not fills, fills


@pytest.mark.parametrize("mode", ["eager", "aot_eager"])
def test_a_second_backward_is_refused(mode):
    mlp = FusedMLP(WIDTHS, dtype=torch.float64)
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    (gx,) = torch.autograd.grad(_compiled(mlp, mode)(x).square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiable|no derivative|double backward"):
        gx.sum().backward()


def test_torch_export_round_trip():
    import io

    torch.manual_seed(4)
    mlp = FusedMLP(WIDTHS, activation="gelu", dtype=torch.float64)
    x = torch.randn(5, 6, dtype=torch.float64)
    program = torch.export.export(mlp, (x,))
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    loaded = torch.export.load(buffer)
    torch.testing.assert_close(loaded.module()(x), _reference(mlp, x)[0].detach())


# -- the operators ----------------------------------------------------------------------------------------------
def _operands(activation, relu_backward, grad):
    g = torch.Generator().manual_seed(5)
    ws = [torch.randn(6, 12, generator=g), torch.randn(12, 10, generator=g), torch.randn(10, 3, generator=g)]
    bs = [torch.randn(12, generator=g), torch.randn(10, generator=g), torch.randn(3, generator=g)]
    x = torch.randn(16, 6, generator=g)
    for t in (x, *ws, *bs):
        t.requires_grad_(grad)
    return x, ws, bs


@pytest.mark.parametrize(("activation", "relu_backward"), [("relu", "mask"), ("relu", "drelu"), ("gelu", "mask")])
def test_the_operators_pass_opcheck(activation, relu_backward):
    x, ws, bs = _operands(activation, relu_backward, grad=True)
    torch.library.opcheck(torch_mlp_ops.mlp_forward_op, (x, ws, bs, activation, relu_backward, True))
    plain = [t.detach() for t in (x, *ws, *bs)]
    x0, ws0, bs0 = plain[0], plain[1:4], plain[4:]
    torch.library.opcheck(torch_mlp_ops.mlp_forward_op, (x0, ws0, bs0, activation, relu_backward, False))
    outs = torch_mlp_ops.mlp_forward_op(x0, ws0, bs0, activation, relu_backward, True)
    hidden, aux = outs[1:3], outs[3:]
    grad = torch.randn(16, 3)
    for input_grad in (True, False):
        args = (grad, x0, ws0, hidden, aux, activation, relu_backward, input_grad)
        torch.library.opcheck(torch_mlp_ops.mlp_backward_op, args)


def test_a_recorded_forward_needs_for_backward():
    x, ws, bs = _operands("relu", "mask", grad=True)
    with pytest.raises(InvalidArgumentError, match="for_backward"):
        torch_mlp_ops.mlp_forward_op(x, ws, bs, "relu", "mask", False)


def test_bad_arguments_are_typed_errors():
    with pytest.raises(InvalidArgumentError, match="activation"):
        FusedMLP([4, 4], activation="tanh")
    with pytest.raises(InvalidArgumentError, match="relu_backward"):
        FusedMLP([4, 4], relu_backward="fused")
    with pytest.raises(InvalidArgumentError, match="widths"):
        FusedMLP([4])
    with pytest.raises(InvalidArgumentError, match="biases"):
        fused_mlp(torch.ones(2, 4), [torch.ones(4, 4)], [])
    with pytest.raises(ShapeMismatchError, match=r"weights\[1\]"):
        fused_mlp(torch.ones(2, 4), [torch.ones(4, 5), torch.ones(4, 2)], [torch.ones(5), torch.ones(2)])
    with pytest.raises(ShapeMismatchError, match=r"biases\[0\]"):
        fused_mlp(torch.ones(2, 4), [torch.ones(4, 5)], [torch.ones(4)])


# -- CUDA (run on a GPU machine) -----------------------------------------------------------------------------------
def _cuda():
    return pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch with CUDA")


def _cuda_model(activation, relu_backward, dtype, widths=(64, 128, 128, 32)):
    torch.manual_seed(7)
    return FusedMLP(list(widths), activation=activation, relu_backward=relu_backward, device="cuda", dtype=dtype)


CUDA_CASES = [("relu", "mask"), ("relu", "drelu"), ("gelu", "mask")]


@pytest.mark.gpu
@_cuda()
@pytest.mark.parametrize("mode", ["eager", "inductor", "inductor-dynamic"])
@pytest.mark.parametrize(("activation", "relu_backward"), CUDA_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_fused_mlp_on_cuda_matches_torch_linear_layers(activation, relu_backward, mode, dtype):
    mlp = _cuda_model(activation, relu_backward, dtype)
    fn = _compiled(mlp, mode)
    tol = {"rtol": 2e-4, "atol": 2e-4} if dtype == torch.float32 else {"rel_norm": 0.1}
    for rows in (48, 40):
        x = torch.randn(rows, 64, device="cuda").to(dtype).requires_grad_()
        _check_step(mlp, fn, x, **tol)


@pytest.mark.gpu
@_cuda()
@pytest.mark.parametrize(("activation", "relu_backward"), CUDA_CASES)
def test_the_operators_pass_opcheck_on_cuda(activation, relu_backward):
    x, ws, bs = (
        [t.cuda().requires_grad_() for t in ts] if isinstance(ts, list) else ts.cuda().requires_grad_()
        for ts in _operands(activation, relu_backward, grad=False)
    )
    torch.library.opcheck(torch_mlp_ops.mlp_forward_op, (x, ws, bs, activation, relu_backward, True))
    with torch.no_grad():
        outs = torch_mlp_ops.mlp_forward_op(x, ws, bs, activation, relu_backward, True)
    grad = torch.randn(16, 3, device="cuda")
    plain = [w.detach() for w in ws]
    args = (grad, x.detach(), plain, outs[1:3], outs[3:], activation, relu_backward, True)
    torch.library.opcheck(torch_mlp_ops.mlp_backward_op, args)


@pytest.mark.gpu
@_cuda()
@pytest.mark.parametrize(("activation", "relu_backward"), CUDA_CASES)
def test_reduce_overhead_training_replays_on_cuda_with_changing_inputs(activation, relu_backward):
    mlp = _cuda_model(activation, relu_backward, torch.float32)
    compiled = torch.compile(mlp, mode="reduce-overhead", fullgraph=True)
    for step in range(8):  # warm-up, recording, then replays of the CUDA graphs
        torch.compiler.cudagraph_mark_step_begin()
        x = torch.randn(48, 64, device="cuda", generator=torch.Generator("cuda").manual_seed(300 + step))
        _check_step(mlp, compiled, x.requires_grad_(), 2e-4, 2e-4)


@pytest.mark.gpu
@_cuda()
@pytest.mark.parametrize("mode", ["eager", "inductor"])
@pytest.mark.parametrize(("activation", "relu_backward"), CUDA_CASES)
def test_a_cuda_step_fills_nothing_with_zeros(activation, relu_backward, mode):
    from torch.profiler import ProfilerActivity, profile

    mlp = _cuda_model(activation, relu_backward, torch.bfloat16, widths=(256, 512, 512, 512, 256))
    fn = _compiled(mlp, mode)
    x = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        fn(x).backward(g)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(x).backward(g)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert not [k for k in kernels if "FillFunctor" in k or "fill" in k.lower()], kernels
