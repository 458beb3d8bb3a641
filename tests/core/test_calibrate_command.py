"""``python -m nvdispatch calibrate``: its help, a small run keeping its result where NVDISPATCH_CACHE_DIR
says, and ``nvdispatch.calibration.calibrate`` (the same step from Python)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import nvdispatch
from nvdispatch.__main__ import main
from nvdispatch.calibration import calibrate
from nvdispatch.executors import numpy_fft_workers, numpy_matmul_calibration


def test_help_names_the_options(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["calibrate", "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    for option in ("--quick", "--shape", "--no-fft", "NVDISPATCH_CACHE_DIR"):
        assert option in out
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "calibrate" in capsys.readouterr().out


def test_bad_shape_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["calibrate", "--shape", "0", "2", "3"])
    assert stop.value.code == 2 and "--shape" in capsys.readouterr().err


def test_a_small_run_keeps_its_result(tmp_path):
    env = {**os.environ, "NVDISPATCH_CACHE_DIR": str(tmp_path)}
    cmd = [sys.executable, "-m", "nvdispatch", "calibrate", "--shape", "24", "16", "8", "--no-fft", "--quick"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    assert "matmul problem classes" in out.stdout and str(tmp_path) in out.stdout
    (name,) = [p for p in os.listdir(tmp_path) if p.endswith(".json")]
    data = json.loads((tmp_path / name).read_text())
    assert len(data["sections"]["matmul"]) == 2  # float32, RELU_BIAS and BIAS
    assert all(set(e) == {"order", "seconds"} for e in data["sections"]["matmul"].values())


def test_calibrate_from_python_with_persistence_off(monkeypatch):
    monkeypatch.setenv("NVDISPATCH_CACHE_DIR", "")
    monkeypatch.setattr(numpy_fft_workers, "_time_both", lambda fn, x: (1.0, 2.0))
    numpy_matmul_calibration.clear()  # (no class this process ran before is pending)
    try:
        report = calibrate([(20, 12, 8)], quick=True)
        assert report.path is None and "not kept" in str(report)
        assert len(report.matmul) == 2 and report.fft_min_work > 1e6
    finally:
        numpy_matmul_calibration.clear()
        numpy_fft_workers.clear()
        nvdispatch.plan_cache.clear()


def test_the_report_says_when_the_machine_was_busy():
    from nvdispatch.calibration import CalibrationReport

    assert "busy" in str(CalibrationReport({}, None, None, 1.0, load=1000.0))
    assert "busy" not in str(CalibrationReport({}, None, "/x", 1.0, load=0.0))


def test_without_scipy_the_fft_threshold_is_skipped_and_said_so(monkeypatch):
    """A base install (no SciPy) is told by explain() to calibrate: the run measures the matmul classes and says
    why the FFT threshold (scipy.fft's pocketfft threads) is not measured, instead of failing on the import."""
    import nvdispatch.calibration as calibration

    monkeypatch.setenv("NVDISPATCH_CACHE_DIR", "")
    monkeypatch.setattr(calibration, "_scipy_installed", lambda: False)
    monkeypatch.setattr(numpy_fft_workers, "calibrate", lambda *a, **k: pytest.fail("measured the FFT threshold"))
    numpy_matmul_calibration.clear()
    try:
        report = calibrate([(20, 12, 8)], quick=True)
        assert len(report.matmul) == 2 and report.fft_min_work is None
        assert "FFT threads threshold not measured: SciPy is not installed" in str(report)
    finally:
        numpy_matmul_calibration.clear()
        nvdispatch.plan_cache.clear()
