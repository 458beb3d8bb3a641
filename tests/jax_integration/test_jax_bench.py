"""benchmarks/jax_mlp_bench.py runs its whole course where no GPU is (``--allow-cpu``, tiny sizes), exits 2 with
one line where JAX sees no GPU, and redraws its plot from a results file."""

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


def _run(args, cwd):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(BENCH), str(SRC), os.environ.get("PYTHONPATH", "")]))
    env["JAX_PLATFORMS"] = "cpu"
    return subprocess.run([sys.executable, str(BENCH / "jax_mlp_bench.py"), *args], capture_output=True, text=True,
                          timeout=600, env=env, cwd=cwd)


def test_without_a_gpu_it_says_so_in_one_line_and_exits_2(tmp_path):
    done = _run(["--out", str(tmp_path / "out")], tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot run here: needs an NVIDIA GPU that JAX sees" in lines[0], done.stderr
    assert not (tmp_path / "out").exists()


def test_the_whole_course_on_the_cpu_and_the_replot(tmp_path):
    out = tmp_path / "new" / "dir"
    args = ["--allow-cpu", "--out", str(out), "--widths", "16", "--activations", "relu", "gelu", "--repeats", "1",
            "--inner", "1"]
    done = _run(args, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((out / "jax_mlp_bench.json").read_text())
    assert len(results["mlp"]) == 2 and len(results["fp32"]) == 2 and len(results["overhead"]) == 1
    for cell in results["mlp"] + results["fp32"] + results["overhead"]:
        assert "error" not in cell, cell.get("traceback")
    assert all(cell["loss_rel_diff"] < 1e-2 for cell in results["mlp"])  # the models train alike
    for cell in results["mlp"]:  # the chain model beside the per-layer one
        assert "ratio[fused_mlp]" in cell and ("ratio[fused_mlp[drelu]]" in cell) == (cell["activation"] == "relu")
    assert all(cell["nvdispatch_rel_err"] < 1e-5 for cell in results["fp32"])
    (out / "jax_mlp_bench.png").unlink(missing_ok=True)
    again = _run(["--replot", str(out / "jax_mlp_bench.json"), "--out", str(out)], tmp_path)
    assert again.returncode == 0 and (out / "jax_mlp_bench.png").exists() or "matplotlib is not installed" in again.stdout


@pytest.mark.parametrize("flag", ["--help"])
def test_help(flag, tmp_path):
    done = _run([flag], tmp_path)
    assert done.returncode == 0 and "XLA" in done.stdout


def test_autotune_operands_have_the_plans_layouts():
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(BENCH))
    try:
        from jax_mlp_bench import strided_tensor
    finally:
        sys.path.remove(str(BENCH))
    from nvdispatch._matmul_problem import ArraySig

    for sig in (ArraySig("bfloat16", (64, 32), (1, 64)), ArraySig("float32", (2, 6, 5), (48, 8, 1)),
                ArraySig("uint8", (6, 16), (16, 1))):
        t = strided_tensor(sig, torch.device("cpu"))
        assert tuple(t.shape) == sig.shape and tuple(t.stride()) == sig.strides and str(t.dtype) == f"torch.{sig.dtype}"
