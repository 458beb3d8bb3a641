"""The documentation site builds with warnings as errors, its examples (every ``>>>`` of the pages and of the
docstrings they document) pass under Sphinx's doctest builder, and the API reference covers every public
name: each module's ``__all__``. The [test] extra installs the [docs] one, so CI really builds it."""

from __future__ import annotations

import importlib
import os
import pathlib
import subprocess
import sys

import pytest

from conftest import NVDISPATCH_PATH
from tests.subprocess_pool import start

pytest.importorskip("sphinx", reason="the [docs] extra (in [test]) installs Sphinx")
pytest.importorskip("myst_parser", reason="the [docs] extra (in [test]) installs myst-parser")
pytest.importorskip("furo", reason="the [docs] extra (in [test]) installs furo")

ROOT = pathlib.Path(__file__).parents[2]
PUBLIC = [
    "nvdispatch",
    "nvdispatch.fft",
    "nvdispatch.errors",
    "nvdispatch.executors",
    "nvdispatch.adapters",
    "nvdispatch.device",
    "nvdispatch.integrations.torch_mlp",
    "nvdispatch.integrations.mlp_options",
    "nvdispatch.integrations.jax_mlp",
]


def _sphinx(builder: str, out: pathlib.Path, doctrees: pathlib.Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([NVDISPATCH_PATH, os.environ.get("PYTHONPATH", "")]))
    args = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", builder, "-c", str(ROOT / "docs"),
            "-d", str(doctrees), str(ROOT), str(out)]  # fmt: skip
    return subprocess.run(args, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> dict:
    """The html site, built; ``doctest``: the doctest builder's run, started beside it (doctrees of its own)."""
    base = tmp_path_factory.mktemp("docs")
    doctest = start(_sphinx, "doctest", base / "doctest", base / "doctrees-doctest")
    html = _sphinx("html", base / "html", base / "doctrees")
    assert html.returncode == 0, f"sphinx -W (html) failed:\n{html.stdout[-3000:]}\n{html.stderr[-6000:]}"
    return {"html": base / "html", "doctrees": base / "doctrees", "base": base, "doctest": doctest}


def test_site_builds_without_warnings(site):
    html = site["html"]
    for page in ("docs/index.html", "README.html", "CONTRIBUTING.html", "CHANGELOG.html", "benchmarks/README.html"):
        assert (html / page).is_file(), page
    assert (html / "docs" / "api" / "nvdispatch.html").is_file()


def test_benchmark_results_page_shows_the_plots(site):
    images = list((site["html"] / "_images").glob("*.png"))
    page = (site["html"] / "benchmarks" / "README.html").read_text()
    assert len(images) >= 5 and page.count("<img") >= 5


def test_examples_in_the_site_pass(site):
    done = site["doctest"].result()
    report = (site["base"] / "doctest" / "output.txt").read_text() if done.returncode == 0 else ""
    assert done.returncode == 0, f"sphinx doctest failed:\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
    assert " 0 failures in tests" in report and " tests\n" in report, report[-2000:]


def test_api_reference_covers_every_public_name(site):
    from sphinx.util.inventory import InventoryFile

    with open(site["html"] / "objects.inv", "rb") as fh:
        inventory = InventoryFile.load(fh, "", os.path.join)
    documented = {name for kind in inventory.values() for name in kind} if isinstance(inventory, dict) else set()
    if not documented:  # Sphinx >= 8.2: an _Inventory object
        documented = {name for kind in inventory.data.values() for name in kind}
    missing = []
    for module_name in PUBLIC:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # nvdispatch.device without the [numba] extra
            continue
        for name in module.__all__:
            obj = getattr(module, name)
            target = getattr(obj, "__name__", None) if isinstance(obj, type(sys)) else f"{module_name}.{name}"
            if target not in documented:
                missing.append(f"{module_name}.{name}")
    assert not missing, f"not in the API reference: {missing}"
