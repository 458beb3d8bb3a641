"""Every example script runs to completion; one that cannot run here (no GPU, an extra not installed) says
why in one line, and the test skips with that reason. In a base install (the optional packages made
unimportable) each example either runs or names, in one line, the `pip install 'nvdispatch[X]'` it needs, and
exits with status 0: never a traceback."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

from conftest import NVDISPATCH_PATH
from tests.subprocess_pool import result_of, start_runs

ROOT = pathlib.Path(__file__).parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
OPTIONAL = ("scipy", "torch", "cupy", "numba", "cuda", "matplotlib", "tqdm")
# runs a script as __main__ with the listed top-level modules made unimportable, as in a base install
_WITHOUT = (
    "import runpy, sys; sys.modules.update({m: None for m in sys.argv[1].split(',') if m}); "
    "script = sys.argv[2]; sys.argv = sys.argv[2:]; runpy.run_path(script, run_name='__main__')"
)


def _run(script: pathlib.Path, without: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([NVDISPATCH_PATH, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT, ",".join(without), str(script)],
        capture_output=True, text=True, timeout=600, env=env, cwd=script.parent,
    )


@pytest.fixture(scope="module")
def example_runs(request):
    return start_runs(request, "test_example_runs", lambda p, _: _run(p["script"]))


@pytest.fixture(scope="module")
def base_install_runs(request):
    return start_runs(request, "test_example_says_which_extra_it_needs", lambda p, _: _run(p["script"], OPTIONAL))


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(script, example_runs, request):
    done = result_of(example_runs, request)
    skipped = re.search(r"^skipped: (.*)$", done.stdout, flags=re.M)
    if done.returncode == 0 and skipped:
        pytest.skip(f"{script.name}: {skipped.group(1)}")
    assert done.returncode == 0, f"{script.name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_says_which_extra_it_needs(script, base_install_runs, request):
    assert re.search(r"^Needs: ", script.read_text(), flags=re.M), f"{script.name}: no 'Needs:' line in its docstring"
    done = result_of(base_install_runs, request)
    assert "Traceback" not in done.stderr, f"{script.name} in a base install:\n{done.stderr[-3000:]}"
    assert done.returncode == 0, f"{script.name} in a base install:\n{done.stderr[-3000:]}"
    skipped = re.search(r"^skipped: (.*)$", done.stdout, flags=re.M)
    if skipped:  # it could not run: the one line names what to install
        assert re.search(r"needs.*(pip install 'nvdispatch\[\w+\]'|\[\w+\] extra)", skipped.group(1)), skipped.group(1)
