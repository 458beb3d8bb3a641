"""The CPU benchmark scripts finish what they start: a missing output folder is created, a missing matplotlib
skips the plot with a message (the JSON is written), and the GPU scripts at least import their helpers."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from conftest import NVDISPATCH_PATH
from tests.subprocess_pool import result_of, start_runs

BENCH = pathlib.Path(__file__).parents[2] / "benchmarks"
SRC = NVDISPATCH_PATH

# runs a benchmark script as __main__ with matplotlib (and tqdm) made unimportable
_WITHOUT = "import runpy, sys; sys.modules.update({m: None for m in sys.argv[1].split(',') if m}); " \
           "script = sys.argv[2]; sys.argv = sys.argv[2:]; runpy.run_path(script, run_name='__main__')"


def _run(script: str, args: list[str], without: str, cwd) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(BENCH), str(SRC), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT, without, str(BENCH / script), *args],
        capture_output=True, text=True, timeout=300, env=env, cwd=cwd,
    )


@pytest.mark.parametrize(
    "script, args, written",
    [
        ("cpu_matmul_bench.py", ["--quick", "--rounds", "2"], "cpu_matmul.json"),
        ("fft_cpu.py", ["--quick", "--repeats", "2"], "fft_cpu.json"),
        ("host_overhead_cpu.py", ["--quick"], "host_overhead_cpu.json"),
        ("fft_shape_cost_bench.py", ["--quick"], "fft_shape_cost.json"),
    ],
)
@pytest.mark.parametrize("without", ["", "matplotlib,tqdm"], ids=["bench-extra", "base-install"])
def test_cpu_benchmark_finishes(script, args, written, without, benchmark_runs, request):
    done, out = result_of(benchmark_runs, request)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((out / written).read_text())
    png = out / written.replace(".json", ".png")
    if without:
        assert "matplotlib is not installed" in done.stdout and "nvdispatch[bench]" in done.stdout
        assert not png.exists()
    else:
        assert png.stat().st_size > 0


@pytest.fixture(scope="module")
def benchmark_runs(request):
    def run(p, cwd):
        out = cwd / "new" / "dir"
        return _run(p["script"], [*p["args"], "--out", str(out)], p["without"], cwd), out

    return start_runs(request, "test_cpu_benchmark_finishes", run)


def test_save_plot_reports_a_failing_plot(tmp_path, capsys):
    sys.path.insert(0, str(BENCH))
    try:
        from _bench import save_plot
    finally:
        sys.path.remove(str(BENCH))

    def broken(plt):
        raise KeyError("no such series")

    assert save_plot(broken, tmp_path / "x.png") is False
    assert "failed: KeyError" in capsys.readouterr().out


def test_the_cublaslt_launch_benchmark_replots_its_committed_results(tmp_path):
    # the GPU script's measurements need an H200; its plot and argument handling run anywhere
    done = _run("lt_launch_bench.py",
                ["--out", str(tmp_path / "out"), "--replot", str(BENCH / "results" / "lt_launch_bench.json")], "", tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "lt_launch_bench.png").exists()
