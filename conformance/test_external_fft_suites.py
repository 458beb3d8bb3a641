"""NumPy's ``numpy/fft/tests/test_pocketfft.py`` and SciPy's ``scipy/fft/tests/test_basic.py`` (as shipped in
the installed wheels) run through nvdispatch, each in a child pytest with ``fft_suites_plugin`` loaded (see
README.md): every test must pass, and nvdispatch must serve the calls (SciPy's fallback only what it declines).
Deselections, if ever needed, are listed and justified in README.md and passed with ``--deselect``."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

import nvdispatch

HERE = pathlib.Path(__file__).parent
SRC = pathlib.Path(nvdispatch.__file__).parents[1]

#: test ids (relative to the suite's module) deselected, each justified in README.md
DESELECTED: dict[str, tuple[str, ...]] = {"numpy": (), "scipy": ()}
SUITES = {"numpy": "numpy.fft.tests.test_pocketfft", "scipy": "scipy.fft.tests.test_basic"}


def _run_suite(suite: str, tmp_path) -> tuple[subprocess.CompletedProcess, dict]:
    counts = tmp_path / f"{suite}_counts.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(HERE), env.get("PYTHONPATH", "")])
    env["NVDISPATCH_FFT_SUITE"] = suite
    env["NVDISPATCH_FFT_SUITE_COUNTS"] = str(counts)
    module = SUITES[suite]
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "fft_suites_plugin"]
    args += ["--pyargs", module]
    for test_id in DESELECTED[suite]:
        args += ["--deselect", f"{module.replace('.', '/')}.py::{test_id}"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    return done, (json.loads(counts.read_text()) if counts.exists() else {})


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_external_fft_suite_passes_through_nvdispatch(suite, tmp_path):
    pytest.importorskip("scipy")
    done, counts = _run_suite(suite, tmp_path)
    tail = done.stdout[-4000:] + done.stderr[-2000:]
    assert done.returncode == 0, f"{SUITES[suite]} through nvdispatch failed:\n{tail}"
    assert " passed" in done.stdout and "failed" not in done.stdout.splitlines()[-1], tail
    served = sum(counts["served"].values())
    declined = sum(counts["declined"].values())
    print(f"{SUITES[suite]}: {done.stdout.splitlines()[-1]}; calls served {served}, declined {declined}")
    # most calls are run by nvdispatch; SciPy's own backend only gets what nvdispatch declines
    assert served > 0 and declined <= 0.01 * (served + declined), counts
