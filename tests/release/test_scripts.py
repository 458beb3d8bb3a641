"""Every script in benchmarks/ and examples/ has a command line (``--help`` works, an output folder is
``--out DIR``, never a positional surprise), and where this machine lacks what it needs (a GPU, an extra) it
says so in one line and exits with status 2 (benchmarks) or 0 (examples), never with a traceback. The CPU
benchmarks' ``--quick`` runs are in tests/core/test_benchmarks.py, the examples' runs in tests/core/test_examples.py."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from conftest import HAS_GPU, NVDISPATCH_PATH
from tests.subprocess_pool import result_of, start_runs

ROOT = pathlib.Path(__file__).parents[2]
BENCHMARKS = sorted(p for p in (ROOT / "benchmarks").glob("*.py") if not p.name.startswith("_"))
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
#: benchmarks that need an NVIDIA GPU (the others run on the CPU)
GPU_BENCHMARKS = {
    "autotune_bench.py", "compiled_mlp_bench.py", "convolve_bench.py", "convolve_launch_host.py", "device_fft_bench.py", "fft_callbacks_bench.py",
    "fft_gpu.py", "fp8_bench.py", "gpu_fft_host_bench.py", "gpu_host_profile.py", "gpu_matmul_bench.py", "jax_mlp_bench.py", "launch_host_mlp_callbacks.py", "lt_launch_bench.py",
    "precision_bench.py",
}  # fmt: skip
CPU_BENCHMARKS = {"cpu_matmul_bench.py", "dask_bench.py", "fft_cpu.py", "host_overhead_cpu.py", "host_overhead_wrapped.py",
                  "first_call_bench.py", "fft_shape_cost_bench.py", "scipy_signal_bench.py", "mlp_host_cpu.py",
                  "agreement_cost.py", "jax_staged_cost.py"}  # fmt: skip
# runs a script as `python SCRIPT` would (its folder first on sys.path), with the listed top-level modules made
# unimportable, as in a base install
_WITHOUT = (
    "import os, runpy, sys; sys.modules.update({m: None for m in sys.argv[1].split(',') if m}); "
    "script = sys.argv[2]; sys.argv = sys.argv[2:]; sys.path.insert(0, os.path.dirname(os.path.abspath(script))); "
    "runpy.run_path(script, run_name='__main__')"
)
OPTIONAL = "scipy,torch,cupy,numba,cuda,dask,distributed,jax,matplotlib,tqdm"


def _run(script: pathlib.Path, *args: str, without: str = "", cwd=None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([NVDISPATCH_PATH, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT, without, str(script), *args],
        capture_output=True, text=True, timeout=300, env=env, cwd=cwd or script.parent,
    )  # fmt: skip


def test_every_benchmark_is_classified():
    assert {p.name for p in BENCHMARKS} == GPU_BENCHMARKS | CPU_BENCHMARKS


@pytest.fixture(scope="module")
def help_runs(request):
    return start_runs(request, "test_help", lambda p, cwd: (_run(p["script"], "--help", cwd=cwd), cwd))


@pytest.mark.parametrize("script", BENCHMARKS + EXAMPLES, ids=[f"{p.parent.name}/{p.name}" for p in BENCHMARKS + EXAMPLES])
def test_help(script, help_runs, request):
    done, cwd = result_of(help_runs, request)  # (each in a fresh interpreter, in a folder of its own)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("usage:") and done.stderr == ""
    assert list(cwd.iterdir()) == [], "--help created files"
    if script.parent.name == "benchmarks":  # results go to --out DIR (default benchmarks/results), never a positional
        assert "--out" in done.stdout and "positional arguments" not in done.stdout


@pytest.mark.skipif(HAS_GPU, reason="on a GPU machine the GPU benchmarks would run")
@pytest.mark.parametrize("script", sorted(GPU_BENCHMARKS), ids=str)
@pytest.mark.parametrize("without", ["", OPTIONAL], ids=["this-machine", "base-install"])
def test_gpu_benchmark_on_a_cpu_machine_says_what_it_needs(script, without, gpu_script_runs, request):
    done, cwd = result_of(gpu_script_runs, request)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{script}: cannot run here: needs " in lines[0], done.stderr
    assert not (cwd / "out").exists()


@pytest.fixture(scope="module")
def gpu_script_runs(request):
    def run(p, cwd):
        return _run(ROOT / "benchmarks" / p["script"], "--out", str(cwd / "out"), without=p["without"], cwd=cwd), cwd

    return start_runs(request, "test_gpu_benchmark_on_a_cpu_machine_says_what_it_needs", run)


@pytest.mark.parametrize(
    "script, args, needs",
    [
        ("dask_bench.py", ["--quick"], "dask"),
        ("fft_cpu.py", ["--quick"], "SciPy"),
        ("mlp_host_cpu.py", ["--quick"], "torch"),
    ],
)
def test_cpu_benchmark_without_its_extra_says_what_it_needs(script, args, needs, tmp_path):
    done = _run(ROOT / "benchmarks" / script, *args, "--out", str(tmp_path), without=OPTIONAL, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert f"cannot run here: needs {needs}" in done.stderr


@pytest.mark.skipif(HAS_GPU, reason="on a GPU machine the --gpu run would start")
def test_dask_gpu_mode_on_a_cpu_machine_says_what_it_needs(tmp_path):
    done = _run(ROOT / "benchmarks" / "dask_bench.py", "--gpu", "--quick", "--out", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert len(done.stderr.strip().splitlines()) == 1 and "cannot run here" in done.stderr


def test_dask_benchmark_quick_run(tmp_path):
    pytest.importorskip("distributed")
    done = _run(ROOT / "benchmarks" / "dask_bench.py", "--quick", "--repeats", "1", "--out", str(tmp_path / "o"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "o" / "dask_bench.json").exists()


@pytest.mark.parametrize("script, results", [
    ("autotune_bench.py", "autotune_bench.json"),
    ("gpu_matmul_bench.py", "gpu_matmul_bench.json"),
    ("fp8_bench.py", "fp8_bench.json"),
])  # fmt: skip
def test_gpu_benchmark_replots_its_results_anywhere(script, results, tmp_path):
    pytest.importorskip("matplotlib")
    json_copy = tmp_path / results
    json_copy.write_bytes((ROOT / "benchmarks" / "results" / results).read_bytes())
    done = _run(ROOT / "benchmarks" / script, "--plot", str(json_copy), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json_copy.with_suffix(".png").stat().st_size > 0
