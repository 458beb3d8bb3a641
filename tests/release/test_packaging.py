"""The release artefacts, as a user gets them: the sdist and the wheel build (``python -m build``) and pass
``twine check``; the wheel carries the compiled extension, the type hints and the licence, and no C sources;
installed into a fresh virtual environment (not this editable tree) it runs the demo and a smoke test; and
installed from the sdist where no C compiler works, it installs without the extension and the same smoke test
passes on the pure-Python route.

The virtual environments see this interpreter's site-packages (``--system-site-packages``), so NumPy, Torch and
the rest are not downloaded again; nvdispatch itself is installed into each one from the built files."""

from __future__ import annotations

import email
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile

import pytest
from release_tool import release_check

import nvdispatch

ROOT = pathlib.Path(__file__).parents[2]
pytest.importorskip("build", reason="the [test] extra installs build")
tomllib = pytest.importorskip("tomllib")

SMOKE = """
import pathlib, sys
import numpy as np
import nvdispatch, nvdispatch.fft
from nvdispatch import *  # noqa: F403 - a base install must allow it

where = pathlib.Path(nvdispatch.__file__).resolve()
assert where.is_relative_to(pathlib.Path(sys.prefix).resolve()), f"not the installed copy: {where}"
rng = np.random.default_rng(0)
x, w, bias = rng.standard_normal((33, 17)), rng.standard_normal((17, 9)), rng.standard_normal(9)
y = nvdispatch.matmul(x, w, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
np.testing.assert_allclose(y, np.maximum(x @ w + bias, 0), rtol=1e-12, atol=1e-12)
for _ in range(3):  # repeated calls: the cached hit, compiled where the extension is built
    np.testing.assert_allclose(nvdispatch.matmul(x, w), x @ w, rtol=1e-12, atol=1e-12)
s = rng.standard_normal(64)
np.testing.assert_allclose(nvdispatch.fft.rfft(s), np.fft.rfft(s), rtol=1e-12, atol=1e-12)
assert "executor" in repr(nvdispatch.explain(x, w)) and nvdispatch.__version__ == sys.argv[1]
from nvdispatch import _compiled  # the one place that says whether this process uses the extension

print("compiled" if _compiled.hotpath() is not None else "pure-python")
"""


def _run(cmd: list[str], env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=cwd)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _compiler_works() -> bool:
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]  # as setuptools picks it
    headers = os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
    return bool(shutil.which(cc)) and headers


def _clean_env(**extra: str) -> dict:
    """This environment without what would put the checkout's source first (PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NVDISPATCH_PURE_PYTHON")}
    return {**env, **extra}


def _venv(path: pathlib.Path) -> pathlib.Path:
    """A fresh virtual environment seeing this interpreter's packages; returns its python."""
    _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(path)])
    return path / "bin" / "python"


def _pip_install(python: pathlib.Path, artefact: pathlib.Path, env: dict | None = None, *extra: str) -> None:
    # --ignore-installed --no-deps: nvdispatch goes into the venv even though this editable tree is installed
    # in the site-packages it sees; its dependencies are those already there (no download)
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index", "--no-deps",
          "--ignore-installed", *extra, str(artefact)], env=env)  # fmt: skip


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, pathlib.Path]:
    out = tmp_path_factory.mktemp("dist")
    source = release_check.clean_copy(ROOT, tmp_path_factory.mktemp("source"))  # what the repository holds
    cmd = [sys.executable, "-m", "build", "--outdir", str(out), str(source)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=_clean_env())
    if done.returncode and re.search(r"No matching distribution found for setuptools", done.stdout + done.stderr):
        pytest.skip("python -m build cannot fetch its build requirement (setuptools) here: no package index")
    assert done.returncode == 0, f"python -m build failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    (sdist,), (wheel,) = out.glob("*.tar.gz"), out.glob("*.whl")
    return {"sdist": sdist, "wheel": wheel}


def test_sdist_and_wheel_pass_twine_check(dist):
    pytest.importorskip("twine", reason="the [test] extra installs twine")
    done = _run([sys.executable, "-m", "twine", "check", "--strict", str(dist["sdist"]), str(dist["wheel"])])
    assert done.stdout.count("PASSED") == 2, done.stdout


def test_wheel_carries_the_extension_type_hints_and_licence(dist):
    with zipfile.ZipFile(dist["wheel"]) as whl:
        names = whl.namelist()
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = email.message_from_bytes(whl.read(info))
    assert meta["Name"] == "nvdispatch" and meta["Version"] == nvdispatch.__version__
    assert meta["Requires-Python"] == ">=3.10" and meta["License-Expression"] == "Apache-2.0"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "nvdispatch/py.typed" in names and "nvdispatch/__main__.py" in names
    assert not [n for n in names if n.endswith((".c", ".h"))], "C sources belong in the sdist only"
    assert {n.split("/")[0] for n in names} == {"nvdispatch", f"nvdispatch-{nvdispatch.__version__}.dist-info"}
    assert not [n for n in names if release_check.JUNK.search(n) and not n.endswith("_hotpath.abi3.so")], names
    assert set(meta.get_all("Provides-Extra")) == set(tomllib.loads((ROOT / "pyproject.toml").read_text())
                                                      ["project"]["optional-dependencies"])  # fmt: skip
    assert meta["Description-Content-Type"] == "text/markdown" and meta["Summary"]
    if _compiler_works():
        assert "nvdispatch/_hotpath.abi3.so" in names and "-cp310-abi3-" in dist["wheel"].name


def test_sdist_carries_the_sources_to_build_everything(dist):
    with tarfile.open(dist["sdist"]) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    assert {"LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "setup.py"} <= names
    assert {"src/nvdispatch/_hotpath.c", "src/nvdispatch/_hotpath_lt.c", "src/nvdispatch/py.typed"} <= names
    assert {"src/nvdispatch/_hotpath.h", "src/nvdispatch/_hotpath_fft.c", "src/nvdispatch/_hotpath_cufft.c"} <= names


def test_wheel_in_a_fresh_venv_runs_the_demo_and_a_smoke_test(dist, tmp_path):
    python = _venv(tmp_path / "venv")
    _pip_install(python, dist["wheel"])
    env = _clean_env()
    smoke = _run([str(python), "-c", SMOKE, nvdispatch.__version__], env=env, cwd=tmp_path)
    assert smoke.stdout.strip() == ("compiled" if _compiler_works() else "pure-python")
    demo = _run([str(python), "-m", "nvdispatch", "--shape", "32", "16", "8", "--repeats", "5"], env=env, cwd=tmp_path)
    assert f"nvdispatch {nvdispatch.__version__}" in demo.stdout and "[numpy on cpu] ok" in demo.stdout
    assert "not a benchmark" in demo.stdout
    pure = _run([str(python), "-c", SMOKE, nvdispatch.__version__], env=_clean_env(NVDISPATCH_PURE_PYTHON="1"),
                cwd=tmp_path)  # fmt: skip
    assert pure.stdout.strip() == "pure-python"  # NVDISPATCH_PURE_PYTHON=1: the Python route, extension or not


def test_sdist_without_a_c_compiler_installs_the_pure_python_route(dist, tmp_path):
    python = _venv(tmp_path / "venv")
    env = _clean_env(CC="false")  # a compiler that always fails: the optional extension is skipped
    _pip_install(python, dist["sdist"], env, "--no-build-isolation")
    assert not list((tmp_path / "venv").rglob("_hotpath*.so"))
    smoke = _run([str(python), "-c", SMOKE, nvdispatch.__version__], env=_clean_env(), cwd=tmp_path)
    assert smoke.stdout.strip() == "pure-python"
