"""Each test compiles from a clean Dynamo cache: tests share their functions' code objects, whose compiled
variants would otherwise add up to Dynamo's recompile limit."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch = pytest.importorskip("torch")
    torch._dynamo.reset()
    yield
