"""The package metadata promises what the code does: every package the code imports (at the top of a module or
lazily, inside a function) is a dependency or in an extra, each extra ``show_config()`` names exists, the
``[test]`` extra installs every extra that runs on a machine without a GPU, and the Python versions agree
(``requires-python``, the classifiers, Ruff's target). Read from pyproject.toml, no build."""

from __future__ import annotations

import ast
import pathlib
import re
import sys

import pytest

from nvdispatch import _environment

ROOT = pathlib.Path(__file__).parents[2]
PACKAGE = pathlib.Path(_environment.__file__).parent
tomllib = pytest.importorskip("tomllib")
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: each package the code imports -> (the extra that installs it, None for a dependency; its requirement's name)
PROVIDER = {
    "numpy": (None, "numpy"),
    "array_api_compat": (None, "array-api-compat"),
    "platformdirs": (None, "platformdirs"),
    "scipy": ("scipy", "scipy"),
    "torch": ("torch", "torch"),
    "cupy": ("cupy", "cupy-cuda13x"),
    "cupyx": ("cupy", "cupy-cuda13x"),
    "jax": ("jax", "jax"),
    "cuda": ("cuda", "cuda-bindings"),
    "numba": ("numba", "numba"),
    "dask": ("dask", "dask"),
    "distributed": ("dask", "distributed"),
    "tqdm": ("bench", "tqdm"),
    "matplotlib": ("bench", "matplotlib"),
}
#: extras that need an NVIDIA GPU (the others are in [test])
GPU_EXTRAS = {"cupy", "cuda"}


def _name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9._-]+", requirement).group(0).lower().replace("_", "-")


def _imported_packages() -> dict[str, str]:
    """Each top-level package outside the standard library that the code imports -> one module importing it."""
    found: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("import_module", "find_spec"):
                arg = node.args[0] if node.args else None
                names = [arg.value] if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else []
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "nvdispatch":
                    found.setdefault(top, path.relative_to(PACKAGE).as_posix())
    return found


def test_every_imported_package_is_a_dependency_or_in_an_extra():
    dependencies = {_name(r) for r in PROJECT["project"]["dependencies"]}
    extras = {k: {_name(r) for r in v} for k, v in PROJECT["project"]["optional-dependencies"].items()}
    imported = _imported_packages()
    unknown = {top: where for top, where in imported.items() if top not in PROVIDER}
    assert not unknown, f"imported but installed by nothing (add it to pyproject.toml and PROVIDER): {unknown}"
    for top in imported:
        extra, requirement = PROVIDER[top]
        assert requirement in (dependencies if extra is None else extras[extra]), (top, extra, requirement)


def test_show_config_names_extras_that_exist():
    extras = set(PROJECT["project"]["optional-dependencies"])
    assert set(_environment.EXTRA.values()) <= extras, set(_environment.EXTRA.values()) - extras
    assert {PROVIDER[m.split(".")[0]][0] for m in _environment.EXTRA} <= extras


def test_test_extra_installs_every_extra_that_runs_without_a_gpu():
    extras = {k: {_name(r) for r in v} for k, v in PROJECT["project"]["optional-dependencies"].items()}
    for extra, requirements in extras.items():
        if extra not in GPU_EXTRAS | {"test"}:
            assert requirements <= extras["test"], (extra, requirements - extras["test"])


def test_python_versions_agree():
    minimum = re.fullmatch(r">=3\.(\d+)", PROJECT["project"]["requires-python"]).group(1)
    listed = sorted(
        int(c.rsplit(".", 1)[1]) for c in PROJECT["project"]["classifiers"] if re.fullmatch(r".*:: 3\.\d+", c)
    )
    assert listed[0] == int(minimum) and listed == list(range(listed[0], listed[-1] + 1)), listed
    assert PROJECT["tool"]["ruff"]["target-version"] == f"py3{minimum}"
    assert f"Python ≥ 3.{minimum}" in (ROOT / "README.md").read_text()


def test_typed_package_ships_its_marker():
    assert "Typing :: Typed" in PROJECT["project"]["classifiers"]
    assert "py.typed" in PROJECT["tool"]["setuptools"]["package-data"]["nvdispatch"]
    assert (PACKAGE / "py.typed").is_file()
