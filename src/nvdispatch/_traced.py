"""Calls whose operands are placeholders of a program being traced (JAX tracers inside ``jax.jit``,
``jax.grad``, ``jax.vmap``): they hold no memory, so the call cannot run; it is *staged* into the program.

Adapters say which arrays these are (:attr:`~nvdispatch._adapters.base.Adapter.traced_framework`). The
functions that stage a call are installed from above, by ``nvdispatch.integrations`` (which sits over the
public front), with :func:`register_traced`; the public front asks :func:`traced_handler` where a call's
operands are looked at (the route's miss path: traced operands never have a call key) and hands the whole
call to the handler found. Nothing here imports a framework or the integrations.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from ._adapter_registry import adapter_for
from .errors import UnsupportedOperandError, describe

__all__ = ["register_traced", "unregister_traced", "traced_handler", "traced_framework"]

_lock = threading.Lock()
#: (framework, operation) -> the function staging that operation on that framework's traced arrays
_handlers: dict[tuple[str, str], Callable[..., Any]] = {}


def register_traced(framework: str, operation: str, handler: Callable[..., Any]) -> None:
    """Make ``handler`` stage ``operation`` (``"matmul"``, ``"fft"``, ...) when a traced array of
    ``framework`` reaches it; it takes the public function's arguments (see the callers)."""
    with _lock:
        _handlers[(framework, operation)] = handler


def unregister_traced(framework: str, operation: str) -> None:
    """Forget the handler of ``operation`` for ``framework`` (no-op when none is registered)."""
    with _lock:
        _handlers.pop((framework, operation), None)


def traced_framework(x: Any) -> str | None:
    """The framework whose program is being traced when ``x`` is a traced array (``"jax"``), else None."""
    ad = adapter_for(x)
    return None if ad is None else ad.traced_framework


def traced_handler(operation: str, operands: Iterable[Any]) -> Callable[..., Any] | None:
    """The handler staging ``operation`` when one of ``operands`` (None entries skipped) is a traced array,
    else None (the call runs). :class:`~nvdispatch.errors.UnsupportedOperandError` when the framework has no
    handler for the operation."""
    for x in operands:
        if x is None:
            continue
        framework = traced_framework(x)
        if framework is None:
            continue
        handler = _handlers.get((framework, operation))
        if handler is None:
            raise UnsupportedOperandError(
                "operands",
                f"concrete arrays ({operation} has no {framework} integration for traced programs)",
                describe(x),
            )
        return handler
    return None
