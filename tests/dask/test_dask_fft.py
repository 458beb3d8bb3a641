"""nvdispatch.fft on Dask arrays against numpy.fft in float64/complex128: every function, transformed axes
chunked and not (pencil/slab stages for several chunked axes), on the synchronous scheduler and on a
2-process LocalCluster; fftfreq/rfftfreq with chunks, lazy fftshift."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
from dask_reference import chunking, close
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nvdispatch
import nvdispatch.fft as F

ONE_D = ["fft", "ifft", "rfft", "irfft", "hfft", "ihfft"]
N_D = ["fftn", "ifftn", "rfftn", "irfftn"]
REAL_IN = {"rfft", "ihfft", "rfftn"}


@st.composite
def cases(draw):
    func = draw(st.sampled_from(ONE_D + N_D))
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(2, 7)) for _ in range(ndim))
    dtype = draw(st.sampled_from(["float32", "float64"] if func in REAL_IN else ["complex64", "complex128", "float64"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = rng.standard_normal(shape)
    if dtype.startswith("complex"):
        x = x + 1j * rng.standard_normal(shape)
    x = x.astype(dtype)
    chunks = tuple(draw(chunking(s, 3)) for s in shape)
    norm = draw(st.sampled_from(["backward", "ortho", "forward"]))
    kwargs = {"norm": norm}
    if func in ONE_D:
        kwargs["axis"] = draw(st.integers(-ndim, ndim - 1))
        if draw(st.booleans()):
            kwargs["n"] = draw(st.integers(2, 9))
    else:
        if draw(st.booleans()):
            axes = draw(st.permutations(range(ndim)))[: draw(st.integers(1, ndim))]
            kwargs["axes"] = tuple(axes)
            if draw(st.booleans()):
                kwargs["s"] = tuple(draw(st.integers(2, 8)) for _ in axes)
    return func, x, chunks, kwargs


def _check(case, dask_compute):
    func, x, chunks, kwargs = case
    x0 = x.copy()
    X = da.from_array(x, chunks=chunks)
    got = getattr(F, func)(X, **kwargs)
    assert isinstance(got, da.Array)
    want = getattr(np.fft, func)(x.astype(np.complex128 if x.dtype.kind == "c" else np.float64), **kwargs)
    (value,) = dask_compute(got)
    precision = "32" if x.dtype in (np.float32, np.complex64) else "64"
    assert value.dtype.kind == want.dtype.kind and str(value.dtype).endswith(
        precision if value.dtype.kind == "f" else ("64" if precision == "32" else "128")
    )
    assert got.dtype == value.dtype and got.shape == want.shape
    close(value, want, value.dtype, f"{func}{kwargs} chunks {chunks}")
    np.testing.assert_array_equal(x, x0)


@settings(max_examples=80, deadline=None)
@given(cases())
def test_fft_sync(case):
    _check(case, lambda *xs: dask.compute(*xs, scheduler="sync"))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_fft_local_cluster(case, dask_client):
    _check(case, lambda *xs: dask_client.compute(list(xs), sync=True))


@pytest.mark.parametrize("func", ONE_D + N_D)
def test_every_function_chunked_and_unchunked(func, dask_compute):
    rng = np.random.default_rng(0)
    x = (
        rng.standard_normal((6, 8))
        if func in REAL_IN
        else rng.standard_normal((6, 8)) + 1j * rng.standard_normal((6, 8))
    )
    ref = getattr(np.fft, func)(x)
    unchunked = da.from_array(x, chunks=(2, 8))  # the transformed (last) axis whole: blockwise, no rechunk
    chunked = da.from_array(x, chunks=(4, 3))
    got = dask_compute(getattr(F, func)(unchunked), getattr(F, func)(chunked))
    close(got[0], ref, got[0].dtype, "unchunked")
    close(got[1], ref, got[1].dtype, "chunked")


def test_one_d_unchunked_axis_is_blockwise_and_keeps_chunks():
    x = da.from_array(np.ones((8, 16), np.complex64), chunks=(2, 16))
    y = F.fft(x)
    assert y.chunks == x.chunks
    assert "rechunk" not in str(nvdispatch.explain(F.fft, x))


def test_explain_names_the_rechunk_and_its_cost():
    x = da.from_array(np.ones((64, 64), np.complex64), chunks=(16, 16))
    text = str(nvdispatch.explain(F.fftn, x))
    assert "2 stage(s)" in text
    assert "rechunk x" in text and "all-to-all" in text and "KiB" in text
    assert "first block: executor 'numpy'" in text


def test_pencil_decomposition_never_makes_one_block():
    """fft2 of a 2-D array chunked on both axes: each stage keeps blocks no larger than the input's."""
    x = da.from_array(np.ones((4096, 512), np.complex64), chunks=(1024, 128))  # 1 MiB blocks
    y = F.fftn(x)
    assert max(y.chunks[0]) * max(y.chunks[1]) * 8 <= 1 << 20
    plan = nvdispatch.explain(F.fftn, x)
    stages = [s for s in plan.steps if s.startswith("stage") and "nvdispatch.fft" in s]
    assert len(stages) == 2
    for s in stages:
        assert "on each of 1 blocks" not in s


def test_fftfreq_with_chunks(dask_compute):
    for n, chunks in ((1, 1), (7, 3), (8, 2), (10, 4)):
        f, r = F.fftfreq(n, d=0.25, chunks=chunks), F.rfftfreq(n, d=0.25, chunks=chunks, dtype=np.float32)
        assert isinstance(f, da.Array) and r.dtype == np.float32
        got = dask_compute(f, r)
        np.testing.assert_allclose(got[0], np.fft.fftfreq(n, 0.25))
        np.testing.assert_allclose(got[1], np.fft.rfftfreq(n, 0.25), rtol=1e-6)
    with pytest.raises(nvdispatch.errors.InvalidArgumentError):
        F.fftfreq(4, chunks=(1, 1))


def test_fftshift_is_lazy(dask_compute):
    x = np.arange(35.0).reshape(5, 7)
    X = da.from_array(x, chunks=(2, 3))
    s, i = F.fftshift(X), F.ifftshift(X, axes=(1,))
    assert isinstance(s, da.Array) and isinstance(i, da.Array)
    got = dask_compute(s, i)
    np.testing.assert_array_equal(got[0], np.fft.fftshift(x))
    np.testing.assert_array_equal(got[1], np.fft.ifftshift(x, axes=(1,)))


def test_stateful_fft_and_scipy_backend_take_dask_arrays(dask_compute):
    import scipy.fft

    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 10)) + 1j * rng.standard_normal((6, 10))
    X = da.from_array(x, chunks=(3, 4))
    with F.FFT(X, axes=(0, 1)) as f:
        f.plan()
        y = f.execute()
        z = f.execute(direction="inverse")
    with scipy.fft.set_backend(F):
        w = scipy.fft.fft2(X)
    got = dask_compute(y, z, w)
    close(got[0], np.fft.fft2(x), "complex128")
    close(got[1], np.fft.ifft2(x), "complex128")
    close(got[2], np.fft.fft2(x), "complex128")


def test_worker_plan_caches_serve_fft_blocks(dask_client):
    from nvdispatch.executors.dask import worker_plan_cache_stats

    before = dask_client.run(worker_plan_cache_stats)
    x = da.from_array(np.ones((64, 32), np.complex64), chunks=(4, 32))
    close(dask_client.compute(F.fft(x), sync=True), np.fft.fft(np.ones((64, 32))), "complex64")
    after = dask_client.run(worker_plan_cache_stats)
    assert sum(s["hits"] for s in after.values()) > sum(s["hits"] for s in before.values())


def test_integer_input_is_promoted_lazily(dask_compute):
    x = np.arange(24).reshape(4, 6)
    X = da.from_array(x, chunks=(2, 4))
    y = F.fft(X)
    assert isinstance(y, da.Array) and y.dtype == np.complex128
    (got,) = dask_compute(y)
    close(got, np.fft.fft(x), "complex128")


@pytest.mark.parametrize("x_chunks", [2, (2, 8), -1])
@pytest.mark.parametrize("h_dask", [False, True])
def test_convolve_is_lazy_and_right_for_any_chunking(x_chunks, h_dask):
    rng = np.random.default_rng(31)
    r = rng.standard_normal((4, 8)).astype(np.float32)
    h = np.fft.rfft(rng.standard_normal(8)).astype(np.complex64)
    y = nvdispatch.fft.convolve(da.from_array(r, chunks=x_chunks), da.from_array(h, chunks=2) if h_dask else h)
    assert isinstance(y, da.Array) and y.dtype == np.float32
    want = np.fft.irfft(np.fft.rfft(r.astype(np.float64)) * h, 8)
    np.testing.assert_allclose(y.compute(scheduler="sync"), want, rtol=1e-5, atol=1e-5)
    z = (rng.standard_normal((8, 4)) + 1j * rng.standard_normal((8, 4))).astype(np.complex128)
    hz = np.fft.fft(rng.standard_normal((12, 1)), axis=0)
    got = nvdispatch.fft.convolve(da.from_array(z, chunks=x_chunks), hz, n=12, axis=0)
    want = np.fft.ifft(np.fft.fft(z, 12, axis=0) * hz, axis=0)
    np.testing.assert_allclose(got.compute(scheduler="sync"), want, rtol=1e-10, atol=1e-10)
