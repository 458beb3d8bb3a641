"""Repeated eager calls that autograd records: served from the route's hit by the plan the Torch integration
keeps under their key (``integrations.torch_recorded``), never the miss path again, with the operator's formula.
Gradients against float64 NumPy references; the backward epilogs' against the operator's full path (alpha 1.0,
a float, is not kept: every such call takes it)."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
from nvdispatch import plan_cache
from tests.matmul.matmul_reference import gelu, gelu_grad

torch = pytest.importorskip("torch")

M, K, N = 5, 4, 6
REPEATS = 4


def _t(*shape, seed=0, grad=True, cls=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    return torch.nn.Parameter(x) if cls == "param" else x.requires_grad_(grad)


def _forward_reference(epilog, a, b, bias, w):
    """``y`` and the gradients of ``sum(w * y)`` for ``y = epilog(a @ b + bias)``, in float64."""
    t = a @ b + (0 if bias is None else bias)
    gt = w
    if "RELU" in epilog:
        y, gt = np.maximum(t, 0), w * (t > 0)
    elif "GELU" in epilog:
        y, gt = gelu(t), w * gelu_grad(t)
    else:
        y = t
    a2, g2 = a.reshape(-1, a.shape[-1]), gt.reshape(-1, gt.shape[-1])  # (b is 2-D: batches are rows)
    grads = {"a": gt @ b.T, "b": a2.T @ g2}
    if bias is not None:
        grads["bias"] = gt.reshape(-1, gt.shape[-1]).sum(0)
    return y, grads


@pytest.mark.parametrize("params", ["tensors", "parameters"])
@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("epilog", ["DEFAULT", "RELU", "GELU", "BIAS", "RELU_BIAS", "GELU_BIAS", "RELU_AUX_BIAS",
                                    "GELU_AUX"])  # fmt: skip
def test_repeated_recorded_calls_take_the_hit_with_the_operators_formula(epilog, batched, params, full_paths):
    plan_cache.clear()
    cls = "param" if params == "parameters" else None
    a = _t(*((2, M, K) if batched else (M, K)), grad=False)
    b = _t(K, N, seed=1, cls=cls)
    bias = _t(N, seed=2, cls=cls) if "BIAS" in epilog else None
    w = np.random.default_rng(3).standard_normal((*a.shape[:-1], N))
    want_y, want = _forward_reference(epilog, a.detach().numpy(), b.detach().numpy(),
                                      None if bias is None else bias.detach().numpy(), w)  # fmt: skip
    for i in range(REPEATS):
        for x in (b, bias):
            if x is not None:
                x.grad = None
        out = nvdispatch.matmul(a, b, epilog=epilog, epilog_inputs=None if bias is None else {"bias": bias})
        y, aux = out if isinstance(out, tuple) else (out, None)
        assert type(y.grad_fn).__name__ == "nvdispatch_matmulBackward"
        if aux is not None:  # the epilog's outputs, as the public function returns them
            assert set(aux) == {"relu_aux" if "RELU" in epilog else "gelu_aux"}
        np.testing.assert_allclose(y.detach().numpy(), want_y, rtol=1e-10, atol=1e-10)
        (y * torch.from_numpy(w)).sum().backward()
        np.testing.assert_allclose(b.grad.numpy(), want["b"], rtol=1e-10, atol=1e-10, err_msg=f"b, call {i}")
        if bias is not None:
            np.testing.assert_allclose(bias.grad.numpy(), want["bias"], rtol=1e-10, atol=1e-10, err_msg="bias")
        if i == 0:
            first = full_paths[0]  # the first call's (and its backward GEMMs' first calls)
    assert full_paths[0] == first


@pytest.mark.parametrize("epilog", ["DRELU", "DGELU"])
def test_repeated_backward_epilogs_match_the_operators_full_path(epilog, full_paths):
    plan_cache.clear()
    a, b = _t(M, K), _t(K, N, seed=1)
    name = "relu_aux" if epilog == "DRELU" else "gelu_aux"
    x = (_t(M, N, seed=2, grad=False) > 0) if epilog == "DRELU" else _t(M, N, seed=2)
    w = _t(M, N, seed=3, grad=False)

    def grads(alpha):
        for t in (a, b, x):
            t.grad = None
        y = nvdispatch.matmul(a, b, alpha=alpha, epilog=epilog, epilog_inputs={name: x})
        (y * w).sum().backward()
        return [None if t.grad is None else t.grad.clone() for t in (a, b, x)] + [y.detach()]

    want = grads(1.0)  # a float alpha: the operator's full path on every call
    for i in range(REPEATS):
        got = grads(1)
        for g, h in zip(got, want):
            assert (g is None) == (h is None)
            if g is not None:
                torch.testing.assert_close(g, h, rtol=1e-12, atol=1e-12)
        if i == 0:
            first = full_paths[0]
    assert full_paths[0] == first


def test_grad_mode_and_autograd_state_choose_the_plan(full_paths):
    plan_cache.clear()
    a, b = _t(M, K, grad=False), _t(K, N, seed=1)
    for i in range(3):
        assert nvdispatch.matmul(a, b, epilog="RELU").grad_fn is not None
        with torch.no_grad():
            assert nvdispatch.matmul(a, b, epilog="RELU").grad_fn is None
        assert nvdispatch.matmul(a, b.detach(), epilog="RELU").grad_fn is None
        if i == 0:
            first = full_paths[0]
    assert first == 2 and full_paths[0] == first  # the recorded call, the call unrecorded (both states' the same)
    want = np.maximum(a.detach().numpy() @ b.detach().numpy(), 0)
    np.testing.assert_allclose(nvdispatch.matmul(a, b, epilog="RELU").detach().numpy(), want, rtol=1e-12)


def test_a_cleared_cache_and_a_stream_argument_still_record(full_paths):
    plan_cache.clear()
    a, b, bias = _t(M, K, grad=False), _t(K, N, seed=1), _t(N, seed=2)
    inputs = {"bias": bias}
    for _ in range(2):
        nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs=inputs)
    plan_cache.clear()  # the kept plan is released; the next call keeps another
    for i, stream in enumerate((None, torch.cpu.Stream(), None)):
        b.grad = bias.grad = None
        y = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs=inputs, stream=stream)
        y.sum().backward()
        t = a.detach().numpy() @ b.detach().numpy() + bias.detach().numpy()
        gt = (t > 0).astype(np.float64)
        np.testing.assert_allclose(b.grad.numpy(), a.detach().numpy().T @ gt, rtol=1e-12)
        np.testing.assert_allclose(bias.grad.numpy(), gt.sum(0), rtol=1e-12)
        if i == 0:
            first = full_paths[0]
    assert full_paths[0] == first
