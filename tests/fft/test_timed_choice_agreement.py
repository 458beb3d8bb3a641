"""The timed choice's result-agreement check, on the CPU: candidates whose result disagrees with the reference's
are rejected before timing (never chosen, a WARNING, ``explain()`` says why), those within rounding are kept,
and a reference that cannot run makes the model's first run unchecked. The GPU convolution's own check
(:func:`cuda_fft_convolve._result_check`) runs here through its device reads, with host memory standing in
for device memory at the runtime's copy (the one function that touches the driver). Results are checked
against NumPy float64 convolutions; no timing decides anything (the clock is the test's own)."""

from __future__ import annotations

import ctypes
import logging

import numpy as np
import pytest

from nvdispatch import _agreement, plan_cache
from nvdispatch._adapters import CPU, OperandInfo
from nvdispatch._agreement import ResultCheck, sample_host
from nvdispatch._cuda import result_sample, runtime
from nvdispatch._fft_convolve import build_convolve_problem
from nvdispatch.executors import cuda_fft_convolve as op
from nvdispatch.executors.timed_choice import Candidate, TimedChoicePlan

ENV = {"gpu": "Fake GPU", "cc": "9.0", "driver": 13000, "cufft": 12000, "nvdispatch": "0.1.0"}
RNG = np.random.default_rng(5)


@pytest.fixture(autouse=True)
def _no_tunings_left():
    plan_cache.clear_tunings()
    yield
    plan_cache.clear_tunings()


class Problem:
    def describe(self) -> str:
        return "convolve(the test's problem)"


RAN: list = []  # the labels of the plans run, in order (what the test's clock reads)


class ResultPlan:
    """A candidate returning ``compute(operands)``; counts its runs."""

    def __init__(self, label, compute, fail=None):
        self.label, self.compute, self.fail, self.runs, self.released = label, compute, fail, 0, False
        self.steps = (f"{label}: its own step", "convolve(the test's problem)")

    def execute(self, operands, stream=None):
        assert not self.released
        self.runs += 1
        RAN.append(self.label)
        if self.fail is not None:
            raise self.fail
        return self.compute(operands)

    def release(self):
        self.released = True


class Clock:
    def __init__(self, seconds):
        self.seconds = seconds

    def sample(self, run, calls):
        run()
        return calls * self.seconds[RAN[-1]]


def _convolve64(operands):
    x, h = operands["x"], operands["h"]
    return np.fft.ifft(np.fft.fft(x.astype(np.complex128), axis=-1) * h, axis=-1)


def _exact(operands):
    return _convolve64(operands).astype(operands["x"].dtype)


def _float32_path(operands):  # another correct computation: single precision throughout
    x, h = operands["x"], operands["h"]
    return np.fft.ifft(np.fft.fft(x, axis=-1) * h.astype(np.complex64), axis=-1).astype(np.complex64)


def _wrong_in_last_row(operands):
    y = _exact(operands)
    y[-1, y.shape[-1] // 2] += 0.5 * np.abs(y).max()  # a seam element of the last row
    return y


def _operands(rows=6, n=512):
    x = (RNG.standard_normal((rows, n)) + 1j * RNG.standard_normal((rows, n))).astype(np.complex64)
    h = np.fft.fft(RNG.standard_normal(n) / n).astype(np.complex64)
    return {"x": x, "h": h}


def _host_check(shape, n=512):
    def tolerance(expected, operands, stream):
        scale = max(_agreement.magnitude(expected), _agreement.magnitude(operands["x"]) * np.abs(operands["h"]).max())
        return _agreement.fft_tolerance("float32", n, scale)

    return ResultCheck("unfused", lambda result, stream: sample_host(result), tolerance, shape)


def _plan(computes: dict, seconds: dict, check, fail_make=()):
    made = {}

    def maker(label):
        def make():
            if label in fail_make:
                raise RuntimeError(f"{label} cannot plan here")
            made[label] = ResultPlan(label, *computes[label]) if isinstance(computes[label], tuple) else ResultPlan(
                label, computes[label]
            )
            return made[label]

        return make

    cands = [Candidate(label, maker(label), float(i + 1)) for i, label in enumerate(computes)]
    plan = TimedChoicePlan(
        Problem(), "timed", cands, environment=ENV, clock_for=lambda o, s: Clock(seconds), check=check
    )
    return plan, made


def test_a_candidate_wrong_in_one_element_of_the_last_row_is_rejected(caplog):
    operands = _operands()
    computes = {"four-step": _wrong_in_last_row, "device-fused": _float32_path, "unfused": _exact}
    seconds = {"four-step": 1e-4, "device-fused": 2e-4, "unfused": 3e-4}
    plan, made = _plan(computes, seconds, _host_check(operands["x"].shape))
    with caplog.at_level(logging.WARNING, logger="nvdispatch"):
        got = plan.execute(operands)
    assert plan.chosen == "device-fused"  # the fastest is wrong: the next fastest runs
    np.testing.assert_allclose(got, _convolve64(operands), rtol=1e-4, atol=1e-4 * np.abs(got).max())
    assert made["four-step"].released
    assert set(plan.rejected) == {"four-step"}
    rejection = plan.rejected["four-step"]
    assert rejection.reference == "unfused" and rejection.error > rejection.tolerance
    assert rejection.where == f"[5, {512 // 2}]"  # the element that was made wrong
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "four-step" in warnings[0].getMessage() and "convolve(the test's problem)" in warnings[0].getMessage()
    assert any(line.startswith("rejected four-step: its result differs from unfused's") for line in plan.steps)
    assert "four-step" not in plan.tuning()["us"]  # never timed


def test_candidates_within_rounding_are_kept():
    operands = _operands()
    computes = {"device-fused": _float32_path, "cufft-lto": _exact, "unfused": _float32_path}
    seconds = {"device-fused": 3e-4, "cufft-lto": 1e-4, "unfused": 2e-4}
    plan, _ = _plan(computes, seconds, _host_check(operands["x"].shape))
    plan.execute(operands)
    assert plan.rejected == {}
    assert plan.chosen == "cufft-lto"
    assert set(plan.tuning()["us"]) == {"device-fused", "cufft-lto", "unfused"}


def test_the_check_runs_when_the_choice_is_made_not_per_call():
    operands = _operands()
    computes = {"device-fused": _float32_path, "unfused": _exact}
    plan, made = _plan(computes, {"device-fused": 1e-4, "unfused": 2e-4}, _host_check(operands["x"].shape))
    plan.execute(operands)
    runs = made["device-fused"].runs
    for _ in range(3):
        plan.execute(operands)
    assert made["device-fused"].runs == runs + 3


@pytest.mark.parametrize("how", ["run", "plan"])
def test_a_reference_that_cannot_run_leaves_the_models_first_unchecked(how, caplog):
    operands = _operands()
    fails = RuntimeError("cuFFT refused")
    computes = {"four-step": _wrong_in_last_row, "unfused": (_exact, fails if how == "run" else None)}
    plan, made = _plan(
        computes, {"four-step": 1e-4, "unfused": 2e-4}, _host_check(operands["x"].shape),
        fail_make=("unfused",) if how == "plan" else (),
    )
    with caplog.at_level(logging.WARNING, logger="nvdispatch"):
        plan.execute(operands)
    assert plan.chosen == "four-step" and plan.how == "model" and plan.tuning() is None
    assert "could not be checked: the reference unfused failed" in plan.steps[0]
    assert any("could not be checked" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


def test_a_candidate_failing_when_checked_is_left_out():
    operands = _operands()
    computes = {"device-fused": (_exact, RuntimeError("launch failed")), "unfused": _exact}
    plan, _ = _plan(computes, {"device-fused": 1e-4, "unfused": 2e-4}, _host_check(operands["x"].shape))
    plan.execute(operands)
    assert plan.chosen == "unfused"
    assert any(line.startswith("left out device-fused: failed when checked") for line in plan.steps)


def test_nan_where_the_reference_is_finite_is_a_disagreement():
    operands = _operands()

    def nan_at_the_end(ops):
        y = _exact(ops)
        y[-1, -1] = np.nan
        return y

    plan, _ = _plan({"pairs": nan_at_the_end, "unfused": _exact}, {"pairs": 1e-4, "unfused": 2e-4},
                    _host_check(operands["x"].shape))
    plan.execute(operands)
    assert plan.chosen == "unfused" and "pairs" in plan.rejected


# -- the GPU convolution's check, through its device reads ------------------------------------------------
class HostAsDevice:
    """A host array offered as device memory (the CUDA array interface): the runtime's copy is faked below."""

    def __init__(self, array):
        self.array = np.ascontiguousarray(array)
        self.__cuda_array_interface__ = {
            "shape": self.array.shape,
            "typestr": self.array.dtype.str,
            "data": (self.array.ctypes.data, False),
            "strides": None,
            "version": 3,
        }


@pytest.fixture
def host_memory_copies(monkeypatch):
    """``runtime.copy_to_host`` reading host memory: the driver boundary, faked (pitch honoured)."""
    copies = []

    def copy_to_host(dst, src, stream, pitch=None):
        step = pitch or dst.itemsize
        for i in range(len(dst)):
            ctypes.memmove(dst.ctypes.data + i * dst.itemsize, src + i * step, dst.itemsize)
        copies.append(len(dst))
        return dst

    monkeypatch.setattr(runtime, "copy_to_host", copy_to_host)
    return copies


def _gpu_problem(rows, n, dtype):
    real = dtype.startswith("float")
    x = OperandInfo(None, "numpy", CPU, dtype, (rows, n), None)
    h = OperandInfo(None, "numpy", CPU, "complex64" if dtype in ("float32", "complex64") else "complex128",
                    (n // 2 + 1 if real else n,), None)
    return build_convolve_problem(x, h, "numpy", CPU, None, -1)


def _device_results(monkeypatch, problem, computes):
    monkeypatch.setattr(op, "environment", lambda device_index: ENV)
    monkeypatch.setattr(op, "_clock_for", lambda problem, dev: lambda o, s: Clock(
        {label: 1e-4 * (i + 1) for i, label in enumerate(computes)}))
    monkeypatch.setattr(op, "TIMING_MIN_BYTES", 0)
    monkeypatch.setattr(runtime, "current_device", lambda: 0)
    monkeypatch.setattr(
        op, "candidates",
        lambda p: [Candidate(label, lambda label=label: ResultPlan(label, computes[label]), float(i))
                   for i, label in enumerate(computes)],
    )
    return op._timed_plan(problem, None)


def _real_operands(rows, n, dtype):
    x = RNG.standard_normal((rows, n)).astype(dtype)
    h = np.fft.rfft(RNG.standard_normal(n)).astype(np.result_type(dtype, np.complex64))
    return x, h


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_convolution_check_reads_samples_from_device_memory(monkeypatch, host_memory_copies, dtype, caplog):
    rows, n = 5, 4096
    problem = _gpu_problem(rows, n, dtype)
    x, h = _real_operands(rows, n, dtype)
    exact = np.fft.irfft(np.fft.rfft(x.astype(np.float64), axis=-1) * h, n, axis=-1)

    def unfused(ops):  # single precision where the problem is: another rounding than exact's
        return HostAsDevice(np.fft.irfft(np.fft.rfft(x, axis=-1) * h, n, axis=-1).astype(dtype))

    def correct(ops):
        return HostAsDevice(exact.astype(dtype))

    def bad_seam(ops):  # a four-step with a wrong index: the last row's first quarter seam is off by one
        y = exact.astype(dtype)
        y[-1, n // 4] = y[-1, n // 4 - 1]
        return HostAsDevice(y)

    computes = {"four-step": bad_seam, "device-fused": correct, "unfused": unfused}
    plan = _device_results(monkeypatch, problem, computes)
    operands = {"x": HostAsDevice(x), "h": HostAsDevice(h)}
    with caplog.at_level(logging.WARNING, logger="nvdispatch"):
        got = plan.execute(operands, 0)
    assert set(plan.rejected) == {"four-step"}
    assert plan.rejected["four-step"].where == f"[{rows - 1}, {n // 4}]"
    assert plan.chosen == "device-fused"
    np.testing.assert_allclose(got.array, exact, atol=1e-4 * np.abs(exact).max())
    assert host_memory_copies and max(host_memory_copies) <= _agreement.SWEEP  # only the sample came back
    assert sum(host_memory_copies) < x.size // 4


def test_the_convolution_check_is_in_the_timed_plan_and_compares_with_unfused(monkeypatch):
    problem = _gpu_problem(4, 2048, "complex64")
    check = op._result_check(problem, 0)
    assert check.reference == "unfused" and check.shape == (4, 2048)


def test_device_reader_reads_strided_runs_and_bfloat16(host_memory_copies):
    a = np.arange(40, dtype=np.float32).reshape(5, 8)
    read = result_sample.device_reader(a.ctypes.data, "float32", (8, 1), 0)
    np.testing.assert_array_equal(read(_agreement.Run((4,), 1, 3, 3)), [33, 36, 39])
    backwards = result_sample.device_reader(a.ctypes.data + 7 * 4, "float32", (8, -1), 0)  # a[:, ::-1]
    np.testing.assert_array_equal(backwards(_agreement.Run((1,), 0, 2, 4)), [15, 13, 11, 9])
    halves = (a.view(np.uint32) >> 16).astype(np.uint16)
    bf16 = result_sample.device_reader(halves.ctypes.data, "bfloat16", (8, 1), 0)
    np.testing.assert_array_equal(bf16(_agreement.Run((2,), 0, 1, 8)), a[2])  # small ints are exact in bf16


def test_the_sample_covers_first_middle_and_last_rows_and_both_ends():
    shape = (3, 7, 1000)
    picked = {(r.first, r.start, r.count) for r in _agreement.runs(shape)}
    firsts = {r.first for r in _agreement.runs(shape)}
    assert {(0, 0), (2, 6), (1, 3)} <= firsts
    assert ((2, 6), 0, _agreement.EDGE) in picked and ((2, 6), 1000 - _agreement.EDGE, _agreement.EDGE) in picked
    assert _agreement.runs((0, 5)) == () and _agreement.runs(()) != ()
