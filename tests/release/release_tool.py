"""tools/release_check.py loaded as a module (the tools folder is no package): the tests share its notion of
what the repository tracks and of what is never released."""

from __future__ import annotations

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("release_check", ROOT / "tools" / "release_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


release_check = _load()
