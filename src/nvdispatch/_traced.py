"""Calls a framework integration runs instead of the route, and the entry points compilers trace.

The integrations are installed from above, by ``nvdispatch.integrations`` (which sits over the public front);
nothing here imports a framework or the integrations. Two kinds of call leave the route for an integration:

* calls on *placeholders* of a program being traced (JAX tracers inside ``jax.jit``, ``jax.grad``, ``jax.vmap``):
  adapters say which arrays these are (:attr:`~nvdispatch._adapters.base.Adapter.traced_framework`); they hold no
  memory, so the call cannot run: the handler registered with :func:`register_traced` *stages* it into the program;
* calls a framework must see itself (a Torch call that autograd records, or one made while Torch traces a program
  on fake tensors): a handler registered with ``all_arrays=True`` is offered every call of its operation on its
  framework's arrays that reaches the route's miss path, and returns ``NotImplemented`` for those it leaves to the
  route. Given the call's key, it may keep a plan under it, so that the call's repeats run that plan from the
  route's hit (see :func:`traced_handler`).

The public front asks :func:`traced_handler` where a call's operands are looked at (the route's miss path: traced
operands never have a call key, and a call the route's caches serve needs no integration), calls the handler found
with the public function's arguments and returns its result unless it is ``NotImplemented``.

**Entry points.** Each public function announces itself once (:func:`announce`); every marker installed with
:func:`add_entry_marker` is shown every announced function, those announced before and after it, and may mark it
for its framework's compiler (the Torch integration has Dynamo trace its own version of the function, which calls
Torch operators, in its place). Marking costs nothing when no compiler traces.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from ._adapter_registry import adapter_for
from .errors import UnsupportedOperandError, describe

__all__ = [
    "register_traced",
    "unregister_traced",
    "traced_handler",
    "traced_framework",
    "announce",
    "add_entry_marker",
    "register_compiled_note",
    "compiled_note",
]

_lock = threading.Lock()
#: (framework, operation) -> the function staging that operation on that framework's traced arrays
_handlers: dict[tuple[str, str], Callable[..., Any]] = {}
#: (framework, operation) -> the function offered every call of the operation on that framework's arrays
_offered: dict[tuple[str, str], Callable[..., Any]] = {}
_entries: dict[str, Callable[..., Any]] = {}
_markers: tuple[Callable[[str, Callable[..., Any]], None], ...] = ()
#: (framework, operation) -> what the integration does with such calls inside compiled programs (explain())
_notes: dict[tuple[str, str], Callable[[], str]] = {}


def register_compiled_note(framework: str, operation: str, note: Callable[[Any], str]) -> None:
    """``note(problem)`` says how a call of ``operation`` on ``framework``'s arrays (its problem, as detected)
    runs inside that framework's compiled programs (``explain()`` shows it: e.g. which route a staged JAX matmul
    takes on the GPU and why, and where its algorithm came from)."""
    with _lock:
        _notes[(framework, operation)] = note


def compiled_note(framework: str, operation: str, problem: Any = None) -> str | None:
    """The registered note for ``operation`` on ``framework`` about ``problem``, or None. A note that fails says
    so."""
    note = _notes.get((framework, operation))
    if note is None:
        return None
    try:
        return note(problem)
    except Exception as exc:  # noqa: BLE001 - the note explains; its failure is part of the explanation
        return f"{type(exc).__name__}: {exc}"


def register_traced(framework: str, operation: str, handler: Callable[..., Any], *, all_arrays: bool = False) -> None:
    """Make ``handler`` stage ``operation`` (``"matmul"``, ``"fft"``, ...) when a traced array of ``framework``
    reaches it; it takes the public function's arguments (see the callers). ``all_arrays``: offer it every call of
    the operation on ``framework``'s arrays instead (it returns ``NotImplemented`` for a call it leaves)."""
    with _lock:
        (_offered if all_arrays else _handlers)[(framework, operation)] = handler


def unregister_traced(framework: str, operation: str) -> None:
    """Forget the handlers of ``operation`` for ``framework`` (no-op when none is registered)."""
    with _lock:
        _handlers.pop((framework, operation), None)
        _offered.pop((framework, operation), None)


def traced_framework(x: Any) -> str | None:
    """The framework whose program is being traced when ``x`` is a traced array (``"jax"``), else None."""
    ad = adapter_for(x)
    return None if ad is None else ad.traced_framework


def traced_handler(operation: str, operands: Iterable[Any], call_key: Hashable = None) -> Callable[..., Any] | None:
    """The handler of ``operation`` for ``operands`` (None entries skipped): the staging handler where one of them is
    a traced array, else the handler offered every call on the arrays of the first operand's framework that has
    one, else None (the call runs). :class:`~nvdispatch.errors.UnsupportedOperandError` when a traced array's
    framework has no handler for the operation.

    ``call_key``: the call's key in the plan cache, where the route gave it one; an offered handler is returned
    with it bound (its keyword ``call_key``): a handler taking the call may keep a plan under that key (the Plan
    protocol's ``direct``/``execute``, run by the route's hit on the call's repeats, which then reach neither the
    route's miss path nor the handler)."""
    operands = [x for x in operands if x is not None]
    adapters = [adapter_for(x) for x in operands]
    for x, ad in zip(operands, adapters):
        framework = None if ad is None else ad.traced_framework
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
    if _offered:
        for ad in adapters:
            handler = None if ad is None else _offered.get((ad.name, operation))
            if handler is not None:
                return handler if call_key is None else functools.partial(handler, call_key=call_key)
    return None


def announce(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """Make public function ``function`` (called ``name``) known to every entry marker, now and later installed
    ones; returns ``function``."""
    with _lock:
        _entries[name] = function
        markers = _markers
    for mark in markers:
        mark(name, function)
    return function


def add_entry_marker(marker: Callable[[str, Callable[..., Any]], None]) -> None:
    """Install ``marker(name, function)`` and show it every announced entry point (and every later one)."""
    global _markers
    with _lock:
        _markers = (*_markers, marker)
        entries = dict(_entries)
    for name, function in entries.items():
        marker(name, function)
