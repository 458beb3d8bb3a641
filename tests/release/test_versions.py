"""One version everywhere a person reads it: ``nvdispatch.__version__`` (its one place, src/nvdispatch/_version.py),
the installed package's metadata (pyproject.toml reads it from there), and CHANGELOG.md, whose newest release
section is that version with its date, below the ``[Unreleased]`` section of Keep a Changelog."""

from __future__ import annotations

import datetime
import importlib.metadata
import pathlib
import re

import pytest

import nvdispatch

ROOT = pathlib.Path(__file__).parents[2]
SECTION = re.compile(r"^## \[(?P<name>[^\]]+)\](?: - (?P<date>\d{4}-\d{2}-\d{2}))?[ \t]*$", re.M)


def _sections() -> list[tuple[str, str | None]]:
    return [(m["name"], m["date"]) for m in SECTION.finditer((ROOT / "CHANGELOG.md").read_text())]


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def test_version_is_a_plain_release_number():
    assert re.fullmatch(r"\d+\.\d+\.\d+", nvdispatch.__version__), nvdispatch.__version__


def test_metadata_reads_the_one_version():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["dynamic"] == ["version"] and "version" not in project["project"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "nvdispatch._version.__version__"}


def test_installed_metadata_has_the_packages_version():
    try:
        installed = importlib.metadata.version("nvdispatch")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("nvdispatch is imported from a source tree that was never installed")
    assert installed == nvdispatch.__version__, "reinstall (pip install -e .): the metadata is stale"


def test_changelog_starts_with_unreleased_then_this_version_dated():
    sections = _sections()
    assert sections[0] == ("Unreleased", None), sections[:2]
    name, date = sections[1]
    assert name == nvdispatch.__version__, f"CHANGELOG.md's newest release is {name}"
    assert date is not None, f"[{name}] has no date (## [{name}] - YYYY-MM-DD)"
    datetime.date.fromisoformat(date)


def test_changelog_releases_are_newest_first_each_dated():
    releases = _sections()[1:]
    assert [name for name, _ in releases] == sorted((n for n, _ in releases), key=_release, reverse=True)
    dates = [datetime.date.fromisoformat(date) for _, date in releases if date]
    assert len(dates) == len(releases), releases
    assert dates == sorted(dates, reverse=True), releases


def test_changelog_sections_use_keep_a_changelog_headings():
    kinds = set(re.findall(r"^### (.+)$", (ROOT / "CHANGELOG.md").read_text(), flags=re.M))
    assert kinds <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, kinds
