"""Fixtures shared by the transforms' tests."""

from __future__ import annotations

import pytest

import nvdispatch
from nvdispatch._adapters import call_key_classes


@pytest.fixture
def fresh_front_state():
    """Backends, plans and the call-key classes (signatures and memos) as a fresh process has them, before and
    after the test: what the compiled front finds is what the test made."""
    nvdispatch.reset_backends()
    nvdispatch.plan_cache.clear()
    call_key_classes.clear()
    yield
    nvdispatch.reset_backends()
    nvdispatch.plan_cache.clear()
