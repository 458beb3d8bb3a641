"""benchmarks/fp8_bench.py without a GPU: its arguments (``--help``, the issue's ``--vs-scaled-mm`` mode) and its
figures, redrawn from results files (the committed overview, and a comparison's JSON shape)."""

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


def _run(*args, cwd):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(BENCH), str(SRC), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, str(BENCH / "fp8_bench.py"), *args], capture_output=True, text=True, timeout=120, env=env, cwd=cwd
    )


def test_help_names_the_issues_comparison(tmp_path):
    done = _run("--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for flag in ("--vs-scaled-mm", "--shapes", "--modes", "--scales", "--rounds", "--regime", "--plot"):
        assert flag in done.stdout
    bad = _run(str(tmp_path), "--shapes", "8192x8192", cwd=tmp_path)
    assert bad.returncode != 0 and "MxNxK" in bad.stderr


def test_both_figures_redraw_from_their_json(tmp_path):
    pytest.importorskip("matplotlib")
    overview = tmp_path / "fp8_bench.json"
    overview.write_text((BENCH / "results" / "fp8_bench.json").read_text())
    cell = {"m": 8192, "n": 8192, "k": 8192, "mode": "fast"}
    ratios = {"nvdispatch.matmul (host scales)": 0.95, "nvdispatch, autotuned plan": 0.93}
    comparison = tmp_path / "fp8_vs_scaled_mm.json"
    comparison.write_text(
        json.dumps({"device": "H200", "goal": 0.97, "rounds": 15, "regime": "burst",
                    "cells": [{**cell, "ratio_vs_scaled_mm_relu": ratios}, {**cell, "mode": "default",
                                                                            "ratio_vs_scaled_mm_relu": ratios}]})
    )  # fmt: skip
    for path in (overview, comparison):
        done = _run("--plot", str(path), cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert path.with_suffix(".png").stat().st_size > 0
