"""The launch sequence the cuFFT strategies of the GPU convolution share (``unfused``, ``cufft-lto``,
``cufft-lto-load``), on the CPU: fake cuFFT plans and a fake CUDA runtime record what each plan queues, in
order, so that where each strategy puts the multiply by ``h`` is pinned without a GPU (the results
themselves are checked against NumPy on a GPU: tests/fft/test_convolve_gpu.py)."""

from __future__ import annotations

import numpy as np
import pytest

from nvdispatch._adapters import CPU, OperandInfo
from nvdispatch._cuda import arrays, cufft, memory, runtime, streams
from nvdispatch._fft_convolve import build_convolve_problem
from nvdispatch.device import fft_filter
from nvdispatch.device.kernel_steps import ArrayArg
from nvdispatch.executors import cuda_fft_convolve as op
from nvdispatch.executors import cuda_fft_convolve_unfused as unfused

STREAM, SPECTRUM, X, OUT, H = 7, 1000, 3000, 2000, 4000


class FakeCufftPlan:
    """What the cuFFT plans of a convolution are asked for; every call lands in the test's log."""

    log: list = []
    fail_on: str | None = None
    alignment, span_bytes = 8, 0  # what cuFFT requires of the input pointer (X is aligned: no staging copy)

    def __init__(self, problem, strategy):
        fft = getattr(problem, "fft", problem)  # a CallbackFFTProblem or a plain FFTProblem
        self.name = f"{fft.direction}{'+callback' if fft is not problem else ''}"
        if self.name == self.fail_on:
            raise RuntimeError(f"{self.name} cannot plan here")
        self.device_index, self.workspace_bytes = 0, {"forward": 100}.get(fft.direction, 20)
        self.steps = (f"plan {self.name}", f"cufftExec {self.name}", "scale by 0.5", fft.describe())
        self.cufft = self
        self.log.append(("plan", self.name))

    def execute(self, src, dst, stream, direction):
        self.log.append(("exec", self.name, src, dst, stream, direction))

    def bind_data(self, operands, stream):
        self.log.append(("bind", self.name, operands, stream))

    def release(self):
        self.log.append(("release", self.name))


class FakeLauncher:
    """The launcher of the multiply kernel: records the steps it is given and each call's stream and pointers."""

    def __init__(self, steps, operands, device_index, several, what):
        self.steps, self.how = tuple(steps), "launched by the test"
        FakeCufftPlan.log.append(("launcher", len(self.steps), operands))

    def __call__(self, stream, pointers):
        FakeCufftPlan.log.append(("multiply", stream, tuple(pointers)))


class FakeScratch:
    def __init__(self, nbytes):
        self.ptr, self.nbytes = SPECTRUM, nbytes

    def release(self):
        FakeCufftPlan.log.append(("scratch released",))


@pytest.fixture
def log(monkeypatch):
    log: list = []
    monkeypatch.setattr(FakeCufftPlan, "log", log)
    monkeypatch.setattr(FakeCufftPlan, "fail_on", None)
    for module in (op, unfused):
        monkeypatch.setattr(module, "CudaFFTPlan", FakeCufftPlan)
    monkeypatch.setattr(op, "LtoCallbackPlan", FakeCufftPlan)
    monkeypatch.setattr(runtime, "bind_context", lambda dev: log.append(("context", dev)))
    monkeypatch.setattr(runtime, "device_count", lambda: 1)
    monkeypatch.setattr(streams, "stream_pointer", lambda stream, fw, dev: STREAM)

    def scratch(nbytes, fw, dev, stream):
        log.append(("scratch", nbytes, stream))
        return FakeScratch(nbytes)

    def empty(kind, shape, dtype, dev, stream):
        log.append(("result", kind, tuple(shape), dtype, stream))
        return "the result", OUT

    monkeypatch.setattr(memory, "scratch", scratch)
    monkeypatch.setattr(arrays, "view", lambda a, fw: type("View", (), {"ptr": X})())
    monkeypatch.setattr(arrays, "result_kind", lambda x, fw: "cai")
    monkeypatch.setattr(arrays, "empty", empty)
    # the multiply kernel of ``unfused``: its launch on the pointers of the spectrum and of h
    monkeypatch.setattr(unfused.UnfusedConvolvePlan, "_compile", lambda self: log.append(("compile multiply",)))
    monkeypatch.setattr(unfused, "StepLauncher", FakeLauncher)
    monkeypatch.setattr(arrays, "pointer_getter", lambda fw: {"h": H}.__getitem__)
    return log


def _problem(rows, n, dtype, per_signal=False):
    real = dtype.startswith("float")
    m = n // 2 + 1 if real else n
    hdtype = "complex64" if dtype in ("float32", "complex64") else "complex128"
    x = OperandInfo(None, "numpy", CPU, dtype, (rows, n), None)
    h = OperandInfo(None, "numpy", CPU, hdtype, (rows, m) if per_signal else (m,), None)
    return build_convolve_problem(x, h, "numpy", CPU, None, -1), m, np.dtype(hdtype).itemsize


def _run(plan):
    FakeCufftPlan.log.clear()
    assert plan.execute({"x": "x", "h": "h"}, "the caller's stream") == "the result"
    return list(FakeCufftPlan.log)


def test_cufft_lto_points_the_store_callback_at_h_before_the_forward(log):
    problem, m, item = _problem(4, 16, "complex64")
    plan = op.LtoConvolvePlan(problem, "cufft-lto")
    assert log == [("plan", "forward+callback"), ("plan", "inverse")]
    assert plan.spectrum_bytes == 4 * m * item and plan.workspace_bytes == 120
    assert _run(plan) == [
        ("context", 0),
        ("bind", "forward+callback", {"epilog_data": ("h",)}, STREAM),
        ("scratch", 4 * m * item, STREAM),
        ("exec", "forward+callback", X, SPECTRUM, STREAM, cufft.FORWARD),
        ("result", "cai", (4, 16), "complex64", STREAM),
        ("exec", "inverse", SPECTRUM, OUT, STREAM, cufft.INVERSE),
        ("scratch released",),
    ]
    assert plan.steps[0] == "plan forward+callback" and plan.steps[-1] == problem.describe()


def test_cufft_lto_load_points_the_load_callback_at_h_between_the_transforms(log):
    problem, m, item = _problem(3, 16, "float64")
    plan = op.LtoLoadConvolvePlan(problem, "cufft-lto-load")
    assert log == [("plan", "forward"), ("plan", "inverse+callback")]
    assert plan.spectrum_bytes == 3 * m * item
    assert _run(plan) == [
        ("context", 0),
        ("scratch", 3 * m * item, STREAM),
        ("exec", "forward", X, SPECTRUM, STREAM, cufft.FORWARD),
        ("bind", "inverse+callback", {"prolog_data": ("h",)}, STREAM),
        ("result", "cai", (3, 16), "float64", STREAM),
        ("exec", "inverse+callback", SPECTRUM, OUT, STREAM, cufft.INVERSE),
        ("scratch released",),
    ]
    assert "the load callback multiplies by h / 16: the inverse runs unnormalised" in plan.steps
    assert not any(s.startswith("scale by") for s in plan.steps)


@pytest.mark.parametrize("dtype,per_signal", [("complex128", False), ("float32", True)])
def test_unfused_multiplies_the_spectrum_in_place_between_the_transforms(log, dtype, per_signal):
    problem, m, item = _problem(5, 16, dtype, per_signal)
    plan = unfused.UnfusedConvolvePlan(problem, "unfused")
    assert log == [("plan", "forward"), ("plan", "inverse"), ("compile multiply",), ("launcher", 1, 2)]
    cdtype = "complex128" if dtype == "complex128" else "complex64"
    scale = np.float64(1 / 16) if dtype == "complex128" else np.float32(1 / 16)
    ran = _run(plan)
    assert ran == [
        ("context", 0),
        ("scratch", 5 * m * item, STREAM),
        ("exec", "forward", X, SPECTRUM, STREAM, cufft.FORWARD),
        ("multiply", STREAM, (SPECTRUM, H)),
        ("result", "cai", (5, 16), dtype, STREAM),
        ("exec", "inverse", SPECTRUM, OUT, STREAM, cufft.INVERSE),
        ("scratch released",),
    ]
    (step,) = plan.launcher.steps
    y, h, per_row, step_scale, real_n = step.args
    assert step.dispatcher is fft_filter.multiply_by_filter
    assert y == ArrayArg(0, (5, m), np.dtype(cdtype)) and h == ArrayArg(
        1, (5 if per_signal else 1, m), np.dtype(cdtype)
    )
    assert per_row == per_signal and step_scale == scale and type(step_scale) is type(scale)  # 1/n, working precision
    assert real_n == (16 if dtype == "float32" else 0)  # real signals: the DC and Nyquist products keep real parts
    assert step.grid == (1, 5) and step.block == (256,)


@pytest.mark.parametrize(
    "make,inverse",
    [
        (lambda p: op.LtoConvolvePlan(p, "cufft-lto"), "inverse"),
        (lambda p: op.LtoLoadConvolvePlan(p, "cufft-lto-load"), "inverse+callback"),
        (lambda p: unfused.UnfusedConvolvePlan(p, "unfused"), "inverse"),
    ],
)
def test_a_failed_inverse_plan_releases_the_forward_one(log, make, inverse):
    problem, _, _ = _problem(2, 16, "complex64")
    FakeCufftPlan.fail_on = inverse
    with pytest.raises(RuntimeError, match="cannot plan here"):
        make(problem)
    assert log[-1][0] == "release" and log[-1][1].startswith("forward")


def test_release_releases_both_transforms(log):
    plan = op.LtoLoadConvolvePlan(_problem(2, 16, "complex64")[0], "cufft-lto-load")
    log.clear()
    plan.release()
    assert log == [("release", "forward"), ("release", "inverse+callback")]
