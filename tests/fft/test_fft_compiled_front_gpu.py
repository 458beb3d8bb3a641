"""The cuFFT launch compiled (src/nvdispatch/_hotpath_cufft.c) and the transforms' compiled front on the GPU:
Torch CUDA tensors and CuPy arrays, repeated calls against numpy.fft in float64, the caller's stream, CUDA-graph
capture; the Python launch (an install without the extension) computes the same. Skipped without a GPU."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest

import nvdispatch
import nvdispatch.fft as F
from nvdispatch import errors
from nvdispatch._adapters import call_key_classes
from nvdispatch._compiled import hotpath
from nvdispatch.executors import cuda_fft
from nvdispatch.fft import _route

pytestmark = pytest.mark.gpu

COMPILED = hotpath() is not None


@pytest.fixture(autouse=True)
def fresh():
    nvdispatch.reset_backends()
    nvdispatch.plan_cache.clear()
    call_key_classes.clear()
    yield
    nvdispatch.reset_backends()
    nvdispatch.plan_cache.clear()


@pytest.fixture(params=["compiled", "python"])
def launcher(request, monkeypatch):
    """The cuFFT plans' direct call: compiled, or the Python launch (``hotpath`` absent when plans are made)."""
    if request.param == "compiled" and not COMPILED:
        pytest.skip("the extension is not built here")
    if request.param == "python":
        monkeypatch.setattr(cuda_fft, "hotpath", lambda: None)
    return request.param


def _x(shape=(16, 16), dtype=np.complex64, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def _close(got, want, dtype):
    single = np.dtype(dtype) in (np.complex64, np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-4 if single else 1e-10, atol=1e-4 if single else 1e-10)


def _torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU (none found)")
    return torch


def _cupy():
    cupy = pytest.importorskip("cupy")
    try:
        cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001
        pytest.skip("needs an NVIDIA GPU (none found)")
    return cupy


def _frameworks():
    return ["torch", "cupy"]


def _to(framework, x):
    if framework == "torch":
        torch = _torch()
        return torch.from_numpy(x.copy()).cuda(), lambda r: r.cpu().numpy(), torch.Tensor
    cupy = _cupy()
    return cupy.asarray(x), cupy.asnumpy, cupy.ndarray


def _plan_of(name, a, **kw):
    """The cached cuFFT plan a repeated call runs (explain names it; the plan cache holds it)."""
    plans = [e.plan for e in nvdispatch.plan_cache._lru if isinstance(e.plan, cuda_fft.CudaFFTPlan)]  # noqa: SLF001
    assert plans, f"{name} ran on {nvdispatch.explain(getattr(F, name), a, **kw).executor}"
    return plans[-1]


@pytest.mark.parametrize("framework", _frameworks())
@pytest.mark.parametrize(
    "name, dtype, kw",
    [
        ("fft2", np.complex64, {}),
        ("fft", np.complex128, {"axis": 0}),
        ("ifft2", np.complex64, {}),  # scaled by 1/n in place on the stream
        ("fft", np.complex64, {"norm": "ortho"}),
        ("rfft2", np.float32, {}),
        ("rfft", np.float64, {"norm": "forward"}),
        ("ifftn", np.complex128, {"axes": (0,)}),
    ],
)
def test_repeated_calls_run_the_cufft_launch_with_numpy_results(launcher, framework, name, dtype, kw):
    x = _x((16, 24), dtype)
    a, back, cls = _to(framework, x)
    want = getattr(np.fft, name)(x.astype(np.complex128 if x.dtype.kind == "c" else np.float64), **kw)
    for _ in range(4):
        got = getattr(F, name)(a, **kw)
        assert isinstance(got, cls)
        _close(back(got), want, dtype)
    assert nvdispatch.explain(getattr(F, name), a, **kw).executor == "cuda"
    plan = _plan_of(name, a, **kw)
    kind = type(plan.direct).__name__
    assert kind == ("builtin_function_or_method" if launcher == "compiled" else "_Launch")
    assert sum(len(e.users) for e in nvdispatch.plan_cache._lru) == 0  # noqa: SLF001 - every call let go
    _close(back(a), x, dtype)  # the input is never written


@pytest.mark.parametrize("framework", _frameworks())
def test_fft_execute_runs_the_direct_launch(launcher, framework):
    x = _x()
    a, back, _ = _to(framework, x)
    with F.FFT(a, axes=(0, 1)) as f:
        f.plan()
        for _ in range(3):
            _close(back(f.execute()), np.fft.fft2(x.astype(np.complex128)), np.complex64)
        _close(back(f.execute(direction="inverse")), np.fft.ifft2(x.astype(np.complex128)), np.complex64)
        y = _x(seed=5)
        f.reset_operand(_to(framework, y)[0])
        _close(back(f.execute()), np.fft.fft2(y.astype(np.complex128)), np.complex64)


def test_torch_calls_follow_the_current_stream(launcher):
    torch = _torch()
    x = _x()
    t = torch.from_numpy(x).cuda()
    want = np.fft.fft2(x.astype(np.complex128))
    F.fft2(t)
    plan = _plan_of("fft2", t)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for _ in range(2):
        for s in streams:
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                got = F.fft2(t)
                assert plan.cufft.stream == s.cuda_stream  # queued on the caller's stream
            s.synchronize()
            _close(got.cpu().numpy(), want, np.complex64)
    got = F.fft2(t)
    assert plan.cufft.stream == torch.cuda.current_stream().cuda_stream
    _close(got.cpu().numpy(), want, np.complex64)


def test_cupy_calls_follow_the_current_stream(launcher):
    cupy = _cupy()
    x = _x()
    c = cupy.asarray(x)
    F.fft2(c)
    plan = _plan_of("fft2", c)
    with cupy.cuda.Stream() as s:
        got = F.fft2(c)
        assert plan.cufft.stream == s.ptr
        s.synchronize()
    _close(cupy.asnumpy(got), np.fft.fft2(x.astype(np.complex128)), np.complex64)


def test_an_explicit_stream_takes_the_route_and_runs_there(launcher, monkeypatch):
    torch = _torch()
    x = _x()
    t = torch.from_numpy(x).cuda()
    runs = []
    real = _route._run
    monkeypatch.setattr(_route, "_run", lambda *a, **k: runs.append(k.get("stream")) or real(*a, **k))
    for _ in range(3):
        F.fft2(t)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    got = F.fft2(t, stream=s)
    assert runs[-1] is s
    assert _plan_of("fft2", t).cufft.stream == s.cuda_stream
    s.synchronize()
    _close(got.cpu().numpy(), np.fft.fft2(x.astype(np.complex128)), np.complex64)


@pytest.mark.parametrize("how", ["fft2", "FFT.execute", "ifft2"])
def test_calls_captured_in_a_cuda_graph_replay_on_new_data(launcher, how):
    torch = _torch()
    x = _x()
    t = torch.from_numpy(x).cuda()
    f = F.FFT(t, axes=(0, 1)).plan()
    call = {"fft2": lambda: F.fft2(t), "ifft2": lambda: F.ifft2(t), "FFT.execute": f.execute}[how]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up on a side stream, as Torch's capture recipe does
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = call()
    y = _x(seed=9)
    t.copy_(torch.from_numpy(y))
    g.replay()
    torch.cuda.synchronize()
    oracle = np.fft.ifft2 if how == "ifft2" else np.fft.fft2
    _close(out.cpu().numpy(), oracle(y.astype(np.complex128)), np.complex64)
    f.free()


def test_the_compiled_and_the_python_launch_agree_bit_for_bit():
    if not COMPILED:
        pytest.skip("the extension is not built here")
    torch = _torch()
    t = torch.from_numpy(_x((32, 48))).cuda()
    F.fft2(t)
    plan = _plan_of("fft2", t)
    with mock.patch.object(cuda_fft, "hotpath", lambda: None):
        python = plan._direct_call()
    assert isinstance(python, cuda_fft._Launch)
    assert torch.equal(plan.direct(t), python(t))


def test_a_released_plans_direct_call_raises_the_plan_error():
    if not COMPILED:
        pytest.skip("the extension is not built here")
    torch = _torch()
    t = torch.from_numpy(_x()).cuda()
    F.fft2(t)
    plan = _plan_of("fft2", t)
    direct = plan.direct
    nvdispatch.plan_cache.clear()  # nobody uses it: released
    with pytest.raises(errors.PlanStateError):
        direct(t)
