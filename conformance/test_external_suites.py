"""NumPy's and SciPy's own tests, as shipped in the installed wheels, run through nvdispatch, each in a child
pytest with ``external_suites_plugin`` loaded (see README.md):

* ``numpy/fft/tests/test_pocketfft.py`` with ``numpy.fft`` replaced by ``nvdispatch.fft``;
* ``scipy/fft/tests/test_basic.py`` with ``nvdispatch.fft`` as ``scipy.fft``'s backend;
* ``numpy/_core/tests/test_multiarray.py::TestMatmul`` with ``numpy.matmul`` replaced by ``nvdispatch.matmul``.

Every test must pass, and nvdispatch must serve the calls (the fallback only what is outside its domain, for a
listed reason). A test that fails through a known gap is in ``XFAIL`` (strict: it fails once the gap is closed,
so that the entry is removed then); deselections, if ever needed, go in ``DESELECTED``. Both are listed and
justified in README.md."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

import nvdispatch

HERE = pathlib.Path(__file__).parent
SRC = pathlib.Path(nvdispatch.__file__).parents[1]

SUITES = {
    "numpy-fft": "numpy.fft.tests.test_pocketfft",
    "scipy-fft": "scipy.fft.tests.test_basic",
    "numpy-matmul": "numpy._core.tests.test_multiarray::TestMatmul",
}
#: test ids (the end of the child's node id) expected to fail, each with the gap that makes it fail
XFAIL: dict[str, dict[str, str]] = {
    "numpy-fft": {},
    "scipy-fft": {},
    "numpy-matmul": {},
}
#: test ids deselected, each justified in README.md
DESELECTED: dict[str, tuple[str, ...]] = {"numpy-fft": (), "scipy-fft": (), "numpy-matmul": ()}
#: why a call may fall through to NumPy's matmul ufunc (see external_suites_plugin.py)
MATMUL_DECLINES = re.compile(r"out= or other ufunc keywords|(bool|float128|complex256|object): not a dtype")


def _run_suite(suite: str, tmp_path) -> tuple[subprocess.CompletedProcess, dict]:
    counts = tmp_path / f"{suite}_counts.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(HERE), env.get("PYTHONPATH", "")])
    env["NVDISPATCH_SUITE"] = suite
    env["NVDISPATCH_SUITE_COUNTS"] = str(counts)
    env["NVDISPATCH_SUITE_XFAIL"] = json.dumps(XFAIL[suite])
    module = SUITES[suite]
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "external_suites_plugin"]
    args += ["--pyargs", module]
    for test_id in DESELECTED[suite]:
        args += ["--deselect", f"{module.split('::')[0].replace('.', '/')}.py::{test_id}"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    return done, (json.loads(counts.read_text()) if counts.exists() else {})


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_external_suite_passes_through_nvdispatch(suite, tmp_path):
    pytest.importorskip("scipy")
    done, counts = _run_suite(suite, tmp_path)
    tail = done.stdout[-4000:] + done.stderr[-2000:]
    assert done.returncode == 0, f"{SUITES[suite]} through nvdispatch failed:\n{tail}"
    summary = done.stdout.splitlines()[-1]
    assert " passed" in summary and not re.search(r"\d+ (failed|error)", summary), tail
    xfailed = re.search(r"(\d+) xfailed", summary)
    assert (int(xfailed.group(1)) if xfailed else 0) == len(XFAIL[suite]), tail
    served = sum(counts["served"].values())
    declined = sum(counts["declined"].values())
    print(f"{SUITES[suite]}: {summary}; calls served {served}, declined {declined}")
    assert served > 0, counts
    if suite == "numpy-matmul":  # only calls outside nvdispatch.matmul's domain go to NumPy's ufunc
        assert all(MATMUL_DECLINES.match(why) for why in counts["declined"]), counts["declined"]
    else:  # SciPy's own backend only gets what nvdispatch declines
        assert declined <= 0.01 * (served + declined), counts
