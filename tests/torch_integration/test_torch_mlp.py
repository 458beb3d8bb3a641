"""FusedMLP: every GEMM of its forward and backward pass one fused nvdispatch call, the chain one autograd node (two
``nvdispatch::`` operators in a compiled graph); its output and the gradients of its input, weights and biases are
those of the same model written with Torch's linear layers (float64 reference), eagerly and compiled."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
from nvdispatch._cuda import lt_layout as L
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
        h = torch.nn.functional.linear(h, w, b)  # weights stored (out, in), as torch.nn.Linear
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


class _InOut(torch.nn.Module):
    """A FusedMLP's parameters, transposed into ``(in, out)`` leaves, through ``fused_mlp(weight_layout="in_out")``."""

    def __init__(self, mlp):
        super().__init__()
        self.activation, self.relu_backward = mlp.activation, mlp.relu_backward
        self.weights = torch.nn.ParameterList([torch.nn.Parameter(w.detach().T.contiguous()) for w in mlp.weights])
        self.biases = torch.nn.ParameterList([torch.nn.Parameter(b.detach().clone()) for b in mlp.biases])

    def forward(self, x):
        ws, bs = list(self.weights), list(self.biases)
        return fused_mlp(x, ws, bs, self.activation, relu_backward=self.relu_backward, weight_layout="in_out")


@pytest.mark.parametrize("mode", ["eager", "aot_eager", "inductor-dynamic"])
@pytest.mark.parametrize(("activation", "relu_backward"), [("relu", "mask"), ("relu", "drelu"), ("gelu", "mask")])
def test_in_out_weights_match_the_same_linear_layers(activation, relu_backward, mode):
    torch.manual_seed(8)
    mlp = FusedMLP(WIDTHS, activation=activation, relu_backward=relu_backward, dtype=torch.float64)
    in_out = _InOut(mlp)
    fn = _compiled(in_out, mode)
    for rows in (16, 9):
        for p in in_out.parameters():
            p.grad = None
        x = torch.randn(rows, 6, dtype=torch.float64, requires_grad=True)
        weight = torch.randn(rows, WIDTHS[-1], dtype=torch.float64)
        (fn(x) * weight).sum().backward()
        want, xr, ws, bs = _reference(mlp, x)
        (want * weight).sum().backward()
        torch.testing.assert_close(x.grad, xr.grad)
        for got, ref in zip(in_out.weights, ws):
            torch.testing.assert_close(got.grad, ref.grad.T)  # the gradient in the weight's own (in, out) layout
        for got, ref in zip(in_out.biases, bs):
            torch.testing.assert_close(got.grad, ref.grad)


def test_bgrada_of_a_transposed_gradient_is_the_weight_and_bias_gradient():
    """The out_in layout's weight-gradient product: ``dz^T @ h`` with ``BGRADA`` gives ``dW`` of shape (out, in)
    and the bias gradient (``dz^T`` summed along K: ``dz``'s column sums), against float64 NumPy."""
    rng = np.random.default_rng(9)
    dz, h = rng.standard_normal((7, 5)), rng.standard_normal((7, 3))
    dw, extra = nvdispatch.matmul(torch.from_numpy(dz).mT, torch.from_numpy(h), epilog="BGRADA")
    np.testing.assert_allclose(dw.numpy(), dz.T @ h, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(extra["bgrada"].numpy().reshape(5), dz.sum(axis=0), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_gradients_land_in_the_parameters_layout_without_a_copy(activation):
    from torch.profiler import profile

    mlp = FusedMLP([8, 16, 16, 4], activation=activation)
    x, g = torch.randn(5, 8), torch.randn(5, 4)
    mlp(x).backward(g)
    for p in mlp.parameters():
        p.grad = None
    with profile(record_shapes=True) as prof:
        mlp(x).backward(g)
    for p in mlp.parameters():
        assert p.grad.shape == p.shape and p.grad.stride() == p.stride()

    def in_backward(event):
        while event is not None:
            if event.name.startswith("nvdispatch_mlpBackward"):
                return True
            event = event.cpu_parent
        return False

    # a copy of a weight-shaped tensor would be a transpose (or cast) of a weight gradient; the elementwise
    # derivative math of the CPU executor may copy scalars, never these
    weight_shapes = [list(w.shape) for w in mlp.weights] + [list(w.shape)[::-1] for w in mlp.weights]
    backward = [e for e in prof.events() if in_backward(e)]
    assert backward, "the backward's events"
    copies = [
        (e.name, e.input_shapes)
        for e in backward
        if e.name in ("aten::copy_", "aten::clone", "aten::contiguous", "aten::_to_copy")
        and any(shape in weight_shapes for shape in e.input_shapes)
    ]
    assert not copies, copies


@pytest.mark.parametrize(
    ("epilog", "form"),
    [("RELU_BIAS", "forward"), ("GELU_AUX_BIAS", "forward"), ("DEFAULT", "dgrad"), ("BGRADA", "wgrad")],
)
def test_the_linear_layout_gemms_read_transposed_operands_without_copies(epilog, form):
    """cuBLASLt's plan (built here on CPU tensors: the layout rules are the device's) takes each of the layout's
    operands as it is, a transposed view as op=T: no operand copied, in either orientation."""
    from nvdispatch._cuda.lt_setup import orientations, setup
    from nvdispatch.integrations.torch_layouts import matmul_problem

    bf16 = torch.bfloat16
    h, w, dz = torch.ones(64, 32, dtype=bf16), torch.ones(48, 32, dtype=bf16), torch.ones(64, 48, dtype=bf16)
    inputs = {"bias": torch.ones(48, dtype=bf16)} if "BIAS" in epilog else {}
    a, b = {"forward": (h, w.mT), "dgrad": (dz, w), "wgrad": (dz.mT, h)}[form]
    p = matmul_problem(a, b, None, inputs, 1, None, epilog, None, None, None)
    for orientation in orientations(p):
        s = setup(p, orientation)
        assert not s.lt_a.copy and not s.lt_b.copy, (orientation, s)
    if form == "forward":
        assert L.OP_T in (setup(p, "row").lt_a.op, setup(p, "row").lt_b.op)


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
    """The epilog of every GEMM the chains run from now on (each a call prepared by ``linalg.prepare_call``, the
    plan cache emptied so that every chain prepares its GEMMs afresh)."""
    calls = []
    prepare = nvdispatch.linalg.prepare_call

    def counting(a, b, epilog=None, epilog_inputs=None):
        hold, call = prepare(a, b, epilog, epilog_inputs)

        def counted(*args):
            calls.append(str(epilog or "DEFAULT"))
            return call(*args)

        return hold, counted

    nvdispatch.plan_cache.clear()
    monkeypatch.setattr(nvdispatch.linalg, "prepare_call", counting)
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
    backward = ["BGRADA", below] * 3 + ["BGRADA"] + (["DEFAULT"] if input_grad else [])
    assert calls == [forward] * 3 + ["BIAS"] + backward


def test_in_out_weights_take_bgradb_products(monkeypatch):
    ws = [torch.randn(8, 8, requires_grad=True) for _ in range(3)]
    bs = [torch.randn(8, requires_grad=True) for _ in range(3)]
    calls = _count_calls(monkeypatch)
    fused_mlp(torch.randn(4, 8), ws, bs, "gelu", weight_layout="in_out").sum().backward()
    assert calls == ["GELU_AUX_BIAS"] * 2 + ["BIAS"] + ["BGRADB", "DGELU"] * 2 + ["BGRADB"]


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
    # the kernel operators: no Python autograd step between the compiled graphs and the kernels
    assert _nvdispatch_nodes(forward) == ["nvdispatch.mlp_forward_kernel.default"]
    assert _nvdispatch_nodes(backward) == ["nvdispatch.mlp_backward_kernel.default"]
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
def _operands(activation, relu_backward, grad, weight_layout="out_in"):
    g = torch.Generator().manual_seed(5)
    ws = [torch.randn(12, 6, generator=g), torch.randn(10, 12, generator=g), torch.randn(3, 10, generator=g)]
    if weight_layout == "in_out":
        ws = [w.T.contiguous() for w in ws]
    bs = [torch.randn(12, generator=g), torch.randn(10, generator=g), torch.randn(3, generator=g)]
    x = torch.randn(16, 6, generator=g)
    for t in (x, *ws, *bs):
        t.requires_grad_(grad)
    return x, ws, bs


#: opcheck of an operator registered as not differentiated, on inputs that require grad
NOT_DIFFERENTIATED = ("test_schema", "test_autograd_registration", "test_faketensor")


@pytest.mark.parametrize("weight_layout", ["out_in", "in_out"])
@pytest.mark.parametrize(("activation", "relu_backward"), [("relu", "mask"), ("relu", "drelu"), ("gelu", "mask")])
def test_the_operators_pass_opcheck(activation, relu_backward, weight_layout):
    x, ws, bs = _operands(activation, relu_backward, grad=True, weight_layout=weight_layout)
    layout = weight_layout
    torch.library.opcheck(torch_mlp_ops.mlp_forward_op, (x, ws, bs, activation, relu_backward, layout, True))
    plain = [t.detach() for t in (x, *ws, *bs)]
    x0, ws0, bs0 = plain[0], plain[1:4], plain[4:]
    torch.library.opcheck(torch_mlp_ops.mlp_forward_op, (x0, ws0, bs0, activation, relu_backward, layout, False))
    outs = torch_mlp_ops.mlp_forward_op(x0, ws0, bs0, activation, relu_backward, layout, True)
    hidden, aux = outs[1:3], outs[3:]
    grad = torch.randn(16, 3)
    for input_grad in (True, False):
        args = (grad, x0, ws0, hidden, aux, activation, relu_backward, layout, input_grad)
        torch.library.opcheck(torch_mlp_ops.mlp_backward_op, args)
        torch.library.opcheck(torch_mlp_ops.mlp_backward_kernel_op, args)
    # the kernel operators (what compiled graphs call): registered as not differentiated, whatever requires grad
    kernel = torch_mlp_ops.mlp_forward_kernel_op
    for for_backward in (True, False):
        torch.library.opcheck(kernel, (x0, ws0, bs0, activation, relu_backward, layout, for_backward))
    torch.library.opcheck(kernel, (x, ws, bs, activation, relu_backward, layout, True), test_utils=NOT_DIFFERENTIATED)
    assert not any(t.requires_grad for t in kernel(x, ws, bs, activation, relu_backward, layout, True))


def test_a_recorded_forward_needs_for_backward():
    x, ws, bs = _operands("relu", "mask", grad=True)
    with pytest.raises(InvalidArgumentError, match="for_backward"):
        torch_mlp_ops.mlp_forward_op(x, ws, bs, "relu", "mask", "out_in", False)


def test_bad_arguments_are_typed_errors():
    with pytest.raises(InvalidArgumentError, match="activation"):
        FusedMLP([4, 4], activation="tanh")
    with pytest.raises(InvalidArgumentError, match="relu_backward"):
        FusedMLP([4, 4], relu_backward="fused")
    with pytest.raises(InvalidArgumentError, match="widths"):
        FusedMLP([4])
    with pytest.raises(InvalidArgumentError, match="biases"):
        fused_mlp(torch.ones(2, 4), [torch.ones(4, 4)], [])
    with pytest.raises(ShapeMismatchError, match=r"weights\[1\].*\(out, 5\).*'out_in'"):
        fused_mlp(torch.ones(2, 4), [torch.ones(5, 4), torch.ones(2, 4)], [torch.ones(5), torch.ones(2)])
    with pytest.raises(ShapeMismatchError, match=r"biases\[0\]"):
        fused_mlp(torch.ones(2, 4), [torch.ones(5, 4)], [torch.ones(4)])
    with pytest.raises(ShapeMismatchError, match=r"weights\[0\].*\(4, out\).*'in_out'"):
        fused_mlp(torch.ones(2, 4), [torch.ones(5, 4)], [torch.ones(5)], weight_layout="in_out")
    with pytest.raises(InvalidArgumentError, match="weight_layout"):
        fused_mlp(torch.ones(2, 4), [torch.ones(5, 4)], [torch.ones(5)], weight_layout="linear")


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
    torch.library.opcheck(torch_mlp_ops.mlp_forward_op, (x, ws, bs, activation, relu_backward, "out_in", True))
    with torch.no_grad():
        outs = torch_mlp_ops.mlp_forward_op(x, ws, bs, activation, relu_backward, "out_in", True)
    grad = torch.randn(16, 3, device="cuda")
    plain = [w.detach() for w in ws]
    args = (grad, x.detach(), plain, outs[1:3], outs[3:], activation, relu_backward, "out_in", True)
    torch.library.opcheck(torch_mlp_ops.mlp_backward_op, args)
    torch.library.opcheck(torch_mlp_ops.mlp_backward_kernel_op, args)
    plain_x = x.detach()
    torch.library.opcheck(torch_mlp_ops.mlp_forward_kernel_op, (plain_x, plain, [b.detach() for b in bs], activation,
                                                                relu_backward, "out_in", True))  # fmt: skip


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


def _profiled_cuda_step(activation, relu_backward, mode, *, clear_grads: bool):
    """(model, names of the CUDA kernels of one profiled bf16 training step after three warm-up steps);
    ``clear_grads``: the gradients let go before the profiled step (each then written, not accumulated)."""
    from torch.profiler import ProfilerActivity, profile

    mlp = _cuda_model(activation, relu_backward, torch.bfloat16, widths=(256, 512, 512, 512, 256))
    fn = _compiled(mlp, mode)
    x = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        fn(x).backward(g)
    torch.cuda.synchronize()
    if clear_grads:
        for p in mlp.parameters():
            p.grad = None
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(x).backward(g)
        torch.cuda.synchronize()
    return mlp, [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.gpu
@_cuda()
@pytest.mark.parametrize("mode", ["eager", "inductor"])
@pytest.mark.parametrize(("activation", "relu_backward"), CUDA_CASES)
def test_a_cuda_step_fills_nothing_with_zeros(activation, relu_backward, mode):
    _, kernels = _profiled_cuda_step(activation, relu_backward, mode, clear_grads=False)
    assert not [k for k in kernels if "FillFunctor" in k or "fill" in k.lower()], kernels


@pytest.mark.gpu
@_cuda()
@pytest.mark.parametrize("mode", ["eager", "inductor"])
@pytest.mark.parametrize(("activation", "relu_backward"), CUDA_CASES)
def test_a_cuda_step_copies_no_operand_and_no_gradient(activation, relu_backward, mode):
    """The Linear layout's GEMMs take every operand as it is (transposed views as op=T) and write each weight's
    gradient in its layout: no copy kernel, no device-to-device memcpy in a step."""
    mlp, events = _profiled_cuda_step(activation, relu_backward, mode, clear_grads=True)
    copies = [k for k in events if "copy" in k.lower() or "dtod" in k.lower() or "transpose" in k.lower()]
    assert not copies, events
    for p in mlp.parameters():
        assert p.grad.stride() == p.stride()


# -- the backward's forms: the one-pass activation backward + bias gradient, or the GEMM epilogues -------------------
def test_the_one_pass_backward_refuses_what_it_cannot_take():
    from nvdispatch.integrations import torch_activation_grad as one_pass

    cpu = torch.zeros(8, 8, dtype=torch.bfloat16)
    assert "CUDA" in one_pass.one_pass_reason(cpu, None)
    assert "CUDA" in one_pass.one_pass_reason(cpu, cpu)
    # the kernels read g by pointer: a lazy negative view's memory holds its values unnegated (on any device)
    for device in ("cpu", "meta"):
        assert "lazy negative view" in one_pass.one_pass_reason(torch._neg_view(cpu.to(device)), None)


def test_a_single_backward_form_is_recorded_untimed():
    from nvdispatch.integrations import torch_activation_grad as one_pass

    key = ("test", "a single form")
    ran = []
    assert one_pass.choose(key, {"epilogue": lambda: ran.append(1)}, torch.device("cpu")) == "epilogue"
    assert ran == [] and one_pass.chosen(key) == "epilogue"
    one_pass.forget_choices()
    assert one_pass.chosen(key) is None


def test_a_backward_form_that_fails_is_left_out(caplog):
    from nvdispatch.errors import CublasLtError
    from nvdispatch.integrations import torch_activation_grad as one_pass

    def unsupported():
        raise CublasLtError("no algorithm", 15)

    def broken():
        raise RuntimeError("a kernel that does not compile here")

    key = ("test", "failing forms")
    forms = {"epilogue": lambda: None, "epilogue-bgrad": unsupported, "one-pass": broken}
    with caplog.at_level("DEBUG", logger="nvdispatch"):
        assert one_pass.choose(key, forms, torch.device("cpu")) == "epilogue"
    assert one_pass.chosen(key) == "epilogue" and len(forms) == 3  # the caller's dict is left as it was
    assert "a kernel that does not compile here" in caplog.text
    one_pass.forget_choices()


@pytest.fixture
def forced_form(monkeypatch):
    """Make every backward choice of FusedMLP's the given form where it is offered, else the epilogue one
    (``force(label)``), the timing skipped."""
    from nvdispatch.integrations import torch_activation_grad as one_pass

    def force(label):
        monkeypatch.setattr(one_pass, "chosen", lambda key: None)
        monkeypatch.setattr(one_pass, "choose", lambda key, forms, device: label if label in forms else "epilogue")

    return force


@pytest.mark.gpu
@_cuda()
@pytest.mark.parametrize("form", ["epilogue", "epilogue-bgrad", "one-pass"])
@pytest.mark.parametrize("mode", ["eager", "inductor", "inductor-dynamic"])
@pytest.mark.parametrize("layout", ["out_in", "in_out"])
@pytest.mark.parametrize(("activation", "relu_backward"), CUDA_CASES)
def test_each_backward_form_on_cuda_matches_torch_linear_layers(activation, relu_backward, layout, mode, form,
                                                                forced_form):  # fmt: skip
    """bfloat16 (the one-pass kernels' dtype), rows not a multiple of the kernels' row blocks, a width not a
    multiple of their column blocks; both weight layouts."""
    forced_form(form)
    torch.manual_seed(11)
    widths = [64, 520, 136, 40]
    ws = [(torch.randn(o, i, device="cuda") / i**0.5).to(torch.bfloat16) for i, o in zip(widths[:-1], widths[1:])]
    bs = [torch.randn(o, device="cuda").to(torch.bfloat16) for o in widths[1:]]
    stored = [w.detach().clone() if layout == "out_in" else w.detach().T.contiguous() for w in ws]
    params = [p.requires_grad_() for p in stored + [b.detach().clone() for b in bs]]
    n = len(ws)

    def model(x):
        return fused_mlp(x, params[:n], params[n:], activation, relu_backward=relu_backward, weight_layout=layout)

    fn = model if mode == "eager" else torch.compile(model, fullgraph=True, dynamic=mode == "inductor-dynamic")
    for rows in (200, 72):
        x = torch.randn(rows, 64, device="cuda").to(torch.bfloat16).requires_grad_()
        for p in params:
            p.grad = None
        out = fn(x)
        g = torch.randn(out.shape, device="cuda").to(torch.bfloat16)
        out.backward(g)
        xr = x.detach().double().requires_grad_()
        wr = [w.detach().double().requires_grad_() for w in ws]
        br = [b.detach().double().requires_grad_() for b in bs]
        h = xr
        for i, (w, b) in enumerate(zip(wr, br)):
            h = torch.nn.functional.linear(h, w, b)
            if i < n - 1:
                h = torch.relu(h) if activation == "relu" else torch.nn.functional.gelu(h, approximate="tanh")
        h.backward(g.double())
        _close(out, h.detach(), 0.02)
        _close(x.grad, xr.grad, 0.05)
        for i in range(n):
            dw = params[i].grad if layout == "out_in" else params[i].grad.T
            assert params[i].grad.stride() == params[i].stride()
            _close(dw, wr[i].grad, 0.05)
            _close(params[n + i].grad, br[i].grad, 0.05)


@pytest.mark.gpu
@_cuda()
@pytest.mark.parametrize(("activation", "relu_backward"), CUDA_CASES)
def test_the_one_pass_backward_replays_in_cuda_graphs(activation, relu_backward, forced_form):
    forced_form("one-pass")
    mlp = _cuda_model(activation, relu_backward, torch.bfloat16)
    compiled = torch.compile(mlp, mode="reduce-overhead", fullgraph=True)
    for step in range(6):  # warm-up, recording, then replays of the CUDA graphs
        torch.compiler.cudagraph_mark_step_begin()
        x = torch.randn(48, 64, device="cuda", generator=torch.Generator("cuda").manual_seed(500 + step))
        _check_step(mlp, compiled, x.to(torch.bfloat16).requires_grad_(), rel_norm=0.1)


@pytest.mark.gpu
@_cuda()
def test_the_backward_choice_is_timed_once_per_problem_and_kept():
    from nvdispatch.integrations import torch_activation_grad as one_pass

    one_pass.forget_choices()
    mlp = _cuda_model("gelu", "mask", torch.bfloat16)
    x = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    mlp(x).sum().backward()
    first = one_pass.choices()
    assert first and set(first.values()) <= {"epilogue", "epilogue-bgrad", "one-pass"}
    mlp(x).sum().backward()
    assert one_pass.choices() == first
