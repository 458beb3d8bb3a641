"""Torch autograd through nvdispatch: gradients flow through every forward epilog, and executors that would
drop the graph (raw cuBLASLt/cuFFT) decline calls that autograd records."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
from nvdispatch import Epilog
from nvdispatch._detect import detect

torch = pytest.importorskip("torch")

FORWARD = [Epilog.DEFAULT, Epilog.RELU, Epilog.GELU, Epilog.BIAS, Epilog.RELU_BIAS, Epilog.GELU_BIAS,
           Epilog.RELU_AUX_BIAS, Epilog.GELU_AUX_BIAS]  # fmt: skip


def _torch_reference(epilog, x, w, bias, alpha):
    pre = alpha * (x @ w) + (bias if "BIAS" in epilog.name else 0)
    if "RELU" in epilog.name:
        return torch.relu(pre)
    if "GELU" in epilog.name:
        return torch.nn.functional.gelu(pre, approximate="tanh")
    return pre


@pytest.mark.parametrize("epilog", FORWARD, ids=lambda e: e.name)
@pytest.mark.parametrize("batch", [(), (2,)])
@pytest.mark.parametrize("strategy", [None, "inplace", "plain"])
def test_gradients_flow_through_every_forward_epilog(epilog, batch, strategy):
    if strategy and epilog is Epilog.DEFAULT:
        pytest.skip("no epilog steps")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(*batch, 5, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(4, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    bias = torch.randn(3, dtype=torch.float64, generator=gen, requires_grad=True)
    kwargs = {"epilog_inputs": {"bias": bias}} if "BIAS" in epilog.name else {}
    prefs = {"strategy": strategy} if strategy else None
    y = nvdispatch.matmul(x, w, alpha=1.5, epilog=epilog, preferences=prefs, **kwargs)
    y = y[0] if isinstance(y, tuple) else y
    (y**2).sum().backward()
    got = [t.grad.clone() for t in (x, w)] + ([bias.grad.clone()] if "BIAS" in epilog.name else [])
    for t in (x, w, bias):
        t.grad = None
    (_torch_reference(epilog, x, w, bias, 1.5) ** 2).sum().backward()
    want = [x.grad, w.grad] + ([bias.grad] if "BIAS" in epilog.name else [])
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r)


def test_autograd_is_part_of_the_problem_and_the_raw_gpu_executors_decline_it():
    from nvdispatch.executors import cuda_matmul

    x = torch.ones(2, 3, requires_grad=True)
    assert detect("a", x).autograd
    with torch.no_grad():
        assert not detect("a", x).autograd
    assert not detect("a", x.detach()).autograd
    problem = nvdispatch.explain(x, torch.ones(3, 2), epilog="RELU").problem
    assert problem.autograd
    assert "autograd" in cuda_matmul.decline(problem)


def test_no_grad_calls_still_fuse():
    x, w, bias = torch.ones(4, 3, requires_grad=True), torch.ones(3, 2), torch.ones(2)
    with torch.no_grad():
        e = nvdispatch.explain(x, w, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        out = nvdispatch.matmul(x, w, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    assert e.strategy == "framework_fused" and not e.problem.autograd
    assert not out.requires_grad
    np.testing.assert_allclose(out.numpy(), np.full((4, 2), 4.0))


def test_fft_gradients_flow_and_raw_cufft_declines_recorded_calls():
    from nvdispatch.executors import cuda_fft

    x = torch.randn(8, dtype=torch.float64, requires_grad=True)
    y = nvdispatch.fft.rfft(x)
    y.abs().pow(2).sum().backward()
    got = x.grad.clone()
    x.grad = None
    torch.fft.rfft(x).abs().pow(2).sum().backward()
    torch.testing.assert_close(got, x.grad)
    problem = nvdispatch.explain(nvdispatch.fft.rfft, x).problem
    assert problem.autograd and "autograd" in cuda_fft.decline(problem)


@pytest.mark.parametrize("epilog", ["BIAS", "RELU_BIAS"])
def test_hot_path_direct_fused_call_keeps_the_graph_only_when_recorded(epilog):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, 4, generator=gen, requires_grad=True)
    w = torch.randn(4, 5, generator=gen)
    bias = torch.randn(5, generator=gen)
    want = _torch_reference(Epilog[epilog], x, w, bias, 1).detach()
    for _ in range(3):  # the first call plans; later ones take the hot path's direct call
        with torch.no_grad():
            y = nvdispatch.matmul(x, w, epilog=epilog, epilog_inputs={"bias": bias})
        assert y.grad_fn is None
        torch.testing.assert_close(y, want)
        y = nvdispatch.matmul(x, w, epilog=epilog, epilog_inputs={"bias": bias})
        assert y.grad_fn is not None
        torch.testing.assert_close(y.detach(), want)
    y.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape


@pytest.mark.parametrize("epilog", ["BIAS", "RELU_BIAS", "DEFAULT"])
def test_a_linear_layer_of_parameters_takes_the_cached_route_and_trains(epilog, monkeypatch):
    # nn.Parameter weights and bias beside plain activations: the commonest real call. A call autograd records
    # goes through the nvdispatch::matmul operator (its backward formula), whose own call of the public function
    # must find its plan in the cache (not re-validate every time); the gradients must be Torch's own.
    from nvdispatch import linalg

    validated = [0]
    prepare = linalg._prepare

    def counting(*args, **kwargs):
        validated[0] += 1
        return prepare(*args, **kwargs)

    monkeypatch.setattr(linalg, "_prepare", counting)
    gen = torch.Generator().manual_seed(2)
    w = torch.nn.Parameter(torch.randn(4, 5, generator=gen))
    bias = torch.nn.Parameter(torch.randn(5, generator=gen))
    kwargs = {"epilog_inputs": {"bias": bias}} if "BIAS" in epilog else {}
    for step in range(4):
        x = torch.randn(6, 4, generator=gen)
        if step == 2:
            validated[0] = 0
        y = nvdispatch.matmul(x, w, epilog=epilog, **kwargs)
        assert "nvdispatch_matmul" in type(y.grad_fn).__name__
        (y**2).sum().backward()
        got = [w.grad.clone()] + ([bias.grad.clone()] if "BIAS" in epilog else [])
        w.grad = bias.grad = None
        want_y = _torch_reference(Epilog[epilog], x, w, bias, 1)
        (want_y**2).sum().backward()
        torch.testing.assert_close(y, want_y)
        for g, r in zip(got, [w.grad] + ([bias.grad] if "BIAS" in epilog else [])):
            torch.testing.assert_close(g, r)
        w.grad = bias.grad = None
        with torch.no_grad():  # the same parameters outside autograd: their own plan, no graph
            y = nvdispatch.matmul(x, w, epilog=epilog, **kwargs)
        assert y.grad_fn is None
        torch.testing.assert_close(y, want_y.detach())
    assert validated[0] == 0  # the last two steps (and the backward GEMMs) found every plan by its call key


def test_a_recorded_fused_bias_call_fuses_the_bias_and_keeps_the_graph():
    x = torch.ones(4, 3)
    w, bias = torch.nn.Parameter(torch.ones(3, 2)), torch.nn.Parameter(torch.full((2,), -5.0))
    e = nvdispatch.explain(x, w, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    assert e.problem.autograd and e.strategy == "framework_fused"
    assert "torch.addmm" in str(e) and "autograd records both" in str(e)
    out = nvdispatch.matmul(x, w, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    np.testing.assert_allclose(out.detach().numpy(), np.zeros((4, 2)))
    out.sum().backward()
    np.testing.assert_allclose(bias.grad.numpy(), np.zeros(2))  # relu' is 0 below zero


def test_a_matmul_planned_without_autograd_refuses_a_call_autograd_records():
    # planned under no_grad, the plan may be one that drops the graph (raw cuBLASLt) or has no derivative
    # (_addmm_activation): executing it where autograd records must fail loudly, not train silently wrong
    x = torch.randn(4, 3)
    w, bias = torch.nn.Parameter(torch.randn(3, 2)), torch.nn.Parameter(torch.randn(2))
    want = torch.relu(x @ w + bias).detach()
    with torch.no_grad():
        mm = nvdispatch.Matmul(x, w)
        mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        torch.testing.assert_close(mm.execute(), want)
    with pytest.raises(nvdispatch.errors.PlanStateError, match="grad mode"):
        mm.execute()
    mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})  # planned again with grad mode on
    y = mm.execute()
    y.sum().backward()
    torch.testing.assert_close(bias.grad, (want > 0).sum(0).to(bias.dtype))
    with torch.no_grad():  # a plan made for recorded calls also runs calls that are not
        assert mm.execute().grad_fn is None


def test_an_fft_planned_without_autograd_refuses_a_call_autograd_records():
    x = torch.randn(16, dtype=torch.complex64, requires_grad=True)
    with torch.no_grad():
        f = nvdispatch.fft.FFT(x)
        f.plan()
        np.testing.assert_allclose(f.execute().numpy(), np.fft.fft(x.detach().numpy()), rtol=1e-5, atol=1e-5)
    with pytest.raises(nvdispatch.errors.PlanStateError, match="grad mode"):
        f.execute()
    f.plan()
    y = f.execute()
    y.abs().sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
