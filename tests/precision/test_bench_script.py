"""benchmarks/precision_bench.py where it cannot measure: its arguments checked and its plot of a results file
(--help and the one line with status 2 without a GPU: tests/release/test_scripts.py, as for every script)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from conftest import NVDISPATCH_PATH

BENCH = pathlib.Path(__file__).parents[2] / "benchmarks"
SRC = NVDISPATCH_PATH


def _run(*args: str, cwd) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(BENCH), str(SRC), os.environ.get("PYTHONPATH", "")]))
    script = str(BENCH / "precision_bench.py")
    return subprocess.run(
        [sys.executable, script, *args], capture_output=True, text=True, timeout=300, env=env, cwd=cwd
    )


def test_help_describes_the_modes(tmp_path):
    done = _run("--help", cwd=tmp_path)
    assert done.returncode == 0 and "--modes" in done.stdout and "autocast" in done.stdout


def test_bad_arguments_are_refused(tmp_path):
    for args in (["--modes", "tf64"], ["--shapes", "1x2"], ["--rounds", "0"]):
        done = _run("--out", str(tmp_path / "out"), *args, cwd=tmp_path)
        assert done.returncode == 2 and "error:" in done.stderr, args
    assert not (tmp_path / "out").exists()


def test_plot_redraws_a_results_file(tmp_path):
    pytest.importorskip("matplotlib")
    cell = {"mode": "tf32", "m": 4, "n": 4, "k": 4, "ratio": {"nvdispatch.matmul": 0.9}, "best_peer": "x"}
    path = tmp_path / "precision_bench.json"
    path.write_text(json.dumps({"device": "test", "goal": 1.0, "rounds": 1, "cells": [cell]}))
    done = _run("--plot", str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "precision_bench.png").stat().st_size > 0
