"""On the GPU: cuFFT/cuBLASLt plans are released only when their last user lets go, OOM is typed, zero-size
inputs give empty results, workspaces are counted. Skipped without a GPU (the lead runs these on an H200)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import nvdispatch
from nvdispatch import errors, plan_cache

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _fresh():
    old = plan_cache.maxsize, plan_cache.max_bytes
    plan_cache.clear()
    yield
    plan_cache.maxsize, plan_cache.max_bytes = old
    plan_cache.clear()


def _cuda_fft_plan(f):
    """The raw-cuFFT plan an FFT object holds (the "cuda" executor must have been chosen)."""
    plan = f._holds["forward"].plan
    assert type(plan).__name__ == "CudaFFTPlan", plan
    return plan


def _x(shape=(64, 256), seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)


def test_cufft_plan_held_by_an_fft_object_survives_clear_and_churn():
    x = _x()
    xt = torch.from_numpy(x).cuda()
    with nvdispatch.set_backend("cuda", only=True):
        f = nvdispatch.fft.FFT(xt, axes=(1,)).plan()
    plan = _cuda_fft_plan(f)
    assert plan.workspace_bytes >= 0
    plan_cache.clear()
    plan_cache.maxsize = 1
    for n in (32, 48, 96):  # other cuFFT plans come and go
        with nvdispatch.set_backend("cuda", only=True):
            nvdispatch.fft.fft(torch.from_numpy(_x((8, n))).cuda())
    assert plan.cufft.handle is not None  # not destroyed: f still holds it
    np.testing.assert_allclose(f.execute().cpu().numpy(), np.fft.fft(x, axis=1), rtol=1e-4, atol=1e-3)
    f.free()
    assert plan.cufft.handle is None  # the last user let go: destroyed
    with pytest.raises(errors.PlanStateError, match="after release"):  # and a use after that fails loudly
        plan.cufft.execute(0, 0, 0)


def test_cufft_plan_of_a_call_in_flight_is_not_destroyed_under_it(monkeypatch):
    from nvdispatch.executors import cuda_fft

    x = torch.from_numpy(_x()).cuda()
    started, gate = threading.Event(), threading.Event()
    real = cuda_fft.CudaFFTPlan.execute

    def slow(self, operands, stream=None):
        started.set()
        assert gate.wait(20)
        return real(self, operands, stream)

    monkeypatch.setattr(cuda_fft.CudaFFTPlan, "execute", slow)
    out = {}

    def call():
        with nvdispatch.set_backend("cuda", only=True):
            out["y"] = nvdispatch.fft.fft(x)

    t = threading.Thread(target=call)
    t.start()
    assert started.wait(20)
    plan_cache.clear()  # the call is between lookup and cufftExec
    gate.set()
    t.join(20)
    np.testing.assert_allclose(out["y"].cpu().numpy(), np.fft.fft(x.cpu().numpy()), rtol=1e-4, atol=1e-3)
    assert plan_cache.stats()["in_use"] == 0  # released once the call let go


def test_cublaslt_plans_report_workspace_bytes_and_the_byte_bound_holds():
    a = torch.randn(512, 256, device="cuda")
    b = torch.randn(256, 384, device="cuda")
    bias = torch.randn(384, device="cuda")
    with nvdispatch.set_backend("cuda", only=True):
        for _ in range(2):
            nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    torch.cuda.synchronize()
    s = plan_cache.stats()
    assert s["size"] >= 1
    plan_cache.max_bytes = 0  # every plan holding a workspace must go (once unused)
    with nvdispatch.set_backend("cuda", only=True):
        r = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    torch.testing.assert_close(r, torch.relu(a @ b + bias), rtol=1e-4, atol=1e-3)
    s = plan_cache.stats()
    assert s["bytes"] <= s["max_bytes"] == 0 and s["in_use"] == 0


def test_device_out_of_memory_is_typed():
    free, total = torch.cuda.mem_get_info()
    n = int((total // 4) ** 0.5) + 1024  # an n x n float32 result larger than the whole GPU
    a = torch.ones(n, 1, device="cuda").expand(n, 1)
    b = torch.ones(1, n, device="cuda").expand(1, n)
    with pytest.raises(errors.OutOfMemoryError) as info:
        nvdispatch.matmul(a, b)
    assert isinstance(info.value, MemoryError) and info.value.__cause__ is not None


@pytest.mark.parametrize("backend", ["cuda", "torch"])
def test_zero_size_inputs_on_the_gpu_executors(backend):
    x = torch.zeros((0, 16), dtype=torch.complex64, device="cuda")
    with nvdispatch.set_backend(backend):
        y = nvdispatch.fft.fft(x)
        assert tuple(y.shape) == (0, 16) and y.device.type == "cuda"
        z = nvdispatch.fft.irfft(x)
        assert tuple(z.shape) == (0, 30)
        for a_shape, b_shape in [((0, 3), (3, 2)), ((2, 0), (0, 2))]:
            a, b = torch.ones(a_shape, device="cuda"), torch.ones(b_shape, device="cuda")
            r = nvdispatch.matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": torch.ones(2, device="cuda")})
            torch.testing.assert_close(r, torch.relu(a @ b + 1))


def test_zero_size_cai_operands_on_the_cuda_executor():
    pytest.importorskip("numba")
    from numba import cuda

    a = cuda.device_array((0, 4), dtype=np.float32)
    b = cuda.device_array((4, 3), dtype=np.float32)
    r = nvdispatch.matmul(a, b)
    assert tuple(r.shape) == (0, 3)
    x = cuda.device_array((0, 8), dtype=np.complex64)
    assert tuple(nvdispatch.fft.fft(x).shape) == (0, 8)
