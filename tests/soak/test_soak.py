"""The soak run (tests/soak/soak.py) in a subprocess: bounded (NVDISPATCH_SOAK_SECONDS, default 10 s of load,
well under a minute in all on a 2-core machine), fixed seeds, and every invariant checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import NVDISPATCH_PATH

pytest.importorskip("torch")

SOAK = Path(__file__).with_name("soak.py")


def test_soak_threads_tasks_interrupts_and_cache_churn():
    seconds = float(os.environ.get("NVDISPATCH_SOAK_SECONDS", "10"))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([NVDISPATCH_PATH, env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(SOAK), "--seconds", str(seconds), "--seed", "0"],
        capture_output=True,
        text=True,
        timeout=seconds + 50,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["calls"] > 100, report
    assert report["wrong"] == [] and report["errors"] == [], report
    assert report["violations"] == [], "a released plan was executed"
    assert report["bound_violations"] == [], "the cache exceeded its bounds"
    assert report["interrupts_caught"] > 10, report  # the interrupts really landed
    # a pin can only be lost to an interrupt landing between pin and let-go (a leak, never a use-after-free)
    assert report["in_use_after_clear"] <= report["interrupts_caught"], report
    assert report["final_call_ok"], report
    assert report["leaked_state"] == [], report  # no thread, task or the interrupted main thread kept a backend
