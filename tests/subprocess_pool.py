"""The subprocesses of a parametrized test started up front, as many at a time as the machine has cores.

Tests that run scripts, README blocks or examples each in a fresh interpreter spend most of their time in those
interpreters while pytest waits: started all at once (each still its own process, with its own working
directory) they keep every core busy, where one after the other they keep one. A test then reads its own run's
result; its assertions, ids and skips are what they were.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

_POOL = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2), thread_name_prefix="test-subprocess")


def start_runs(request: pytest.FixtureRequest, test: str, run: Callable[[dict, Any], Any]) -> dict[str, Future]:
    """Start ``run(params, directory)`` for every collected case of the test function named ``test`` in the
    requesting module, in collection order (cases deselected by ``-k`` or a node id are not started);
    ``directory``: a new empty folder of the case's own. Returns the futures by case id
    (``request.node.callspec.id`` in the test)."""
    factory = request.getfixturevalue("tmp_path_factory")
    runs = {}
    for item in request.session.items:
        if getattr(item, "originalname", None) != test or item.module is not request.module:
            continue
        case = item.callspec.id
        if case not in runs:
            directory = factory.mktemp(re.sub(r"[^\w.-]", "_", case)[:40] or "case")
            runs[case] = _POOL.submit(run, dict(item.callspec.params), directory)
    return runs


def start(run: Callable[..., Any], *args: Any) -> Future:
    """Start ``run(*args)`` (one subprocess's run, say) in the pool; the future of its result."""
    return _POOL.submit(run, *args)


def result_of(runs: dict[str, Future], request: pytest.FixtureRequest) -> Any:
    """The result of the requesting case's run (waiting for it)."""
    return runs[request.node.callspec.id].result()
