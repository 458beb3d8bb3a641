"""explain(), detection of operand frameworks, results in the caller's framework."""

from __future__ import annotations

import numpy as np
import pytest

import nvdispatch
from nvdispatch._detect import detect

torch = pytest.importorskip("torch")


def test_explain_names_executor_strategy_and_steps():
    a, b = np.ones((4, 3), np.float32), np.ones((3, 2), np.float32)
    kw = {"epilog": "RELU_BIAS", "epilog_inputs": {"bias": np.ones(2, np.float32)}}
    default = nvdispatch.explain(a, b, **kw)  # the NumPy executor's default is calibrated on this machine
    assert default.strategy == default.strategies[0]
    assert set(default.strategies) >= {"inplace", "plain"}
    e = nvdispatch.explain(a, b, **kw, preferences={"strategy": "inplace"})
    assert (e.executor, e.strategy) == ("numpy", "inplace")
    assert any("add_bias" in s for s in e.steps) and any("relu" in s for s in e.steps)
    assert "strategy 'inplace'" in str(e)
    t = nvdispatch.explain(
        torch.ones(4, 3), torch.ones(3, 2), epilog="RELU_BIAS", epilog_inputs={"bias": torch.ones(2)}
    )
    assert (t.executor, t.strategy) == ("torch", "framework_fused")
    assert "_addmm_activation" in t.steps[0] and not any("NaN" in s for s in t.steps)  # no extra NaN pass


def test_torch_cpu_gelu_is_not_fused_by_torch_because_its_cpu_gelu_is_exact():
    t = nvdispatch.explain(
        torch.ones(4, 3), torch.ones(3, 2), epilog="GELU_BIAS", epilog_inputs={"bias": torch.ones(2)}
    )
    assert t.strategy == "inplace"


def test_detect_frameworks_without_importing_them():
    info = detect("a", np.ones((2, 3), np.float32)[:, ::-1])
    assert (info.framework, info.device.kind, info.dtype, info.shape, info.strides) == (
        "numpy",
        "cpu",
        "float32",
        (2, 3),
        (3, -1),
    )
    t = detect("a", torch.ones(2, 3, dtype=torch.bfloat16).t())
    assert (t.framework, t.dtype, t.shape, t.strides) == ("torch", "bfloat16", (3, 2), (1, 3))


def test_dlpack_cpu_object_runs_on_numpy_executor():
    class Capsule:
        def __init__(self, arr):
            self._arr = arr

        def __dlpack__(self, **kw):
            return self._arr.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self._arr.__dlpack_device__()

    a, b = np.arange(6.0).reshape(2, 3), np.arange(12.0).reshape(3, 4)
    np.testing.assert_array_equal(nvdispatch.matmul(Capsule(a), Capsule(b)), a @ b)


def test_results_come_back_in_the_callers_framework():
    out = nvdispatch.matmul(
        torch.ones(2, 3, dtype=torch.float64), torch.ones(3, 2, dtype=torch.float64), epilog="RELU_AUX"
    )
    assert isinstance(out[0], torch.Tensor) and isinstance(out[1]["relu_aux"], torch.Tensor)
    assert isinstance(nvdispatch.matmul(np.ones((2, 3)), np.ones(3)), np.ndarray)
    assert type(nvdispatch.matmul(np.ones(3), np.ones(3))) is type(np.matmul(np.ones(3), np.ones(3)))  # a scalar


def test_zero_size_and_integer_and_half_results():
    assert nvdispatch.matmul(np.ones((0, 3)), np.ones((3, 4)), epilog="RELU").shape == (0, 4)
    np.testing.assert_array_equal(nvdispatch.matmul(np.ones((2, 0)), np.ones((0, 4))), np.zeros((2, 4)))
    r = nvdispatch.matmul(np.full((2, 2), 100, np.int8), np.full((2, 2), 1, np.int8))
    assert r.dtype == np.int8 and r[0, 0] == np.int8(200 - 256)  # wraps like np.matmul
    h = nvdispatch.matmul(torch.ones(2, 3, dtype=torch.bfloat16), torch.ones(3, 2, dtype=torch.bfloat16), epilog="GELU")
    assert h.dtype == torch.bfloat16


def test_main_module_reports_and_runs(capsys):
    from nvdispatch.__main__ import main

    assert main([]) == 0
    out = capsys.readouterr().out
    assert "frameworks" in out.lower() and "plan" in out.lower()


def test_main_module_copes_with_missing_packages():
    from nvdispatch._environment import version

    assert version("no_such_package_anywhere.bindings") is None
    assert version("no_such_package_anywhere") is None
