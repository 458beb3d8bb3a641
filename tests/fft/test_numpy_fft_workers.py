"""The CPU FFT's thread count (nvdispatch.executors.numpy_fft_workers): predicted from the transform's work by a
threshold calibrated once per machine and kept with the CPU calibration, never timed on a call; the plans'
direct path to pocketfft against NumPy's own results."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.fft

import nvdispatch
from nvdispatch._detect import CPU
from nvdispatch._fft_problem import FFTProblem
from nvdispatch.executors import numpy_fft_workers as workers
from nvdispatch.executors.cpu_calibration_store import store
from nvdispatch.executors.numpy_fft import NumpyFFTPlan


@pytest.fixture(autouse=True)
def _clean(monkeypatch, tmp_path):
    monkeypatch.setenv("NVDISPATCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(workers, "CPUS", 2)
    workers.clear()
    nvdispatch.plan_cache.clear()
    yield
    workers.clear()
    nvdispatch.plan_cache.clear()


def _problem(shape, axes, func="fftn", dtype="complex64"):
    lengths = tuple(shape[a] for a in axes)
    return FFTProblem("numpy", CPU, func, "c2c", "forward", dtype, dtype, dtype, shape, None,
                      axes, lengths, "backward", True)  # fmt: skip


def _never(*args, **kwargs):
    raise AssertionError("timed on a call")


def test_no_call_is_ever_timed(monkeypatch):
    monkeypatch.setattr(workers, "_time_both", _never)
    rng = np.random.default_rng(0)
    for shape in ((1000,), (7, 33), (64, 64), (3, 512, 8)):
        x = rng.standard_normal(shape)
        for fn in (nvdispatch.fft.fft, nvdispatch.fft.rfft, nvdispatch.fft.fftn):
            np.testing.assert_allclose(fn(x), getattr(np.fft, fn.__name__)(x), rtol=1e-10, atol=1e-9)


def test_the_default_threshold_until_calibrated():
    m = workers.model()
    assert m.source == "default" and m.min_work == workers.DEFAULT_MIN_WORK
    small, big = _problem((16, 16), (0, 1)), _problem((8, 512, 512), (1, 2))
    assert workers.work(small) < m.min_work <= workers.work(big)
    assert workers.workers_for(small)[0] == 1
    got, why = workers.workers_for(big)
    assert got == workers.ALL_CORES and "default threshold" in why


def test_what_needs_no_model():
    assert workers.workers_for(_problem((4096,), (0,)))[0] == 1  # one 1-D transform: nothing to split
    assert workers.workers_for(_problem((1, 4096), (1,)))[0] == 1
    side = int(workers.MAX_ELEMENTS**0.5) * 2
    assert workers.workers_for(_problem((side, side), (0, 1)))[0] == workers.ALL_CORES


def test_work_counts_precision_and_real_transforms():
    c64 = workers.work(_problem((8, 256), (1,)))
    assert c64 == pytest.approx(8 * 256 * 8)
    assert workers.work(_problem((8, 256), (1,), dtype="complex128")) == 2 * c64
    real = FFTProblem("numpy", CPU, "rfft", "r2c", "forward", "float32", "complex64", "complex64", (8, 256), None,
                      (1,), (256,), "backward", False)  # fmt: skip
    assert workers.work(real) == c64 / 2


def test_calibration_finds_the_crossover_and_keeps_it(monkeypatch):
    crossover = 2.0**17

    def fake(fn, x):  # all cores win from the crossover on
        return (1.0, 0.5) if workers._work_of(x, fn) >= crossover else (1.0, 1.5)

    monkeypatch.setattr(workers, "_time_both", fake)
    seen = []
    m = workers.calibrate(lambda it: seen.append(len(it)) or it)
    assert seen == [len(workers._LADDER)]
    assert m.source == "fresh" and crossover / 4 < m.min_work <= crossover
    assert workers.model() is m
    workers.clear()  # a later process: the threshold comes from the store
    kept = workers.model()
    assert kept.source == "persisted" and kept.min_work == m.min_work
    assert "calibrated threshold" in workers.workers_for(_problem((64, 512), (1,)))[1]


def test_threads_that_win_nowhere_on_the_ladder_are_used_only_past_it(monkeypatch):
    monkeypatch.setattr(workers, "_time_both", lambda fn, x: (1.0, 1.0))
    top = max(workers._work_of(x, fn) for rung in workers._LADDER for x, fn in workers._rung(rung, _pocketfft()))
    assert workers.calibrate().min_work == 2 * top
    workers.clear()
    assert workers.model().min_work == 2 * top
    assert workers.workers_for(_problem((8, 256, 256), (1, 2)))[0] == 1
    assert workers.workers_for(_problem((64, 512, 512), (1, 2)))[0] == workers.ALL_CORES
    monkeypatch.setattr(workers, "CPUS", 1)
    assert workers.calibrate().min_work == math.inf  # one core: nothing to split over


def _pocketfft():
    from scipy.fft import _pocketfft

    return _pocketfft


@pytest.mark.parametrize("entry", [{"min_work": "many"}, {"min_work": -1}, {"min_work": True}, ["min_work"], 3])
def test_a_damaged_threshold_is_ignored(entry):
    store().update("fft", {"threads": entry})
    workers.clear()
    assert workers.model().source == "default"


def test_plans_say_which_they_chose_and_give_numpys_results():
    rng = np.random.default_rng(0)
    for shape in ((16, 16), (256, 256)):
        x = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)
        got = nvdispatch.fft.fft2(x)
        np.testing.assert_allclose(got, np.fft.fft2(x), rtol=1e-4, atol=1e-3)
        steps = " ".join(nvdispatch.explain(nvdispatch.fft.fft2, x).steps)
        assert ("workers=1" in steps or "workers=-1" in steps) and "pocketfft on" in steps
    plan = NumpyFFTPlan(_problem((4, 8), (1,)), "scipy")
    assert plan.kwargs["workers"] in (1, workers.ALL_CORES)


_FUNCS = ["fft", "ifft", "rfft", "irfft", "hfft", "ihfft", "fftn", "ifftn", "rfftn", "irfftn", "fft2", "rfft2"]


@pytest.mark.parametrize("func", _FUNCS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("norm", [None, "ortho", "forward"])
def test_the_direct_path_gives_scipys_own_results(func, dtype, norm):
    """Planned calls go straight to pocketfft's compiled transforms; unaligned, byte-swapped or other-dtype
    arrays take scipy.fft's functions: every case as SciPy's own answer, in its dtype."""
    rng = np.random.default_rng(1)
    real = rng.standard_normal((6, 10)).astype(dtype)
    cplx = (real + 1j * rng.standard_normal((6, 10))).astype(np.result_type(dtype, np.complex64))
    x = real if func in ("rfft", "ihfft", "rfftn", "rfft2") else cplx
    fn = getattr(nvdispatch.fft, func)
    want = getattr(scipy.fft, func)(x, norm=norm)
    for arg in (x, x.copy(), x[:, ::-1], x.astype(x.dtype.newbyteorder(">")), _unaligned(x)):
        got = fn(arg, norm=norm) if norm else fn(arg)
        expect = getattr(scipy.fft, func)(arg, norm=norm)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(x, x.copy())  # (inputs are never written)


def _unaligned(x):
    raw = np.zeros(x.nbytes + 1, np.uint8)
    y = raw[1:].view(x.dtype).reshape(x.shape)
    y[...] = x
    assert not y.flags.aligned
    return y
