"""The two commands at the top of README.md are what a newcomer runs first: the test command is exactly what CI
runs (``.ci/run``), the step that installs Torch's CPU build (so a CPU machine never pulls the multi-GB CUDA
build) stands right under them, and the README's first screen says how to install on CPU-only and on GPU machines."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).parents[2]
README = (ROOT / "README.md").read_text()


def _top_commands() -> list[str]:
    block = re.search(r"^```bash\n(.*?)^```", README, flags=re.S | re.M).group(1)
    return [line.split("   #")[0].split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def test_readme_test_command_is_what_ci_runs():
    demo, test = _top_commands()
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith(("#", "set ", "cd "))]
    assert ci == [test]
    assert demo == "pip install -e . && python -m nvdispatch"


def test_cpu_torch_step_comes_before_the_commands():
    """The test command stays what CI runs (CI installs Torch's CPU build from its own disk); the CPU-only step a
    newcomer needs first is right under the commands, pinned to the release the extras pin."""
    assert _top_commands()[1] == 'pip install -e ".[test]" && ruff check . && python -m pytest'
    after = README.split("```", 2)[2][:800]
    pinned = re.search(r'"torch==([\d.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert f"pip install torch=={pinned} --index-url https://download.pytorch.org/whl/cpu" in after
    assert "CPU-only machine" in after


def test_first_screen_has_the_version_python_and_both_installs():
    import nvdispatch

    first_screen = "\n".join(README.splitlines()[:60])
    assert f"Version {nvdispatch.__version__}" in first_screen and "Python ≥ 3.10" in first_screen
    assert "CPU-only machine" in first_screen and "GPU machine" in first_screen
    assert "download.pytorch.org/whl/cpu" in first_screen
