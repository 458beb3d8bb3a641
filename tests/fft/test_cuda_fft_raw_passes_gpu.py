"""The raw cuda executor's prepared transforms on the GPU with the framework-free passes forced (``namespace_for``
answers None, as for a Numba-only user): cudaMemsetAsync, strided cudaMemcpy2DAsync/cudaMemcpy3DAsync and cuBLAS
?scal around cuFFT, for operands known only by ``__cuda_array_interface__``/DLPack (made by CuPy, else Torch) and
Numba device arrays, against numpy.fft on the host copy; skipped without a GPU. The CPU emulation of the same passes:
test_cuda_fft_raw_passes.py."""

from __future__ import annotations

import numpy as np
import pytest
from fft_reference import assert_close, make, reference
from test_cuda_fft_prepared_gpu import CASES, HELPER, IDS, TO_DEVICE, CaiOnly, _check, _host, _wrap_cai, _wrap_dlpack

import nvdispatch
import nvdispatch.fft as F

pytestmark = pytest.mark.gpu
needs_arrays = pytest.mark.skipif(HELPER is None, reason="CuPy or Torch makes the device arrays of these tests")


@pytest.fixture
def raw(monkeypatch):
    """No CuPy/Torch helper for the array passes: the framework-free passes run them."""
    from nvdispatch._cuda import raw_calls, xp

    why = raw_calls.unavailable()
    if why:
        pytest.skip(why)
    monkeypatch.setattr(xp, "namespace_for", lambda framework: None)
    nvdispatch.plan_cache.clear()  # plans made with a helper earlier in the session
    yield
    nvdispatch.plan_cache.clear()


def _raw_route(xd, func, **kw):
    with nvdispatch.set_backend("cuda", only=True):
        e = nvdispatch.explain(getattr(F, func), xd, **kw)
    assert e.executor == "cuda" and "raw device passes" in str(e), str(e)


@needs_arrays
@pytest.mark.parametrize("wrap", ["cai", "dlpack"])
@pytest.mark.parametrize("norm", ["backward", "ortho", "forward"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_raw_passes_against_numpy(raw, case, norm, wrap):
    func, shape, dtype, kw = case
    x = make(shape, dtype)
    xd = (_wrap_cai if wrap == "cai" else _wrap_dlpack)(x)
    if func not in ("fft2", "ifft2"):
        _raw_route(xd, func, norm=norm, **kw)
    _check(func, x, xd, kw, norm, dtype)


@pytest.mark.parametrize("norm", ["backward", "ortho"])
@pytest.mark.parametrize("case", CASES[::3], ids=IDS[::3])
def test_numba_device_arrays(raw, case, norm):
    numba_cuda = pytest.importorskip("numba.cuda")
    func, shape, dtype, kw = case
    x = make(shape, dtype)
    _check(func, x, numba_cuda.to_device(np.ascontiguousarray(x)), kw, norm, dtype)


LAYOUT_CALLS = [
    ("fft", {"n": 48}),
    ("fft", {"axis": 0}),
    ("ifft", {"n": 20, "axis": 0, "norm": "ortho"}),
    ("hfft", {"n": 30}),
    ("ihfft", {"norm": "forward"}),
    ("ihfft", {"n": 50}),
    ("fftn", {"s": (20, 30), "axes": (0, 1)}),
    ("rfft", {"n": 64, "norm": "ortho"}),
    ("irfft", {"n": 70}),
]


@needs_arrays
def test_strided_transposed_and_misaligned_operands(raw):
    """Views as they lie: every other row and column, a transpose, a real view one element into complex data."""
    base = make((32, 80), "float32")
    zbase = make((40, 40), "complex64")
    dev, zdev = TO_DEVICE(base), TO_DEVICE(zbase)
    views = [
        ("strided", base[::2, 1::2], CaiOnly(dev[::2, 1::2])),
        ("transposed", base.T, CaiOnly(dev.T)),
        ("complex transposed", zbase.T[:, 3:], CaiOnly(zdev.T[:, 3:])),
    ]
    if HELPER == "cupy":
        views.append(("imag view", zbase.imag, CaiOnly(zdev.imag)))
    for name, x, xd in views:
        for func, kw in LAYOUT_CALLS:
            if func in ("ihfft", "rfft") and np.iscomplexobj(x):
                continue
            with nvdispatch.set_backend("cuda", only=True):
                got = _host(getattr(F, func)(xd, **kw))
            try:
                assert_close(got, reference(func, x, **kw), x.dtype.name)
            except AssertionError as exc:
                raise AssertionError(f"{name} {func} {kw}: {exc}") from exc
            np.testing.assert_array_equal(_host(xd), x)  # never written


@needs_arrays
def test_batches_that_take_3d_copies(raw):
    x = make((16, 33, 40), "float64")
    xd = _wrap_cai(x)
    for func, kw in [("fft", {"n": 50, "axis": 1}), ("fftn", {"s": (40, 48), "axes": (1, 2)}),
                     ("hfft", {"n": 60, "axis": 1}), ("ifft", {"axis": 0, "n": 20})]:  # fmt: skip
        with nvdispatch.set_backend("cuda", only=True):
            got = _host(getattr(F, func)(xd, **kw))
        assert_close(got, reference(func, x, **kw), "float64")


@needs_arrays
def test_on_a_side_stream(raw):
    """The passes are queued on the caller's stream, in order with the transform."""
    if HELPER == "cupy":
        import cupy

        s = cupy.cuda.Stream(non_blocking=True)
        handle, sync = s.ptr, s.synchronize
    else:
        import torch

        s = torch.cuda.Stream()
        handle, sync = s.cuda_stream, s.synchronize
    x = make((64, 500), "float32")
    xd = _wrap_cai(x)
    with nvdispatch.set_backend("cuda", only=True):
        got = F.hfft(xd, n=1200, norm="ortho", stream=handle)
        sync()
    assert_close(_host(got), reference("hfft", x, n=1200, norm="ortho"), "float32")


@needs_arrays
def test_explain_names_the_raw_passes_and_the_plan_is_cached(raw):
    x = make((16, 40), "float32")
    xd = _wrap_cai(x)
    with nvdispatch.set_backend("cuda", only=True):
        e = nvdispatch.explain(F.fft, xd, n=64, norm="ortho")
        text = str(e)
        for words in ("raw device passes", "cudaMemcpy2DAsync", "widened to complex64", "scale by 0.125"):
            assert words in text, (words, text)
        F.fft(xd, n=64, norm="ortho")
        assert nvdispatch.explain(F.fft, xd, n=64, norm="ortho").cached
