"""FFT on the GPU executors (raw cuFFT "cuda", "torch", "cupy") against numpy.fft; skipped without a GPU."""

from __future__ import annotations

import numpy as np
import pytest
from fft_reference import assert_close, expected_dtype, make, reference, to_numpy

import nvdispatch
import nvdispatch.fft as F
from nvdispatch.executors import ModularExecutor, builtin

pytestmark = pytest.mark.gpu


def _executor(name):
    ex = builtin(name)
    if ex is not None:
        return ex

    # the executor classes belong to the GPU-matmul work; stand in for them if this build lacks them
    class _Stand(ModularExecutor):
        frameworks = frozenset({"torch", "cupy", "cuda_array_interface", "dlpack"})
        device_kinds = frozenset({"cuda"})

    _Stand.name = name
    return _Stand()


CASES = [
    ("fft", (64, 128), "complex64", {}),
    ("fft", (64, 128), "complex128", {"axis": 0, "norm": "ortho"}),
    ("ifft", (8, 30, 5), "complex64", {"axis": 1}),
    ("fftn", (16, 12, 10), "complex64", {"axes": (0, 2), "norm": "forward"}),
    ("ifftn", (16, 12, 10), "complex128", {}),
    ("fftn", (4, 5, 6, 7), "complex64", {"axes": (1, 2, 3)}),
    ("fft", (32, 20), "complex64", {"n": 25}),
    ("fft", (32, 20), "float32", {}),
    ("rfft", (64, 100), "float32", {}),
    ("rfft", (64, 100), "float64", {"axis": 0, "n": 60}),
    ("irfft", (64, 51), "complex64", {}),
    ("irfft", (64, 51), "complex128", {"n": 101, "norm": "ortho"}),
    ("rfftn", (12, 10, 8), "float32", {"axes": (0, 1, 2)}),
    ("irfftn", (12, 10, 5), "complex64", {"axes": (0, 1, 2)}),
    ("irfftn", (12, 10, 5), "complex64", {"s": (6, 10, 9), "axes": (0, 1, 2)}),
    ("hfft", (16, 9), "complex64", {}),
    ("ihfft", (16, 9), "float64", {}),
]


def _frameworks():
    out = []
    try:
        import torch

        out.append(("torch", lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda()))
    except ImportError:
        pass
    try:
        import cupy

        out.append(("cupy", cupy.asarray))
    except ImportError:
        pass
    return out


FRAMEWORKS = _frameworks()


@pytest.mark.parametrize("executor", ["cuda", "torch", "cupy"])
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[2]}-{i}" for i, c in enumerate(CASES)])
@pytest.mark.parametrize("strided", [False, True])
def test_against_numpy(executor, case, strided):
    func, shape, dtype, kw = case
    for fw, to_dev in FRAMEWORKS:
        if executor in ("torch", "cupy") and fw != executor:
            continue
        sl = tuple(slice(None, None, 2) for _ in shape)
        x = make(tuple(2 * d for d in shape) if strided else shape, dtype)
        xd = to_dev(x)
        if strided:
            x, xd = x[sl], xd[sl]  # non-contiguous device view
        ref = reference(func, x, **kw)
        before = to_numpy(xd).copy()
        # the framework's own executor behind the tested one: a decline falls through to it
        with nvdispatch.set_backend(_executor(fw)), nvdispatch.set_backend(_executor(executor)):
            got = getattr(F, func)(xd, **kw)
        assert type(got).__module__.split(".")[0] == fw
        got = to_numpy(got)
        assert got.dtype == expected_dtype(func, dtype)
        assert_close(got, ref, dtype)
        np.testing.assert_array_equal(to_numpy(xd), before)  # never mutated (C2R copies its input)


def test_default_route_is_raw_cufft():
    for _fw, to_dev in FRAMEWORKS:
        x = to_dev(make((64, 128), "complex64"))
        e = nvdispatch.explain(F.fft, x)
        if builtin("cuda") is not None:
            assert e.executor == "cuda", str(e)
        e = nvdispatch.explain(F.fft, x, n=100)  # padding: declined by cuda, served by the framework
        assert e.executor in ("torch", "cupy"), str(e)


def test_numba_device_array_through_cuda():
    numba_cuda = pytest.importorskip("numba.cuda")
    x = make((32, 64), "complex64")
    d = numba_cuda.to_device(x)
    with nvdispatch.set_backend(_executor("cuda"), only=True):
        y = F.fft(d, norm="ortho")
        z = F.irfft(numba_cuda.to_device(make((32, 33), "complex64")))
    assert hasattr(y, "__cuda_array_interface__")
    assert_close(np.asarray(y.copy_to_host()), np.fft.fft(x.astype(np.complex128), norm="ortho"), "complex64")
    assert z.shape == (32, 64)


def test_streams_and_stateful_inplace():
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(make((256, 512), "complex64")).cuda()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with nvdispatch.set_backend(_executor("torch")), nvdispatch.set_backend(_executor("cuda")):
        y = F.fft(x, stream=s)
    s.synchronize()
    assert_close(y.cpu().numpy(), np.fft.fft(x.cpu().numpy().astype(np.complex128)), "complex64")
    ref = np.fft.fftn(x.cpu().numpy().astype(np.complex128), axes=(1,))
    with nvdispatch.set_backend(_executor("torch")), nvdispatch.set_backend(_executor("cuda")):
        with F.FFT(x, axes=(1,), options={"inplace": True}) as f:
            assert f.plan().execute() is x
            assert_close(x.cpu().numpy(), ref, "complex64")
            back = f.execute(direction="inverse")
            assert back is x


@pytest.mark.parametrize("fw", ["torch", "cupy"])
def test_scipy_backend_gpu_arrays(fw):
    sfft = pytest.importorskip("scipy.fft")
    mod = pytest.importorskip(fw)
    x = make((8, 32), "complex64")
    xd = mod.asarray(x, device="cuda") if fw == "torch" else mod.asarray(x)
    with sfft.set_backend(F):
        y = sfft.fft(xd)
    assert type(y).__module__.split(".")[0] == fw
    assert_close(to_numpy(y), np.fft.fft(x.astype(np.complex128)), "complex64")


def test_plans_are_cached():
    torch = pytest.importorskip("torch")
    x = torch.zeros((64, 256), dtype=torch.complex64, device="cuda")
    F.fft(x)
    before = nvdispatch.plan_cache.stats()["hits"]
    F.fft(x)
    assert nvdispatch.plan_cache.stats()["hits"] > before
