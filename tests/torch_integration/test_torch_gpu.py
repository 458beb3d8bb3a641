"""The ``nvdispatch::`` operators on CUDA tensors (run on a GPU machine): opcheck and fake-vs-real layouts (cuBLASLt's
bit masks, padded and column-major outputs held to the operators' layouts), ``fullgraph`` compiles through inductor
against the NumPy oracle, gradients, ``mode="reduce-overhead"`` replays with changing inputs, and each fused call
still one cuBLASLt launch inside the compiled graph (and the backward's weight and bias gradients one more)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import nvdispatch
from nvdispatch._epilog import EPILOGS
from tests.matmul.matmul_reference import assert_close, expected

torch = pytest.importorskip("torch")

from nvdispatch.integrations import torch_ops  # noqa: E402

from .test_torch_autograd import _np_forward_grads  # noqa: E402
from .test_torch_compile import every_epilog, every_transform, numpy_transforms  # noqa: E402
from .torch_cases import convolve_cases, fft_cases, fp8_cases, matmul_cases  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch with CUDA"),
]
FAKE_ONLY = ("test_schema", "test_faketensor")
M, K, N = 5, 4, 6


def _fp8_capable() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


def _ids(cases):
    return [name for name, _ in cases]


def _r(*shape, dtype=torch.float32, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    if dtype.is_complex:  # an imaginary part of its own: a conjugation shows
        x = torch.complex(x, torch.randn(*shape, generator=g, dtype=torch.float64))
    return x.to(dtype).cuda().requires_grad_(grad)


def _bits_to_mask(bits, n):
    """cuBLASLt's row-orientation relu bits ``(..., m, ceil128(n)/8)`` as a boolean ``(..., m, n)`` mask."""
    if bits.dtype == torch.bool:
        return bits
    shifts = torch.arange(8, device=bits.device, dtype=torch.uint8)
    m = (bits.unsqueeze(-1) >> shifts) & 1
    return m.reshape(*bits.shape[:-1], -1)[..., :n].bool()


# -- opcheck and layouts (cases built inside the tests: collection makes no CUDA tensor) ---------------------------------
def _case(cases_of, name, **kw):
    return dict(cases_of("cuda", **kw))[name]


@pytest.mark.parametrize("name", _ids(matmul_cases()))
def test_matmul_fake_kernel_matches_the_real_one_on_cuda(name):
    torch.library.opcheck(torch_ops.matmul_op, _case(matmul_cases, name), test_utils=FAKE_ONLY)


@pytest.mark.skipif(not _fp8_capable(), reason="needs compute capability 8.9+")
@pytest.mark.parametrize("name", _ids(fp8_cases()))
def test_fp8_matmul_fake_kernel_matches_the_real_one_on_cuda(name):
    utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(torch_ops.matmul_op, _case(fp8_cases, name), test_utils=utils)


@pytest.mark.parametrize(
    "name", ["RELU_BIAS", "GELU_AUX_BIAS-bias-m", "BIAS-batched", "DRELU_BGRAD", "BGRADB", "RELU_AUX", "alpha-beta-c"]
)
def test_matmul_passes_opcheck_on_cuda(name):
    torch.library.opcheck(torch_ops.matmul_op, _case(matmul_cases, name, grad=True))


@pytest.mark.parametrize("name", _ids(fft_cases()))
def test_fft_fake_kernel_matches_the_real_one_on_cuda(name):
    torch.library.opcheck(torch_ops.fft_op, _case(fft_cases, name), test_utils=FAKE_ONLY)


@pytest.mark.parametrize("name", _ids(convolve_cases()))
def test_convolve_passes_opcheck_on_cuda(name):
    torch.library.opcheck(torch_ops.convolve_op, _case(convolve_cases, name, grad=True))


@pytest.mark.parametrize("case", ["bias-m-bits", "gelu-aux-padded", "torch-executor-bool-mask", "bias-m-result"])
def test_executor_layouts_are_held_to_the_operators_layout(case):
    # cuBLASLt returns column-orientation bits and an F-ordered result for a bias along M, a gelu_aux padded to 8
    # elements; the Torch executor a boolean mask: the operator's outputs are the same layout whatever ran
    a, b = _r(M, K), _r(K, 7, seed=1)
    if case in ("bias-m-bits", "bias-m-result"):
        epilog, inputs = ("RELU_AUX_BIAS" if case == "bias-m-bits" else "BIAS"), {"bias": _r(M, 1, seed=2)}
    elif case == "gelu-aux-padded":
        epilog, inputs = "GELU_AUX", None
    else:
        epilog, inputs = "RELU_AUX", None
    args = (a, b, None, (inputs or {}).get("bias"), None, None, None, None, None, None, 1, None, epilog, "", "", "")
    backend = nvdispatch.set_backend("torch") if case == "torch-executor-bool-mask" else nvdispatch.set_backend("cuda")
    with backend:
        torch.library.opcheck(torch_ops.matmul_op, args, test_utils=FAKE_ONLY)
        outs = torch_ops.matmul_op(*args)
    want, want_aux = expected(a, b, None, 1, None, epilog, inputs)
    assert_close(outs[0], want, "float32", case)
    assert all(o.is_contiguous() for o in outs)
    if "relu_aux" in want_aux:
        assert outs[1].dtype == torch.uint8
        np.testing.assert_array_equal(_bits_to_mask(outs[1], 7).cpu().numpy(), want_aux["relu_aux"])
    if "gelu_aux" in want_aux:
        assert_close(outs[1], want_aux["gelu_aux"], "float32", case)


# -- compiled graphs ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_every_epilog_compiles_through_inductor_on_cuda(dtype, dynamic):
    dt = getattr(torch, dtype)
    args = (
        _r(M, K, dtype=dt),
        _r(K, N, dtype=dt, seed=1),
        _r(2, M, K, dtype=dt, seed=2),
        _r(N, dtype=dt, seed=3),
        _r(M, 1, dtype=dt, seed=4),
        _r(M, N, dtype=dt, seed=5),
        _r(M, N, seed=6) > 0,
        _r(M, N, dtype=dt, seed=7),
    )
    out = torch.compile(every_epilog, fullgraph=True, dynamic=dynamic)(*args)
    host = [x.cpu() for x in args]
    for spec in EPILOGS.values():
        name = spec.epilog.name
        inputs = {}
        if "bias" in spec.inputs:
            inputs["bias"] = host[3]
        if "relu_aux" in spec.inputs:
            inputs["relu_aux"] = host[6]
        if "gelu_aux" in spec.inputs:
            inputs["gelu_aux"] = host[7]
        got = out[name]
        want, want_aux = expected(host[0], host[1], None, 1, None, name, inputs)
        if want_aux:
            got, aux = got
            for k, v in want_aux.items():
                if k == "relu_aux":
                    np.testing.assert_array_equal(_bits_to_mask(aux[k], N).cpu().numpy(), v, err_msg=name)
                else:
                    assert_close(aux[k].cpu(), v, dtype, f"{name} {k}", scale=4)
        assert_close(got.cpu(), want, dtype, name, scale=4)


def test_every_transform_compiles_through_inductor_on_cuda():
    x, z, h = _r(6, 8), _r(6, 8, dtype=torch.complex64, seed=1), _r(5, dtype=torch.complex64, seed=2)
    out = torch.compile(every_transform, fullgraph=True)(x, z, h)
    want = numpy_transforms(x.cpu().double().numpy(), z.cpu().to(torch.complex128).numpy(), h.cpu().numpy())
    for key, w in want.items():
        np.testing.assert_allclose(out[key].cpu().numpy(), w, rtol=1e-4, atol=1e-4 * max(1, np.abs(w).max()))


@pytest.mark.parametrize("mode", ["eager", "compiled"])
@pytest.mark.parametrize("epilog", ["RELU_BIAS", "GELU_BIAS", "RELU_AUX_BIAS", "BIAS"])
def test_gradients_on_cuda(epilog, mode):
    a, b, bias = _r(3, M, K, grad=True), _r(K, N, seed=1, grad=True), _r(N, seed=2, grad=True)
    w = _r(3, M, N, seed=3)

    def loss(a, b, bias):
        out = nvdispatch.matmul(a, b, alpha=1.5, epilog=epilog, epilog_inputs={"bias": bias})
        return ((out[0] if isinstance(out, tuple) else out) * w).sum()

    fn = loss if mode == "eager" else torch.compile(loss, fullgraph=True)
    fn(a, b, bias).backward()
    n = lambda t: t.detach().cpu().double().numpy()  # noqa: E731
    want = _np_forward_grads(epilog, n(a), n(b), n(bias), None, 1.5, None, n(w), None)
    for name, t in (("a", a), ("b", b), ("bias", bias)):
        np.testing.assert_allclose(n(t.grad), want[name], rtol=1e-4, atol=1e-4, err_msg=name)


class MLP(torch.nn.Module):
    def __init__(self, width=64, dtype=torch.float32):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = torch.nn.ParameterList(
            [torch.nn.Parameter((torch.randn(width, width, generator=g) * width**-0.5).to(dtype)) for _ in range(3)]
        )
        self.b = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(width, generator=g).to(dtype)) for _ in range(3)]
        )

    def forward(self, x):
        for i, (w, b) in enumerate(zip(self.w, self.b)):
            epilog = "RELU_BIAS" if i == 0 else ("GELU_BIAS" if i == 1 else "BIAS")
            x = nvdispatch.matmul(x, w, epilog=epilog, epilog_inputs={"bias": b})
        return nvdispatch.fft.irfft(nvdispatch.fft.rfft(x) * 0.5, n=x.shape[-1])


def _mlp_reference(model, x):
    ws = [w.detach().double() for w in model.w]
    bs = [b.detach().double() for b in model.b]
    h = torch.relu(x.double() @ ws[0] + bs[0])
    h = torch.nn.functional.gelu(h @ ws[1] + bs[1], approximate="tanh")
    h = h @ ws[2] + bs[2]
    return torch.fft.irfft(torch.fft.rfft(h) * 0.5, n=h.shape[-1])


@pytest.fixture
def allocation_origins(monkeypatch):
    """Where each allocation a CUDA-graph tree finds unaccounted for in its pool was made (in its error)."""
    from torch._inductor import config

    monkeypatch.setattr(config.triton, "cudagraph_trees_history_recording", True)


@pytest.mark.usefixtures("allocation_origins")
def test_reduce_overhead_replays_give_right_results_with_changing_inputs():
    model = MLP().cuda()
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for step in range(8):  # warm-up, recording, then replays of the CUDA graph
            x = _r(32, 64, seed=100 + step)
            got = compiled(x)
            torch.testing.assert_close(got.double(), _mlp_reference(model, x), rtol=1e-4, atol=1e-4)


@pytest.mark.usefixtures("allocation_origins")
def test_reduce_overhead_training_replays_match_eager_steps():
    model, twin = MLP().cuda(), MLP().cuda()
    twin.load_state_dict(model.state_dict())
    step_fn = torch.compile(lambda x: (model(x) ** 2).mean(), mode="reduce-overhead")
    for step in range(6):
        x = _r(32, 64, seed=200 + step)
        torch.compiler.cudagraph_mark_step_begin()
        loss = step_fn(x)
        loss.backward()
        (twin(x) ** 2).mean().backward()
        for p, q in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
            p.grad = q.grad = None


# -- one launch per fused call -----------------------------------------------------------------------------------------
def _profiled(fn, *args) -> tuple[list[str], list[str]]:
    """``(kernels, operators)``: the CUDA kernels one call of ``fn`` launches (after warm-up calls), and the
    ``nvdispatch::`` operator calls it makes."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    events = prof.events()
    names = [e.name for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    kernels = [n for n in names if not n.lower().startswith(("memcpy", "memset"))]
    operators = [
        e.name for e in events if e.device_type == torch.autograd.DeviceType.CPU and e.name.startswith("nvdispatch::")
    ]
    return kernels, operators


def _kernels(fn, *args):
    """The CUDA kernels one call of ``fn`` launches (after warm-up calls)."""
    return _profiled(fn, *args)[0]


def _split_k(name: str) -> bool:
    """cuBLASLt's own second kernel of a split-K algorithm (part of the same cublasLtMatmul launch)."""
    return "splitk" in name.lower()


def _framework_reduction(name: str) -> bool:
    """A reduction kernel of Torch or inductor (a bias gradient computed apart from the GEMMs)."""
    return ("reduce_kernel" in name and not _split_k(name)) or name.startswith(("triton_red", "triton_per"))


def _framework_kernel(name: str) -> bool:
    """A kernel of Torch's (``at::`` namespaces) or inductor's, not one a library nvdispatch calls launches."""
    return re.search(r"\bat::", name) is not None or name.startswith("triton_")


def _weight(layout: str, grad: bool = False):
    """A 512 -> 1024 layer's weight and the ``b`` of ``x @ b``: ``(in, out)`` itself, or ``torch.nn.Linear``'s
    ``(out, in)`` weight read through its transposed view (no copy: cuBLASLt takes it as op=T)."""
    if layout == "in_out":
        w = _r(512, 1024, dtype=torch.bfloat16, seed=1, grad=grad)
        return w, w
    w = _r(1024, 512, dtype=torch.bfloat16, seed=1, grad=grad)
    return w, w.mT


@pytest.mark.parametrize("layout", ["in_out", "out_in"])
@pytest.mark.parametrize("epilog", ["RELU_BIAS", "GELU_AUX_BIAS", "BIAS"])
def test_a_fused_call_is_one_cublaslt_launch_inside_the_compiled_graph(epilog, layout):
    x, (_, w) = _r(256, 512, dtype=torch.bfloat16), _weight(layout)
    b = _r(1024, dtype=torch.bfloat16)
    fn = torch.compile(lambda x: nvdispatch.matmul(x, w, epilog=epilog, epilog_inputs={"bias": b}), fullgraph=True)
    kernels = _kernels(fn, x)
    assert len([k for k in kernels if not _split_k(k)]) == 1, kernels


@pytest.mark.parametrize("layout", ["in_out", "out_in"])
@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_the_backward_gets_weight_and_bias_gradients_from_one_gemm(mode, layout):
    # RELU_BIAS backward: the ReLU derivative (one elementwise kernel), dW and db from one BGRADB (BGRADA for a
    # transposed weight, its gradient written in the weight's layout) call, dX from one GEMM; no reduction kernel of
    # Torch's or inductor's for the bias gradient, no transposing copy of the weight gradient
    x = _r(256, 512, dtype=torch.bfloat16, grad=True)
    (w, _), b = _weight(layout, grad=True), _r(1024, dtype=torch.bfloat16, grad=True)
    operand = (lambda w: w) if layout == "in_out" else (lambda w: w.mT)
    fn = lambda x, w, b: nvdispatch.matmul(x, operand(w), epilog="RELU_BIAS", epilog_inputs={"bias": b})  # noqa: E731
    y = (fn if mode == "eager" else torch.compile(fn, fullgraph=True))(x, w, b)
    g = torch.ones_like(y)

    def backward():
        for t in (x, w, b):
            t.grad = None
        torch.autograd.backward(y, g, retain_graph=True)

    kernels, operators = _profiled(backward)
    listed = "kernels:\n" + "\n".join(kernels)  # in full: pytest shortens a list's repr
    assert not any(_framework_reduction(k) for k in kernels), listed
    # Torch's or inductor's kernels: the ReLU derivative alone (no bias reduction, no operand copy)
    assert len([k for k in kernels if _framework_kernel(k)]) == 1, listed
    # the GEMMs: two cublasLtMatmul calls, dX's and BGRADB's (dW and db). cuBLASLt may finish BGRADB's bias
    # gradient with a reduction kernel of its own inside the same call (on the H200 it does), as split-K does
    assert operators == ["nvdispatch::matmul"] * 2, operators
    library = [k for k in kernels if not _framework_kernel(k) and not _split_k(k)]
    assert 2 <= len(library) <= 3, listed


def test_a_recorded_call_with_a_stream_keeps_the_torch_executors_graph():
    a, b = _r(4, 3, grad=True), _r(3, 5, seed=1)
    side = torch.cuda.Stream()
    y = nvdispatch.matmul(a, b, epilog="RELU", stream=side)
    torch.cuda.synchronize()
    assert y.grad_fn is not None and "nvdispatch" not in type(y.grad_fn).__name__
    y.sum().backward()
    assert a.grad is not None
