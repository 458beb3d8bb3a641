"""benchmarks/convolve_bench.py without a GPU: the cells of ``--groups`` in the order given, the marks that make
a cell where nvdispatch loses to a peer (or misses issue #30's 1.5x) visible in its line, the closing list and
the README table, the route's own timings read from ``explain()``, the budget rule and ``--resume``."""

from __future__ import annotations

import importlib
import json
import pathlib
from types import SimpleNamespace

import pytest

BENCH = pathlib.Path(__file__).parents[2] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module("convolve_bench")


def _cell(bench, batch, n, dtype, cupy, torch, share=0.3, strategy="four-step"):
    r = {
        "batch": batch, "n": n, "dtype": dtype, "group": dtype, "strategy": strategy, "hbm_floor_share": share,
        "speedup_over_cupy": cupy, "speedup_over_torch": torch, "us": {"nvdispatch": 100.0, "cupy": 100.0 * cupy,
        "torch": 100.0 * torch},
    }  # fmt: skip
    r.update(bench.verdict(r))
    return r


def test_groups_run_in_the_order_given(bench):
    cells = bench.cells(False, ("complex128", "table"))
    assert [c["group"] for c in cells] == ["complex128"] * 5 + ["table"] * 4
    assert {c["dtype"] for c in bench.cells(False)} == {"complex64", "complex128", "float32", "float64"}
    assert max(c["n"] for c in bench.cells(False)) == 1 << 20
    assert max(c["batch"] * c["n"] for c in bench.cells(False)) == 1 << 26
    assert [c["group"] for c in bench.cells(True, ("float64",))] == ["table"] * 4


def test_a_cell_that_loses_is_marked_and_listed(bench, capsys):
    loses = _cell(bench, 1024, 16384, "complex128", 0.88, 1.2, strategy="unfused")
    short = _cell(bench, 256, 65536, "float32", 1.6, 1.44)
    good = _cell(bench, 65536, 1024, "complex64", 2.9, 2.6, share=0.65, strategy="device-fused")
    assert loses["loses_to"] == ["cupy"] and loses["below_goal"] == ["cupy", "torch"]
    assert short["loses_to"] == [] and short["below_goal"] == ["torch"]
    assert good["below_goal"] == [] and good["below_floor_goal"] is True  # 65% of the floor, goal 70%
    for r, mark in ((loses, "LOSES to cupy"), (short, "<1.5x vs torch"), (good, None)):
        r.update(first_call_s=1.0, max_rel_error={"nvdispatch": 1e-7}, route_us={}, route_choice="chose x, ...")
        bench.print_cell(r)
        line = capsys.readouterr().out.splitlines()[0]
        assert (mark in line) if mark else ("LOSES" not in line and "<1.5x" not in line)
    summary = {"cells": [loses, short, good, {"batch": 64, "n": 1 << 20, "dtype": "float64", "error": "E"}],
               "skipped": ["16x1048576 complex64"]}  # fmt: skip
    text = "\n".join(bench.findings(summary))
    assert "LOSES to a peer (< 1.0x): 1024x16384 complex128 (unfused, x0.88/1.20 CuPy/Torch)" in text
    assert "below the 1.5x goal: 256x65536 float32" in text
    assert "HBM floor at 65536x1024 complex64: 65% (goal 70%: NOT met)" in text
    assert "failed: 64x1048576 float64" in text and "skipped" in text and "16x1048576 complex64" in text


def test_the_readme_table_marks_slower_cells(bench, tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"cells": [_cell(bench, 1024, 16384, "complex128", 0.88, 1.6)], "skipped": []}))
    row = bench.markdown([str(path)]).splitlines()[-1]
    assert "**0.88 (slower)**" in row and "| 1.60 |" in row


def test_the_routes_own_timings_come_from_explain(bench):
    timed = SimpleNamespace(
        strategy="timed",
        steps=("chose four-step 16x4096 cols 8x16: the fastest when timed here (median us per call: four-step "
               "16x4096 cols 8x16 299.5, unfused 470.0, device-fused ept=16 1e3)", "model ..."),
    )  # fmt: skip
    assert bench.route_timings(timed) == {"four-step 16x4096 cols 8x16": 299.5, "unfused": 470.0,
                                          "device-fused ept=16": 1000.0}  # fmt: skip
    assert bench.chosen_strategy(timed) == "four-step 16x4096 cols 8x16"
    untimed = SimpleNamespace(strategy="timed", steps=("chose unfused, the model's first (tiny)",))
    assert bench.route_timings(untimed) == {} and bench.chosen_strategy(untimed) == "unfused"


def test_a_cell_starts_only_while_the_longest_so_far_fits(bench):
    assert bench.fits(0.0, 0.0, None) and bench.fits(100.0, 60.0, 170.0)
    assert not bench.fits(120.0, 60.0, 170.0)


def test_resume_keeps_measured_cells_and_runs_the_rest(bench, tmp_path):
    todo = bench.cells(False, ("table",))
    path = tmp_path / "r.json"
    assert bench.resumed(str(path), todo) == ([], todo)  # no file yet
    done = {**todo[0], "speedup_over_cupy": 2.0}
    failed = {**todo[1], "error": "RuntimeError: x"}
    path.write_text(json.dumps({"cells": [done, failed], "skipped": ["1024x16384 complex64"]}))
    kept, left = bench.resumed(str(path), todo)
    assert kept == [done] and left == todo[1:]
    path.write_text("{damaged")
    assert bench.resumed(str(path), todo) == ([], todo)
