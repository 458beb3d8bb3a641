"""tools/release_check.py, the release check CONTRIBUTING.md asks for before tagging: its command line, the
metadata it requires before an upload, and the clean copy it builds from. (Its full run builds, installs and
tests the artefacts for minutes: tests/release/test_packaging.py runs the same steps on a smaller scale.)"""

from __future__ import annotations

import email.message
import os
import subprocess
import sys

import pytest
from release_tool import ROOT, release_check


def _meta(urls: dict[str, str]) -> email.message.Message:
    meta = email.message.Message()
    for label, url in urls.items():
        meta["Project-URL"] = f"{label}, {url}"
    return meta


def test_help_says_what_it_checks(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "release_check.py"), "--help"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.startswith("usage:") and "twine check" in done.stdout and "--upload" in done.stdout
    assert list(tmp_path.iterdir()) == []


def test_upload_needs_every_project_url_as_https():
    with pytest.raises(release_check.CheckFailed, match="Homepage: missing.*Documentation: README.md"):
        release_check.check_upload_urls(_meta({"Documentation": "README.md", "Changelog": "CHANGELOG.md"}))
    ready = {label: f"https://example.invalid/{label.lower()}" for label in release_check.UPLOAD_URLS}
    release_check.check_upload_urls(_meta(ready))
    with pytest.raises(release_check.CheckFailed, match="Source: http://"):
        release_check.check_upload_urls(_meta({**ready, "Source": "http://example.invalid/src"}))


def test_clean_copy_holds_the_tracked_files_alone(tmp_path):
    copy = release_check.clean_copy(ROOT, tmp_path / "copy")
    copied = {p.relative_to(copy).as_posix() for p in copy.rglob("*") if p.is_file()}
    assert copied == release_check.tracked_files(ROOT)
    assert {"pyproject.toml", "setup.py", "src/nvdispatch/__init__.py", "tests/release/release_tool.py"} <= copied
    assert not [f for f in copied if release_check.JUNK.search(f) or ".egg-info/" in f]
    assert os.access(copy / ".ci" / "run", os.R_OK)
