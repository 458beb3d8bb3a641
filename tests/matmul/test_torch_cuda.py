"""The Torch executor on CUDA tensors (torch's own ops, on the tensor's current stream or ``stream=``)."""

from __future__ import annotations

import numpy as np
import pytest
from matmul_reference import assert_close, expected

import nvdispatch
from nvdispatch import Epilog
from nvdispatch._epilog import spec_of

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

DTYPES = ["float16", "bfloat16", "float32", "float64"]


def _t(rng, shape, dtype):
    return torch.from_numpy(rng.integers(-3, 4, size=shape).astype(np.float32)).to("cuda", getattr(torch, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("epilog", list(Epilog), ids=lambda e: e.name)
@pytest.mark.parametrize("bias_axis", ["n", "m"])
@pytest.mark.parametrize("batch", [(), (3,)])
def test_every_epilog_on_cuda_tensors(dtype, epilog, bias_axis, batch):
    spec = spec_of(epilog)
    if bias_axis == "m" and not spec.has_bias:
        pytest.skip("no bias")
    rng = np.random.default_rng(0)
    m, k, n = 33, 20, 17
    a, b = _t(rng, (*batch, m, k), dtype), _t(rng, (k, n), dtype)
    inputs = {}
    if spec.has_bias:
        inputs["bias"] = _t(rng, (n,) if bias_axis == "n" else (m, 1), dtype)
    if "relu_aux" in spec.inputs:
        inputs["relu_aux"] = torch.from_numpy(rng.integers(0, 2, size=(*batch, m, n)).astype(bool)).cuda()
    if "gelu_aux" in spec.inputs:
        inputs["gelu_aux"] = _t(rng, (*batch, m, n), dtype)
    with nvdispatch.set_backend("torch", only=True):
        got = nvdispatch.matmul(a, b, epilog=epilog, epilog_inputs=inputs or None)
    want, want_aux = expected(a, b, None, 1, None, epilog, inputs)
    if spec.outputs:
        got, aux = got
        for name in spec.outputs:
            assert aux[name].is_cuda
            assert_close(aux[name], want_aux[name], dtype if name != "relu_aux" else "bool", name, scale=8.0)
    assert got.is_cuda and str(got.dtype) == f"torch.{dtype}"
    assert_close(got, want, dtype, scale=8.0)


def test_runs_on_the_given_stream_without_host_sync():
    a = torch.randn(512, 256, device="cuda")
    b = torch.randn(256, 128, device="cuda")
    bias = torch.randn(128, device="cuda")
    s = torch.cuda.Stream()
    with nvdispatch.set_backend("torch", only=True):
        s.wait_stream(torch.cuda.current_stream())
        out = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}, stream=s)
    s.synchronize()
    torch.testing.assert_close(out, torch.relu(a @ b + bias), rtol=1e-2, atol=1e-2)
    # a raw stream pointer works too
    with nvdispatch.set_backend("torch", only=True):
        out2 = nvdispatch.matmul(a, b, stream=s.cuda_stream)
    s.synchronize()
    torch.testing.assert_close(out2, a @ b, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("epilog", ["BIAS", "RELU_BIAS", "GELU_BIAS"])
def test_a_linear_layer_of_cuda_parameters_trains_through_the_cached_route(epilog, full_paths, monkeypatch):
    # Parameters beside plain activations, autograd recording: Torch's addmm (+ activation) on the tensors'
    # device, gradients Torch's own, and repeated calls served from the plan cache. A call autograd records leaves
    # the route where the call key misses (its hand-off to the nvdispatch::matmul operator, one per call); the
    # operator's own call of the public function, and the backward's GEMMs, find their plans by key: nothing is
    # validated or selected again
    from nvdispatch import linalg

    validated = [0]
    prepare = linalg._prepare

    def counting(*args, **kwargs):
        validated[0] += 1
        return prepare(*args, **kwargs)

    monkeypatch.setattr(linalg, "_prepare", counting)
    gen = torch.Generator(device="cuda").manual_seed(3)
    w = torch.nn.Parameter(torch.randn(32, 16, device="cuda", generator=gen))
    bias = torch.nn.Parameter(torch.randn(16, device="cuda", generator=gen))
    act = {"BIAS": lambda t: t, "RELU_BIAS": torch.relu}.get(
        epilog, lambda t: torch.nn.functional.gelu(t, approximate="tanh")
    )
    for step in range(4):
        x = torch.randn(8, 32, device="cuda", generator=gen)
        if step == 2:
            full_paths[0] = validated[0] = 0
        y = nvdispatch.matmul(x, w, epilog=epilog, epilog_inputs={"bias": bias})
        assert y.is_cuda and "nvdispatch_matmul" in type(y.grad_fn).__name__
        y.square().sum().backward()
        got = (w.grad.clone(), bias.grad.clone())
        w.grad = bias.grad = None
        want = act(torch.addmm(bias, x, w))
        want.square().sum().backward()
        torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got, (w.grad, bias.grad), rtol=1e-4, atol=1e-4)
        w.grad = bias.grad = None
    assert validated[0] == 0, "the last two steps (forward and backward GEMMs) should find every plan by its key"
    assert full_paths[0] == 2, "one hand-off to the operator per recorded call, and nothing else off the key"
