"""Every ```python block of README.md runs as written, each in a fresh interpreter, as a user copying it would.

A block whose first line says "needs a GPU" must still exit cleanly without one (it says what it needs and
stops); a block that stops on a missing optional package (an extra that is not installed) skips, naming the
package.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

from conftest import HAS_GPU, NVDISPATCH_PATH
from tests.subprocess_pool import result_of, start_runs

ROOT = pathlib.Path(__file__).parents[2]
BLOCKS = re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), flags=re.S | re.M)
OPTIONAL = ("torch", "cupy", "numba", "scipy", "matplotlib", "tqdm", "cuda", "dask", "distributed", "dask_cuda", "jax")


def _line_of(block: str) -> int:
    text = (ROOT / "README.md").read_text()
    return text[: text.index(block)].count("\n") + 1


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 6


def _run(block: str, cwd) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([NVDISPATCH_PATH, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, timeout=300, env=env, cwd=cwd)


@pytest.fixture(scope="module")
def block_runs(request):
    return start_runs(request, "test_readme_block_runs", lambda p, cwd: _run(p["block"], cwd))


@pytest.mark.parametrize("block", BLOCKS, ids=[f"README.md:{_line_of(b)}" for b in BLOCKS])
def test_readme_block_runs(block, block_runs, request):
    needs_gpu = "needs a GPU" in block.splitlines()[0] and not HAS_GPU
    done = result_of(block_runs, request)  # each in a fresh interpreter, in an empty folder of its own
    missing = re.search(r"ModuleNotFoundError: No module named '([\w.]+)'", done.stderr)
    if done.returncode and missing and missing.group(1).split(".")[0] in OPTIONAL:
        pytest.skip(f"the block needs {missing.group(1)}, which is not installed")
    assert done.returncode == 0, f"README block at line {_line_of(block)} failed:\n{done.stdout}\n{done.stderr}"
    if needs_gpu:  # without a GPU the block says so and stops, without a traceback
        assert "skipped: needs" in done.stdout and not done.stderr.strip(), done.stdout + done.stderr
        pytest.skip(f"the block needs an NVIDIA GPU: {done.stdout.strip()}")
