"""Where framework integrations (:mod:`nvdispatch.integrations`) join the public functions, which never import them.

Two joints, both free for the calls no integration takes:

* **Entry points.** A public function announces itself once, when its module is imported
  (``announce("matmul", matmul)``). Every installed integration is shown every announced function, those
  announced before it was installed and after, and may mark it for its framework's compiler (the Torch
  integration has Dynamo trace its own version of the function, which calls Torch operators, in its place).
* **Takers.** On a call's full path, once the cached routes found no plan for it, the route asks
  ``taker_for(x)`` (``x`` the call's first operand) for the callable of the integration that claims ``x``'s
  class (looked up once per class; None for classes no integration claims, e.g. NumPy's) and calls
  ``take(operation, *arguments)``. The taker returns the call's result when it takes the call (Torch: a call
  autograd records, or one made while Torch traces a program), else ``NotImplemented`` and the route goes on.

An integration is an object with ``name``, ``claims(cls) -> bool``, ``take(operation, *arguments)`` and
``mark(name, function)``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["announce", "install", "taker_for", "integrations"]

_lock = threading.Lock()
_entries: dict[str, Callable[..., Any]] = {}
_installed: tuple[Any, ...] = ()
#: class -> the ``take`` of the integration claiming it, or None (filled on first sight of a class)
_takers: dict[type, Any] = {}


def announce(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """Make public function ``function`` (called ``name``) known to every integration, now and later
    installed ones; returns ``function``."""
    with _lock:
        _entries[name] = function
        installed = _installed
    for integration in installed:
        integration.mark(name, function)
    return function


def install(integration: Any) -> None:
    """Install ``integration`` (replacing one of the same name) and show it every announced entry point."""
    global _installed
    with _lock:
        _installed = (*(i for i in _installed if i.name != integration.name), integration)
        _takers.clear()
        entries = dict(_entries)
    for name, function in entries.items():
        integration.mark(name, function)


def integrations() -> tuple[Any, ...]:
    """The installed integrations."""
    return _installed


def taker_for(x: Any):
    """The ``take`` callable of the integration claiming arrays of ``x``'s class, or None."""
    cls = x.__class__
    try:
        return _takers[cls]
    except KeyError:
        pass
    take = next((i.take for i in _installed if i.claims(cls)), None)
    _takers[cls] = take
    return take
