"""Fixtures of the matmul tests."""

from __future__ import annotations

import pytest

from nvdispatch import linalg


@pytest.fixture
def full_paths(monkeypatch):
    """``full_paths[0]``: how many matmul calls took the full path (detect, validate, select) instead of
    finding their plan by their call key; set it to 0 to count from there."""
    count = [0]
    full = linalg._plan_and_run

    def counting(*args):
        count[0] += 1
        return full(*args)

    monkeypatch.setattr(linalg, "_plan_and_run", counting)
    return count
