"""FusedMLP's one-pass backward on a GPU through its prepared launch: ``activation_backward`` (its plan from the
plan cache, cuLaunchKernel) gives bit for bit what Numba's launch of the same kernels gives, and both match a
float64 NumPy oracle (ReLU masks exactly, GELU's derivative to one bfloat16 rounding, the bias gradient to float32
accumulation of bfloat16 values); the prepared launch is captured into a ``torch.cuda.graph`` and replayed on new
inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nvdispatch import plan_cache

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - the gpu marker skips first on GPU-less machines
    pytest.skip("needs torch with CUDA", allow_module_level=True)

from nvdispatch.executors import cuda_activation_grad as executor  # noqa: E402
from nvdispatch.executors import cuda_numba_launch  # noqa: E402
from nvdispatch.integrations import torch_activation_grad as one_pass  # noqa: E402

KINDS = ["relu", "relu_bits", "gelu", "none"]
M, N = 200, 136  # rows not a multiple of the 64-row blocks; 34 column quads


def _values(t) -> np.ndarray:
    return t.float().cpu().numpy().astype(np.float64)


def _inputs(kind, seed):
    gen = torch.Generator("cuda").manual_seed(seed)
    g = torch.randn(M, N, device="cuda", generator=gen).to(torch.bfloat16)
    z = (2 * torch.randn(M, N, device="cuda", generator=gen)).to(torch.bfloat16)
    if kind == "relu":
        return g, torch.relu(z), z
    if kind == "relu_bits":  # cuBLASLt's bit mask: bit j % 8 of byte j // 8, rows padded to 128 columns
        padded = np.ones((M, -(-N // 128) * 128), bool)
        padded[:, :N] = _values(z) > 0
        return g, torch.as_tensor(np.packbits(padded, axis=1, bitorder="little"), device="cuda"), z
    if kind == "gelu":
        return g, z, z
    return g, None, z


def _oracle(kind, g, z) -> np.ndarray:
    gv, zv = _values(g), _values(z)
    if kind in ("relu", "relu_bits"):
        return np.where(zv > 0, gv, 0.0)
    if kind == "gelu":
        k = math.sqrt(2 / math.pi)
        t = np.tanh(k * (zv + 0.044715 * zv**3))
        return gv * (0.5 * (1 + t) + 0.5 * zv * (1 - t**2) * k * (1 + 3 * 0.044715 * zv**2))
    return gv


def _check(kind, dz, db, g, z):
    want = _oracle(kind, g, z)
    if kind == "none":
        assert dz is None
    elif kind == "gelu":
        np.testing.assert_allclose(_values(dz), want, rtol=2**-8, atol=1e-6)  # one bfloat16 rounding
    else:
        np.testing.assert_array_equal(_values(dz), want)  # a mask rounds nothing
    sums = want.sum(0)
    np.testing.assert_allclose(_values(db), sums, rtol=2e-2, atol=2e-2 * np.abs(want).sum(0).max())


def _by_numba(kind, g, saved, monkeypatch):
    """The same kernels launched by Numba (a plan made where the prepared launch is said to be unavailable)."""
    with monkeypatch.context() as m:
        m.setattr(cuda_numba_launch, "unavailable", lambda: "the test launches by Numba")
        shape = tuple(saved.shape) if kind == "relu_bits" else None
        plan = executor.ActivationGradPlan(kind, M, N, shape, torch.cuda.current_device(), False)
    assert not plan.prepared and "by Numba" in plan.launcher.how
    dz = None if kind == "none" else torch.empty_like(g)
    partials = torch.empty((plan.partial_rows, N), device="cuda", dtype=torch.float32)
    sums = torch.empty(N, device="cuda", dtype=torch.bfloat16)
    gp = g.data_ptr()
    plan(torch.cuda.current_stream().cuda_stream, gp, gp if saved is None else saved.data_ptr(),
         gp if dz is None else dz.data_ptr(), partials.data_ptr(), sums.data_ptr())  # fmt: skip
    return dz, sums


@pytest.mark.parametrize("kind", KINDS)
def test_the_prepared_launch_matches_numbas_launch_and_numpy(kind, monkeypatch):
    g, saved, z = _inputs(kind, 1)
    dz, db = one_pass.activation_backward(kind, g, saved)
    key = executor.key(kind, M, N, tuple(saved.shape) if kind == "relu_bits" else None, torch.cuda.current_device())
    plan = plan_cache.peek(key)
    assert plan is not None and plan.prepared, None if plan is None else plan.launcher.how
    side = torch.cuda.Stream()  # Torch's current stream is the one launched on
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        dz_side, db_side = one_pass.activation_backward(kind, g, saved)
    side.synchronize()
    dz_numba, db_numba = _by_numba(kind, g, saved, monkeypatch)
    torch.cuda.synchronize()
    assert torch.equal(db, db_numba) and torch.equal(db_side, db_numba)
    if kind != "none":
        assert torch.equal(dz, dz_numba) and torch.equal(dz_side, dz_numba)
    _check(kind, dz, db, g, z)


@pytest.mark.parametrize("kind", KINDS)
def test_the_prepared_launch_is_captured_and_replayed_in_a_cuda_graph(kind):
    g, saved, _ = _inputs(kind, 2)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the warm-up makes the plan (compiles, prepares) before the capture
        one_pass.activation_backward(kind, g, saved)
    torch.cuda.current_stream().wait_stream(side)
    key = executor.key(kind, M, N, tuple(saved.shape) if kind == "relu_bits" else None, torch.cuda.current_device())
    assert plan_cache.peek(key).prepared
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dz, db = one_pass.activation_backward(kind, g, saved)
    for seed in (3, 4):  # new inputs copied into the captured ones, then a replay
        g_new, saved_new, z_new = _inputs(kind, seed)
        g.copy_(g_new)
        if saved is not None:
            saved.copy_(saved_new)
        graph.replay()
        torch.cuda.synchronize()
        dz_eager, db_eager = one_pass.activation_backward(kind, g_new, saved_new)
        torch.cuda.synchronize()
        assert torch.equal(db, db_eager) and (kind == "none" or torch.equal(dz, dz_eager))
        _check(kind, dz if kind != "none" else None, db, g_new, z_new)
