"""The sdist is the whole project, so that a person who has only it can build the extension, run the test suite
against an install and read the documentation: every file the repository tracks is in it (the tests, the
conformance suites, the examples, the benchmarks and their results, the documentation's sources, the C sources,
the CI script and the release check), and nothing a build or a test run leaves behind. The sdist is built here
from a clean copy of this tree's tracked files (``tools/release_check.py`` builds the release from one too)
without build isolation (the installed setuptools, no download: seconds); the isolated build of
both artefacts, their installs and runs are tests/release/test_packaging.py and ``tools/release_check.py``."""

from __future__ import annotations

import email
import os
import pathlib
import re
import subprocess
import sys
import tarfile

import pytest
from release_tool import release_check

import nvdispatch

ROOT = pathlib.Path(__file__).parents[2]
pytest.importorskip("build", reason="the [test] extra installs build")
setuptools = pytest.importorskip("setuptools")

#: what must be in the sdist wherever it is built from (a checkout or an unpacked sdist)
REQUIRED = {
    "README.md", "CONTRIBUTING.md", "LICENSE", "CHANGELOG.md", "pyproject.toml", "setup.py", "MANIFEST.in",
    "conftest.py", ".ci/run", "benchmarks/README.md", "benchmarks/_bench.py", "conformance/README.md",
    "docs/conf.py", "docs/index.md", "tools/release_check.py", "src/nvdispatch/py.typed",
}  # fmt: skip
#: folders whose every file must be in it
FOLDERS = ("tests", "conformance", "examples", "benchmarks", "docs", "src/nvdispatch")
#: tracked files the sdist leaves out
NOT_SHIPPED = {".gitignore"}
#: what setuptools writes into every sdist
GENERATED = {"PKG-INFO", "setup.cfg"}


JUNK = release_check.JUNK


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("sdist")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    source = release_check.clean_copy(ROOT, tmp_path_factory.mktemp("source"))
    cmd = [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(out), str(source)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    if done.returncode and "setuptools" in done.stdout + done.stderr and "Missing dependencies" in done.stdout:
        pytest.skip("the installed setuptools is older than pyproject.toml's build requirement")
    assert done.returncode == 0, f"python -m build --sdist failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    (path,) = out.glob("*.tar.gz")
    with tarfile.open(path) as tar:
        top = f"nvdispatch-{nvdispatch.__version__}/"
        members = tar.getmembers()
        pkg_info = tar.extractfile(top + "PKG-INFO").read()
    assert all(m.name.startswith(top) or m.name + "/" == top for m in members), "one top folder, named for it"
    files = {m.name[len(top) :] for m in members if m.name.startswith(top) and not m.isdir()}
    return {"name": path.name, "files": files, "meta": email.message_from_bytes(pkg_info)}


def test_named_after_the_version(sdist):
    assert sdist["name"] == f"nvdispatch-{nvdispatch.__version__}.tar.gz"
    assert sdist["meta"]["Name"] == "nvdispatch" and sdist["meta"]["Version"] == nvdispatch.__version__


def test_carries_every_tracked_file(sdist):
    missing = sorted(release_check.tracked_files(ROOT) - NOT_SHIPPED - sdist["files"])
    assert not missing, f"in the tree but not in the sdist (MANIFEST.in): {missing[:20]}"
    assert not REQUIRED - sdist["files"], sorted(REQUIRED - sdist["files"])
    for folder in FOLDERS:
        assert any(f.startswith(folder + "/") for f in sdist["files"]), folder


def test_carries_the_extensions_c_sources(sdist):
    setup_py = (ROOT / "setup.py").read_text()
    sources = set(re.findall(r'"(src/nvdispatch/[\w.]+\.[ch])"', setup_py))
    headers = {p.relative_to(ROOT).as_posix() for p in (ROOT / "src" / "nvdispatch").glob("*.h")}
    assert len(sources) >= 8 and headers, (sources, headers)
    assert not (sources | headers) - sdist["files"], sorted((sources | headers) - sdist["files"])


def test_carries_no_caches_build_outputs_or_compiled_files(sdist):
    junk = sorted(f for f in sdist["files"] if JUNK.search(f))
    assert not junk, junk
    egg_info = {f for f in sdist["files"] if ".egg-info/" in f}
    assert {f.split("/")[-2] for f in egg_info} <= {"nvdispatch.egg-info"}  # the one setuptools writes
    tops = {f.split("/")[0] for f in release_check.tracked_files(ROOT) | GENERATED}
    stray = sorted(f for f in sdist["files"] if f.split("/")[0] not in tops)
    assert not stray, f"in the sdist, from outside what the repository tracks: {stray[:20]}"


def test_project_urls_name_files_the_sdist_carries_or_https_addresses(sdist):
    urls = dict(entry.split(", ", 1) for entry in sdist["meta"].get_all("Project-URL") or [])
    assert {"Documentation", "Changelog"} <= set(urls), urls
    for label, target in urls.items():
        assert target.startswith("https://") or target in sdist["files"], (label, target)
    assert urls["Changelog"] == "CHANGELOG.md" or urls["Changelog"].startswith("https://")
