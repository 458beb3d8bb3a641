"""The CPU FFT's thread count (nvdispatch.executors.numpy_fft_workers): measured per transform shape, on the
shape itself or a copy with fewer batch rows, and never for what pocketfft cannot split or what is large enough
that waking threads costs nothing next to it."""

from __future__ import annotations

import time

import numpy as np
import pytest

import nvdispatch
from nvdispatch._detect import CPU
from nvdispatch._fft_problem import FFTProblem
from nvdispatch.executors import numpy_fft_workers as workers
from nvdispatch.executors.numpy_fft import NumpyFFTPlan


@pytest.fixture(autouse=True)
def _clean():
    workers.clear()
    nvdispatch.plan_cache.clear()
    yield
    workers.clear()
    nvdispatch.plan_cache.clear()


def _problem(shape, axes, func="fftn"):
    lengths = tuple(shape[a] for a in axes)
    return FFTProblem("numpy", CPU, func, "c2c", "forward", "complex64", "complex64", "complex64", shape, None,
                      axes, lengths, "backward", True)  # fmt: skip


def _fake_fft(seconds_one, seconds_all, calls):
    def fn(x, workers=None, **kwargs):
        calls.append((x.shape, workers))
        time.sleep(seconds_one if workers == 1 else seconds_all)
        return x

    return fn


@pytest.mark.parametrize(("one", "all_cores", "want"), [(2e-4, 0.0, workers.ALL_CORES), (0.0, 2e-4, 1)])
def test_the_faster_setting_is_kept_and_reused(one, all_cores, want):
    calls = []
    fn = _fake_fft(one, all_cores, calls)
    p = _problem((8, 16, 16), (1, 2))
    assert workers.workers_for(p, fn, {"axes": (1, 2)}) == want
    assert {w for _, w in calls} == {1, workers.ALL_CORES} and all(s == (8, 16, 16) for s, _ in calls)
    measured = workers.measurements()
    assert len(measured) == 1 and next(iter(measured.values()))["workers"] == want
    calls.clear()
    assert workers.workers_for(p, fn, {"axes": (1, 2)}) == want and not calls  # measured once per shape


def test_no_timing_for_a_single_1d_transform_or_a_huge_transformed_part():
    def never(*args, **kwargs):
        raise AssertionError("timed")

    assert workers.workers_for(_problem((4096,), (0,)), never, {}) == 1
    assert workers.workers_for(_problem((1, 4096), (1,)), never, {}) == 1
    side = int(workers.MAX_ELEMENTS**0.5) * 2
    assert workers.workers_for(_problem((side, side), (0, 1)), never, {}) == workers.ALL_CORES


def test_a_large_batch_is_timed_on_fewer_rows_with_every_transformed_length():
    calls = []
    rows = workers.MAX_ELEMENTS // 64 * 4
    workers.workers_for(_problem((rows, 64), (1,), "fft"), _fake_fft(0.0, 0.0, calls), {"axis": 1})
    shapes = {s for s, _ in calls}
    assert len(shapes) == 1
    (shape,) = shapes
    assert shape[1] == 64 and shape[0] * 64 <= workers.MAX_ELEMENTS


def test_plans_say_which_they_chose_and_give_numpys_results():
    rng = np.random.default_rng(0)
    for shape in ((16, 16), (256, 256)):
        x = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)
        got = nvdispatch.fft.fft2(x)
        np.testing.assert_allclose(got, np.fft.fft2(x), rtol=1e-4, atol=1e-3)
        steps = " ".join(nvdispatch.explain(nvdispatch.fft.fft2, x).steps)
        assert "workers=1" in steps or "workers=-1" in steps
    plan = NumpyFFTPlan(_problem((4, 8), (1,)), "scipy")
    assert plan.kwargs["workers"] in (1, workers.ALL_CORES)
