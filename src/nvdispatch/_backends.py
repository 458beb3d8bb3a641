"""Backend control in the style of ``scipy.fft``: ``set_backend``, ``set_global_backend``,
``register_backend``, ``skip_backend``, ``get_state``/``set_state`` and ``reset_backends``.

Resolution order for a call (as SciPy/uarray): the backends of active ``set_backend`` contexts, innermost
first; then the global backend; then registered backends (``set_global_backend(..., try_last=True)`` puts
the global one after them); then the default executors for the operands' framework and device (the
framework adapter's ``default_executors``). A backend set with ``only=True`` ends the list after itself;
``coerce=True`` lets it convert operands of other frameworks and implies ``only``. ``skip_backend``
removes a backend from the list wherever it is.

State
-----
What the ``with`` blocks set is one immutable :class:`BackendState` held in one ``ContextVar``: local to
each thread and asyncio task, inherited by tasks (and by threads run in a copied context) and kept by
them after the block that set it exits in its own thread/task. :func:`get_state` returns it and
:func:`set_state` makes it current in another thread or task (``with nvdispatch.set_state(state):``), as
uarray allows. The global and registered backends are process-wide: one immutable snapshot replaced under
a lock. Both snapshots carry a small integer ``key``, equal for equal states, which the call route puts in
its plan-cache keys.

Context objects hold no state of their own: one ``set_backend`` object may be entered from several
threads and tasks at once, and re-entered. Leaving a ``with`` block, or a ``contextlib.ExitStack`` that
entered the context, runs no Python code of nvdispatch's (see :class:`_ExitHook`), so a ``KeyboardInterrupt``
arriving at any point of nvdispatch's entry or exit cannot leave the context active. ``ExitStack`` itself
(Python code in ``contextlib``) has two windows of its own: between calling ``__enter__`` and registering
the exit (``enter_context``), and between taking an exit off its stack and calling it (``__exit__``); an
interrupt landing there leaves the context active, as it would any context manager's (``reset_backends()``
ends them). tests/soak/exit_interrupts.py injects interrupts at every point a Ctrl-C can land and counts
where contexts were left active.
"""

from __future__ import annotations

import contextvars
import functools
import io
import threading
from dataclasses import dataclass
from typing import Any, TypeVar

from . import executors as _executors
from .errors import InvalidArgumentError, UnknownBackendError, describe, expect_bool

__all__ = [
    "set_backend",
    "set_global_backend",
    "register_backend",
    "unregister_backend",
    "skip_backend",
    "get_state",
    "set_state",
    "reset_backends",
    "BackendState",
    "resolve_backend",
    "candidates",
    "Candidate",
    "Registry",
    "registry",
]


@dataclass(frozen=True)
class Candidate:
    executor: Any
    coerce: bool
    only: bool


_lock = threading.Lock()
#: (local, skipped) -> a small int, the same for equal states (cheap to hash in plan-cache keys)
_state_keys: dict[tuple, int] = {}


def _key_of(value: tuple) -> int:
    key = _state_keys.get(value)
    if key is None:
        with _lock:
            key = _state_keys.setdefault(value, len(_state_keys))
    return key


class BackendState:
    """An immutable snapshot of the backends set in a thread/task: ``local`` (active ``set_backend``
    candidates, innermost last) and ``skipped`` (executors skipped). Get it with :func:`get_state`;
    make it current elsewhere with :func:`set_state`."""

    __slots__ = ("local", "skipped", "key", "_parent", "_entered_by")

    def __init__(self, local=(), skipped=(), *, parent=None, entered_by=None):
        self.local: tuple[Candidate, ...] = tuple(local)
        self.skipped: tuple[Any, ...] = tuple(skipped)
        self.key: int = _key_of((self.local, tuple(id(s) for s in self.skipped)))
        self._parent = parent
        self._entered_by = entered_by

    def __eq__(self, other) -> bool:
        return isinstance(other, BackendState) and self.key == other.key

    def __hash__(self) -> int:
        return self.key

    def __repr__(self) -> str:
        local = [c.executor.name for c in self.local]
        return f"<nvdispatch.BackendState local={local} skipped={[s.name for s in self.skipped]}>"

    def __reduce__(self):
        # carried into Dask tasks / other processes: the value, not the chain of enclosing blocks
        return (BackendState, (self.local, self.skipped))


_EMPTY = BackendState()
_state: contextvars.ContextVar[BackendState] = contextvars.ContextVar("nvdispatch_backends", default=_EMPTY)


@dataclass(frozen=True)
class _Global:
    """The process-wide part: the global backend (and whether it goes last) and the registered ones."""

    candidate: Candidate | None = None
    try_last: bool = False
    registered: tuple[Any, ...] = ()
    key: int = 0


_global = _Global()


class Registry:
    """The backend state as the call route reads it, in one object (the compiled front reads it too).

    ``current_state()`` is this thread/task's :class:`BackendState` (``ContextVar.get``: a C call) and
    ``global_key`` the key of the process-wide part, replaced whenever the global or registered backends
    change: a call key holds ``(current_state().key, global_key)``. :meth:`order` is the one place the
    resolution order of the chosen backends is implemented.
    """

    __slots__ = ("current_state", "global_key")

    def __init__(self) -> None:
        self.current_state = _state.get
        self.global_key = _global.key

    def order(self) -> tuple[Candidate, ...]:
        """The backends chosen in this thread/task, in the order a call tries them: the active ``set_backend``
        blocks innermost first, then the global backend (unless ``try_last``), the registered backends, and
        the global backend when it goes last. Skipped backends and the default executors are not listed."""
        glob = _global
        first = () if glob.candidate is None or glob.try_last else (glob.candidate,)
        last = () if glob.candidate is None or not glob.try_last else (glob.candidate,)
        registered = tuple(Candidate(r, False, False) for r in glob.registered)
        return (*reversed(_state.get().local), *first, *registered, *last)


registry = Registry()


def _set_global(**changes) -> None:
    global _global
    with _lock:
        fields = {"candidate": _global.candidate, "try_last": _global.try_last, "registered": _global.registered}
        fields.update(changes)
        _global = _Global(**fields, key=_global.key + 1)
        registry.global_key = _global.key


def _is_executor(obj: Any) -> bool:
    return all(callable(getattr(obj, m, None)) for m in ("decline", "strategies", "plan")) and hasattr(obj, "name")


def resolve_backend(backend: Any, argument: str = "backend"):
    """Turn a backend name or object into an executor; ``UnknownBackendError`` if it is neither."""
    if isinstance(backend, str):
        inst = _executors.builtin(backend)
        if inst is None:
            for reg in _global.registered:
                if reg.name == backend:
                    return reg
            known = sorted(set(_executors.BUILTIN) | {r.name for r in _global.registered})
            raise UnknownBackendError(argument, f"one of {known} or an executor object", repr(backend))
        return inst
    if _is_executor(backend):
        return backend
    raise UnknownBackendError(
        argument,
        "a backend name or an executor (an object with name, decline, strategies and plan)",
        describe(backend),
    )


class _Exit(io.IOBase):
    """A C-level ``__exit__``: ``io.IOBase.__exit__(*exc)`` calls ``self.close()`` and returns its
    result. :meth:`_StateContext.__enter__` sets ``close`` to ``functools.partial(ContextVar.reset,
    token)`` (C, returns None), so leaving the block restores the state without running Python code,
    and a KeyboardInterrupt cannot land in between. ``close`` as a method is the fallback for an exit
    called by hand (``cm.__exit__(...)``) without a matching ``with`` entry."""

    closed = True  # so IOBase's finalizer never calls close() again

    def __init__(self, owner):
        self._owner = owner

    def close(self):  # only when __enter__ did not bind the C reset (a hand-called __exit__)
        return _manual_exit(self._owner)


_pending = threading.local()  # (context object, _Exit) between the __exit__ lookup and __enter__


class _ExitHook:
    """The ``__exit__`` of backend contexts, as a descriptor. A ``with`` statement looks ``__exit__`` up on
    the instance, and ``contextlib.ExitStack.enter_context`` on the class (``type(cm).__exit__``), both
    before they call ``__enter__``: the lookup returns a fresh exit, which ``__enter__`` (next, on this
    thread) arms with the token of the state it sets, so that leaving runs no Python code.

    * on the instance: the bound C method ``__exit__`` of an :class:`_Exit`;
    * on the class: a ``functools.partial`` of :func:`_class_exit` (called with the context object and the
      exception), which ``__enter__`` re-targets (``partial.__setstate__``) at an armed :class:`_Exit`'s
      ``__exit__``: still a C call, whatever arguments it is given.

    An exit looked up but never armed (no ``__enter__`` followed it on this thread: an exit called by hand,
    ``ExitStack.push`` of an entered context) runs :func:`_manual_exit` in Python."""

    def __get__(self, obj, cls=None):
        if obj is None:
            exit_ = functools.partial(_class_exit)
            _pending.slot = (cls, exit_)
            return exit_
        hook = _Exit(obj)
        _pending.slot = (obj, hook)
        return hook.__exit__


def _class_exit(self, *exc):
    """``type(cm).__exit__(cm, ...)`` called without a matching entry (by hand, or pushed on an ExitStack
    after entering)."""
    return _manual_exit(self)


def _manual_exit(owner) -> None:
    """Leave the innermost block ``owner`` entered in this thread/task (and any left open inside it)."""
    state = _state.get()
    while state is not None and state._entered_by is not owner:
        state = state._parent
    if state is None:
        raise InvalidArgumentError(
            "context", f"a {type(owner).__name__} entered in this thread/task", "one that is not active here"
        )
    _state.set(state._parent)


_Context = TypeVar("_Context", bound="_StateContext")


class _StateContext:
    """Base of the backend context managers: ``__enter__`` makes ``self._new_state(current)`` current
    in this thread/task; leaving restores what was current before (see :class:`_ExitHook`)."""

    __exit__ = _ExitHook()

    def _new_state(self, current: BackendState) -> BackendState:
        raise NotImplementedError

    def __enter__(self: _Context) -> _Context:
        slot = getattr(_pending, "slot", None)
        _pending.slot = None
        hook = slot[1] if slot is not None and (slot[0] is self or slot[0] is type(self)) else None
        old = _state.get()
        new = self._new_state(old)
        closer = hook if isinstance(hook, _Exit) else _Exit(self)
        try:
            token = _state.set(new)
            closer.close = functools.partial(_state.reset, token)
            if hook is not None and hook is not closer:  # the class-level exit: aim it at the armed C exit
                hook.__setstate__((closer.__exit__, (), None, None))
            return self
        except BaseException:  # interrupted after the set: the block is not entered, undo it
            _state.set(old)
            raise


class set_backend(_StateContext):
    """Context manager: prefer ``backend`` for calls made inside the ``with`` block (this thread/task and
    the tasks it starts).

    Parameters
    ----------
    backend : str or executor
        ``"numpy"``, ``"torch"``, ``"cupy"``, ``"cuda"``, a registered name, or an executor object.
    coerce : bool
        Let the backend convert operands from other frameworks (results come back in its framework).
        Implies ``only``.
    only : bool
        If the backend declines, fail instead of trying further backends.

    One object may be entered from several threads or tasks at once, and re-entered.

    Examples
    --------
    >>> import numpy as np, nvdispatch
    >>> with nvdispatch.set_backend("numpy", only=True):
    ...     r = nvdispatch.matmul(np.eye(2), np.ones((2, 2)))
    """

    def __init__(self, backend: Any, coerce: bool = False, only: bool = False) -> None:
        coerce, only = expect_bool("coerce", coerce), expect_bool("only", only)
        self._candidate = Candidate(resolve_backend(backend), coerce, only or coerce)

    def _new_state(self, current: BackendState) -> BackendState:
        return BackendState(current.local + (self._candidate,), current.skipped, parent=current, entered_by=self)


class skip_backend(_StateContext):
    """Context manager: never use ``backend`` inside the ``with`` block (this thread/task only).

    Examples
    --------
    >>> import numpy as np, nvdispatch
    >>> with nvdispatch.skip_backend("torch"):
    ...     r = nvdispatch.matmul(np.eye(2), np.ones((2, 2)))
    """

    def __init__(self, backend: Any) -> None:
        self._executor = resolve_backend(backend)

    def _new_state(self, current: BackendState) -> BackendState:
        return BackendState(current.local, current.skipped + (self._executor,), parent=current, entered_by=self)


class set_state(_StateContext):
    """Context manager: make ``state`` (from :func:`get_state`, maybe in another thread or task) the
    backend state inside the ``with`` block.

    Examples
    --------
    >>> import threading, numpy as np, nvdispatch
    >>> with nvdispatch.set_backend("numpy", only=True):
    ...     state = nvdispatch.get_state()
    >>> def work():
    ...     with nvdispatch.set_state(state):
    ...         return nvdispatch.explain(np.eye(2), np.eye(2)).executor
    >>> work()
    'numpy'
    """

    def __init__(self, state: BackendState) -> None:
        if not isinstance(state, BackendState):
            raise InvalidArgumentError("state", "a BackendState from nvdispatch.get_state()", describe(state))
        self._state = state

    def _new_state(self, current: BackendState) -> BackendState:
        return BackendState(self._state.local, self._state.skipped, parent=current, entered_by=self)


def get_state() -> BackendState:
    """The backend state of this thread/task (what its active ``set_backend``/``skip_backend`` blocks
    set), to carry into worker threads or Dask tasks with :class:`set_state`.

    Examples
    --------
    >>> import nvdispatch
    >>> nvdispatch.get_state().local
    ()
    """
    return _state.get()


def set_global_backend(backend: Any, coerce: bool = False, only: bool = False, try_last: bool = False) -> None:
    """Make ``backend`` the process-wide preferred backend (``None`` restores the built-in defaults).

    ``try_last=True`` tries registered backends before it, as in SciPy.

    Examples
    --------
    >>> import numpy as np, nvdispatch
    >>> nvdispatch.set_global_backend("numpy", only=True)
    >>> nvdispatch.explain(np.eye(2), np.eye(2)).executor
    'numpy'
    >>> nvdispatch.set_global_backend(None)  # back to the built-in defaults
    """
    coerce, only, try_last = expect_bool("coerce", coerce), expect_bool("only", only), expect_bool("try_last", try_last)
    cand = None if backend is None else Candidate(resolve_backend(backend), coerce, only or coerce)
    _set_global(candidate=cand, try_last=try_last)


def register_backend(backend: Any) -> None:
    """Add ``backend`` to the process-wide list tried after the global backend (once; re-adding is a no-op).

    A registered executor object can afterwards be selected by its ``name``; :func:`unregister_backend`
    removes it.

    Examples
    --------
    >>> import numpy as np, nvdispatch
    >>> from nvdispatch.executors import Executor, builtin
    >>> class Mine(Executor):  # NumPy's executor under another name
    ...     name = "mine"
    ...     fused_epilogs = "all"
    ...     def decline(self, op, problem, *, coerce=False):
    ...         return builtin("numpy").decline(op, problem, coerce=coerce)
    ...     def strategies(self, op, problem):
    ...         return builtin("numpy").strategies(op, problem)
    ...     def plan(self, op, problem, strategy, tuning=None):
    ...         return builtin("numpy").plan(op, problem, strategy, tuning)
    >>> nvdispatch.register_backend(Mine())
    >>> nvdispatch.explain(np.eye(2), np.eye(2)).executor
    'mine'
    >>> nvdispatch.unregister_backend("mine")
    """
    ex = resolve_backend(backend)
    if not any(r is ex for r in _global.registered):
        _set_global(registered=_global.registered + (ex,))


def unregister_backend(backend: Any) -> None:
    """Remove ``backend`` (an executor object, or the name it was registered under) from the registered ones.

    A backend that is also the global one stays global until ``set_global_backend(None)``; active
    ``set_backend`` blocks are not affected.

    Raises
    ------
    UnknownBackendError
        ``backend`` is not registered.

    Examples
    --------
    >>> import nvdispatch
    >>> try:
    ...     nvdispatch.unregister_backend("numpy")  # built in, never registered
    ... except nvdispatch.errors.UnknownBackendError as error:
    ...     print(error.argument)
    backend
    """
    registered = _global.registered
    if isinstance(backend, str):
        found = [r for r in registered if r.name == backend]
    else:
        found = [r for r in registered if r is backend]
    if not found:
        names = [r.name for r in registered]
        raise UnknownBackendError(
            "backend", f"a registered backend (registered: {names or 'none'})", describe(backend)
        )
    _set_global(registered=tuple(r for r in registered if r is not found[0]))


def reset_backends() -> None:
    """Forget the global and registered backends, and end every ``set_backend``/``skip_backend``/
    ``set_state`` block active in the calling thread or task: after a ``KeyboardInterrupt`` in an
    interactive session, or between tests, this returns to the built-in defaults.

    Other threads' and tasks' blocks are theirs. A ``with`` block still open when this is called restores,
    on exit, what was active when it was entered.

    Examples
    --------
    >>> import nvdispatch
    >>> nvdispatch.set_global_backend("numpy")
    >>> nvdispatch.reset_backends()
    >>> nvdispatch.get_state().local
    ()
    """
    _set_global(candidate=None, try_last=False, registered=())
    _state.set(_EMPTY)


def _unregister_all() -> None:
    """Forget registered and global backends (for tests)."""
    _set_global(candidate=None, try_last=False, registered=())


def is_requested(executor: Any) -> bool:
    """Whether ``executor`` was asked for by name or object (an active ``set_backend`` or the global
    backend), as opposed to being tried as a default. Executors that decline some calls only to leave
    them to a faster default (e.g. plain GPU matmuls to the framework) take them when requested."""
    glob = _global.candidate
    return any(c.executor is executor for c in _state.get().local) or (glob is not None and glob.executor is executor)


def any_coercing() -> bool:
    """Whether some active backend may convert foreign operands."""
    glob = _global.candidate
    return any(c.coerce for c in _state.get().local) or (glob is not None and glob.coerce)


def candidates(framework: str, device_kind: str) -> list[Candidate]:
    """The executors to try, in order, for operands of ``framework`` on a ``device_kind`` device: the chosen
    backends (:meth:`Registry.order`) up to the first with ``only``, then the framework's default executors;
    skipped ones left out, each listed once."""
    skipped = _state.get().skipped
    out: list[Candidate] = []

    def add(c: Candidate) -> bool:
        """Append unless skipped or already listed; True when the list ends here (only=True)."""
        if any(c.executor is s for s in skipped):
            return False
        if not any(c.executor is o.executor for o in out):
            out.append(c)
        return c.only

    for c in registry.order():
        if add(c):
            return out
    for name in _executors.default_names(framework, device_kind):
        inst = _executors.builtin(name)
        if inst is not None:
            add(Candidate(inst, False, False))
    return out
