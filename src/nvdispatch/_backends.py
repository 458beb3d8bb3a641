"""Backend control in the style of ``scipy.fft``: ``set_backend``, ``set_global_backend``,
``register_backend`` and ``skip_backend``.

Resolution order for a call (as SciPy/uarray): the backends of active ``set_backend`` contexts, innermost
first; then the global backend; then registered backends (``set_global_backend(..., try_last=True)`` puts
the global one after them); then the built-in default executors for the operands' framework and device.
A backend set with ``only=True`` ends the list after itself; ``coerce=True`` lets it convert operands of
other frameworks and implies ``only``. ``skip_backend`` removes a backend from the list wherever it is.

Context state lives in ``contextvars``, so it is local to each thread and asyncio task; global and
registered backends are process-wide and guarded by a lock.
"""

from __future__ import annotations

import contextvars
import threading
from dataclasses import dataclass
from typing import Any

from . import executors as _executors
from .errors import UnknownBackendError, describe

__all__ = [
    "set_backend",
    "set_global_backend",
    "register_backend",
    "skip_backend",
    "resolve_backend",
    "candidates",
    "Candidate",
]


@dataclass(frozen=True)
class Candidate:
    executor: Any
    coerce: bool
    only: bool


_local: contextvars.ContextVar[tuple[Candidate, ...]] = contextvars.ContextVar("nvdispatch_local", default=())
_skipped: contextvars.ContextVar[tuple[Any, ...]] = contextvars.ContextVar("nvdispatch_skipped", default=())
_lock = threading.Lock()
_global: Candidate | None = None
_global_try_last = False
_registered: tuple[Any, ...] = ()
# How many set_backend/skip_backend contexts are open in any thread, plus one for a global backend and
# one for registered backends: zero lets the hot path skip resolution with one global read.
_in_use = 0


def _count(delta: int) -> None:
    global _in_use
    with _lock:
        _in_use += delta


def _is_executor(obj: Any) -> bool:
    return all(callable(getattr(obj, m, None)) for m in ("decline", "strategies", "plan")) and hasattr(obj, "name")


def resolve_backend(backend: Any, argument: str = "backend"):
    """Turn a backend name or object into an executor; ``UnknownBackendError`` if it is neither."""
    if isinstance(backend, str):
        inst = _executors.builtin(backend)
        if inst is None:
            for reg in _registered:
                if reg.name == backend:
                    return reg
            known = sorted(set(_executors.BUILTIN) | {r.name for r in _registered})
            raise UnknownBackendError(argument, f"one of {known} or an executor object", repr(backend))
        return inst
    if _is_executor(backend):
        return backend
    raise UnknownBackendError(
        argument,
        "a backend name or an executor (an object with name, decline, strategies and plan)",
        describe(backend),
    )


class set_backend:
    """Context manager: prefer ``backend`` for calls made inside the ``with`` block (this thread/task only).

    Parameters
    ----------
    backend : str or executor
        ``"numpy"``, ``"torch"``, ``"cupy"``, ``"cuda"``, a registered name, or an executor object.
    coerce : bool
        Let the backend convert operands from other frameworks (results come back in its framework).
        Implies ``only``.
    only : bool
        If the backend declines, fail instead of trying further backends.

    Examples
    --------
    >>> import numpy as np, nvdispatch
    >>> with nvdispatch.set_backend("numpy", only=True):
    ...     r = nvdispatch.matmul(np.eye(2), np.ones((2, 2)))
    """

    def __init__(self, backend: Any, coerce: bool = False, only: bool = False):
        self._candidate = Candidate(resolve_backend(backend), bool(coerce), bool(only or coerce))
        self._tokens: list[contextvars.Token] = []

    def __enter__(self):
        self._tokens.append(_local.set(_local.get() + (self._candidate,)))
        _count(1)
        return self

    def __exit__(self, *exc):
        _local.reset(self._tokens.pop())
        _count(-1)
        return False


class skip_backend:
    """Context manager: never use ``backend`` inside the ``with`` block (this thread/task only)."""

    def __init__(self, backend: Any):
        self._executor = resolve_backend(backend)
        self._tokens: list[contextvars.Token] = []

    def __enter__(self):
        self._tokens.append(_skipped.set(_skipped.get() + (self._executor,)))
        _count(1)
        return self

    def __exit__(self, *exc):
        _skipped.reset(self._tokens.pop())
        _count(-1)
        return False


def set_global_backend(backend: Any, coerce: bool = False, only: bool = False, try_last: bool = False) -> None:
    """Make ``backend`` the process-wide preferred backend (``None`` restores the built-in defaults).

    ``try_last=True`` tries registered backends before it, as in SciPy.
    """
    global _global, _global_try_last, _in_use
    cand = None if backend is None else Candidate(resolve_backend(backend), bool(coerce), bool(only or coerce))
    with _lock:
        _in_use += (cand is not None) - (_global is not None)
        _global, _global_try_last = cand, bool(try_last)


def register_backend(backend: Any) -> None:
    """Add ``backend`` to the process-wide list tried after the global backend (once; re-adding is a no-op).

    A registered executor object can afterwards be selected by its ``name``.
    """
    global _registered, _in_use
    ex = resolve_backend(backend)
    with _lock:
        if not any(r is ex for r in _registered):
            _in_use += not _registered
            _registered = _registered + (ex,)


def _unregister_all() -> None:
    """Forget registered and global backends (for tests)."""
    global _registered, _global, _global_try_last, _in_use
    with _lock:
        _in_use -= bool(_registered) + (_global is not None)
        _registered, _global, _global_try_last = (), None, False


def is_default_state() -> bool:
    """True when no backend control is in effect (lets hot paths skip resolution)."""
    return not _in_use


def is_requested(executor: Any) -> bool:
    """Whether ``executor`` was asked for by name or object (an active ``set_backend`` or the global
    backend), as opposed to being tried as a default. Executors that decline some calls only to leave
    them to a faster default (e.g. plain GPU matmuls to the framework) take them when requested."""
    return any(c.executor is executor for c in _local.get()) or (_global is not None and _global.executor is executor)


def any_coercing() -> bool:
    """Whether some active backend may convert foreign operands."""
    return any(c.coerce for c in _local.get()) or (_global is not None and _global.coerce)


def candidates(framework: str, device_kind: str) -> list[Candidate]:
    """The executors to try, in order, for operands of ``framework`` on a ``device_kind`` device."""
    skipped = _skipped.get()
    out: list[Candidate] = []

    def add(c: Candidate) -> bool:
        """Append unless skipped or already listed; True when the list ends here (only=True)."""
        if any(c.executor is s for s in skipped):
            return False
        if not any(c.executor is o.executor for o in out):
            out.append(c)
        return c.only

    for c in reversed(_local.get()):
        if add(c):
            return out
    glob, regs = _global, _registered
    if glob is not None and not _global_try_last and add(glob):
        return out
    for r in regs:
        add(Candidate(r, False, False))
    if glob is not None and _global_try_last and add(glob):
        return out
    for name in _executors.default_names(framework, device_kind):
        inst = _executors.builtin(name)
        if inst is not None:
            add(Candidate(inst, False, False))
    return out
