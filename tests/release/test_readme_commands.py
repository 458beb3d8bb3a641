"""The two commands at the top of README.md are what a newcomer runs first: the test command is exactly what CI
runs (``.ci/run``), it installs Torch's CPU build before the extras that pin Torch (so a CPU machine never pulls
the multi-GB CUDA build), and the README's first screen says how to install on CPU-only and on GPU machines."""

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


def test_test_command_installs_the_cpu_torch_build_first():
    steps = [s.strip() for s in _top_commands()[1].split("&&")]
    assert steps[0] == "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
    assert steps[1] == 'pip install -e ".[test]"'
    pinned = re.search(r'"torch==([\d.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert steps[0].split()[2] == f"torch=={pinned}", "the CPU step must install the release the extras pin"


def test_first_screen_has_the_version_python_and_both_installs():
    import nvdispatch

    first_screen = "\n".join(README.splitlines()[:60])
    assert f"Version {nvdispatch.__version__}" in first_screen and "Python ≥ 3.10" in first_screen
    assert "CPU-only machine" in first_screen and "GPU machine" in first_screen
    assert "download.pytorch.org/whl/cpu" in first_screen
