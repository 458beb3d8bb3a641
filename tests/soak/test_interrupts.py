"""The interrupt soak (tests/soak/interrupts.py, #27): KeyboardInterrupts at every kind of point a Ctrl-C can land,
swept and timed, in calls, autotunes, backend contexts and the epilog pool; a phase per process, bounded (a few
seconds each, every run under a watchdog), fixed seeds. After every interrupted run: no hang, no backend
context left active, no shared plan changed, no pin left behind, and the next result right."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import NVDISPATCH_PATH

SOAK = Path(__file__).with_name("interrupts.py")

#: phase -> seconds of interrupts (half swept points, half timers)
PHASES = {"calls": 4.0, "contexts": 2.0, "autotune": 4.0, "epilog_pool": 4.0}
#: interrupts that must land in a phase (a loaded machine runs fewer in the same seconds: the phase goes on longer)
MIN_INTERRUPTS = 11


def _phase(name: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([NVDISPATCH_PATH, env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [
            sys.executable,
            str(SOAK),
            "--phase",
            name,
            "--seconds",
            str(PHASES[name]),
            "--seed",
            "0",
            "--min-interrupts",
            str(MIN_INTERRUPTS),
        ],
        capture_output=True,
        text=True,
        timeout=2 * PHASES[name] + 50,
        env=env,
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr[-3000:]
    report = json.loads(lines[-1])
    assert report["hang"] is None, (report["hang"], proc.stderr[-6000:])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return report


@pytest.mark.parametrize(
    "name",
    list(PHASES),
)
def test_interrupted_runs_leave_nothing_behind(name):
    pytest.importorskip("torch")
    report = _phase(name)
    assert report["interrupted"] >= MIN_INTERRUPTS and report["points_swept"] > 0, (
        report
    )  # the interrupts really landed
    for what in ("errors", "wrong", "leaked_state", "plans_changed", "tunings_recorded", "pins_left"):
        assert report[what] == [], (what, report[what])
