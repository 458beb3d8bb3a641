"""nvdispatch.show_config(): what a bug report carries, the same report the demo starts with."""

from __future__ import annotations

import io

import numpy as np
import pytest

import nvdispatch
from nvdispatch import _environment
from nvdispatch.errors import InvalidArgumentError


def test_prints_the_version_build_frameworks_and_executors(capsys):
    assert nvdispatch.show_config() is None
    out = capsys.readouterr().out
    assert out.startswith(f"nvdispatch {nvdispatch.__version__} on Python ")
    assert f"  numpy          {np.__version__}\n" in out
    assert "\nexecutors:\n  numpy  available\n" in out
    assert "\nGPUs: " in out and "repeated calls: " in out and "CPU calibration: " in out


def test_writes_to_a_given_stream(capsys):
    buffer = io.StringIO()
    nvdispatch.show_config(buffer)
    assert capsys.readouterr().out == ""
    assert buffer.getvalue() == str(_environment.environment()) + "\n"


@pytest.mark.parametrize("bad", ["stdout", 1, b"x"])
def test_a_file_without_write_is_a_typed_error(bad):
    with pytest.raises(InvalidArgumentError, match="file"):
        nvdispatch.show_config(bad)


def test_a_missing_framework_names_what_installs_it(monkeypatch):
    monkeypatch.setattr(_environment, "version", lambda mod: None if mod in ("torch", "dask_cuda") else "1.0")
    monkeypatch.setattr(_environment, "gpus", lambda: ["cuda:0 Some GPU"])
    report = str(_environment.environment())
    assert "  torch          not installed (pip install 'nvdispatch[torch]')\n" in report
    assert "  dask_cuda      not installed (pip install dask-cuda)\n" in report
    assert "\nGPUs: cuda:0 Some GPU\n" in report


def test_says_which_route_repeated_calls_take(monkeypatch):
    monkeypatch.setenv("NVDISPATCH_PURE_PYTHON", "1")
    assert _environment.environment().route == "Python (NVDISPATCH_PURE_PYTHON is set)"


@pytest.mark.parametrize(("where", "expected"), [("", "kept for this process only"), ("dir", "none yet")])
def test_says_where_the_calibration_is_kept(monkeypatch, tmp_path, where, expected):
    monkeypatch.setenv("NVDISPATCH_CACHE_DIR", str(tmp_path / where) if where else "")
    assert _environment.environment().calibration.startswith(expected)
