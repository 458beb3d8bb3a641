"""Backend contexts under interrupts (#27.5): no KeyboardInterrupt landing in nvdispatch's own frames leaves a
context active, whether left by a with statement or by contextlib.ExitStack; ExitStack's own windows (in
contextlib) are measured and documented, not nvdispatch's to close."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import NVDISPATCH_PATH

SCRIPT = Path(__file__).with_name("exit_interrupts.py")


def _report(timer_runs: int) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([NVDISPATCH_PATH, env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--timer-runs", str(timer_runs)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_no_interrupt_in_nvdispatch_frames_leaves_a_context_active():
    report = _report(timer_runs=300)
    for scenario in ("with", "ExitStack"):
        for event in ("call", "c_return"):
            part = report[f"{scenario}/nvdispatch/{event}"]
            assert part["points"] > 5, part  # the interrupts really landed in nvdispatch's entries and exits
            assert part["leaks"] == {}, (scenario, event, part)
        timers = report[f"{scenario}/timers"]
        assert timers["interrupted"] > 200, timers
        assert not any(where.startswith("_backends.py") for where in timers["leaks"]), timers
    # with statements leave no window at all; ExitStack's are in contextlib alone
    assert report["with/timers"]["leaks"] == {}
    for event in ("call", "c_return"):
        assert all(where.startswith("contextlib.py") for where in report[f"ExitStack/contextlib/{event}"]["leaks"])
