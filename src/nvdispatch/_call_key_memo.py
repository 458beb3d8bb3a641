"""What repeated calls' keys led to, remembered behind a guard, for arrays whose signatures are costly to read.

A call key (see :mod:`nvdispatch._call_key`) holds each operand's adapter signature. For most frameworks that
is one native attribute read; a Torch tensor's takes six (dtype, size, stride, device, autograd), which with
hashing the key again costs more than the rest of a cached call. An adapter that can build a *guard* — one
native check that arrays still have the dtype, shape, strides, device and autograd state they had — lets the
route skip both: per *form* of call (everything of the key but the signatures: operation, epilog, scalar
classes, backend state...), the memo keeps, for the last few repeated calls, the plan cache's *handle* on the
plan their key led to (:meth:`~nvdispatch._plan_cache.PlanCache.handle`), each behind its guard. A call whose
guard passes acquires its plan by that handle. A handle goes stale when the cache drops the key it was taken
for (eviction, ``clear``, ``Matmul.autotune`` choosing another plan): the call then builds its key, looks it up
as any call does and remembers the new handle. So eviction, clearing, pinning and autotune's choices work as for
any key. A stale handle still references its (released) plan object until the form's newer calls push it out.

One memo per array class (``nvdispatch._call_key.ClassKeys.memo``, dropped when adapters change). The route
reads :attr:`CallKeyMemo.handles` without a lock; every update replaces a form's tuple whole.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["CallKeyMemo"]


class CallKeyMemo:
    """The plan-cache handles of repeated calls of one array class, by form, each behind a guard.

    ``guard(*arrays)`` is the adapter's guard factory: a function ``check(*arrays) -> bool`` telling whether
    arrays have again the signatures these had, or None where it cannot tell cheaply (the call then keeps its
    signatures).
    """

    #: handles kept per form (the newest first): calls alternating between a few shapes all find theirs
    per_form = 4
    #: guards built per form at most: beyond, a form whose shapes keep changing stops paying for new guards
    builds_per_form = 16
    #: forms kept at most (each backend state is a form of its own): beyond, the memo starts afresh
    max_forms = 1024

    def __init__(self, guard: Callable[..., Callable[..., bool] | None]):
        self.guard = guard
        #: form -> ((check, entry, epoch), ...), newest first; the route reads it without a lock and acquires
        #: the plan of the first handle ``(entry, epoch)`` whose check its arrays pass
        self.handles: dict[Hashable, tuple[tuple[Callable[..., bool], Any, int], ...]] = {}
        self._builds: dict[Hashable, int] = {}

    def remember(self, form: Hashable, arrays: tuple, handle: tuple[Any, int] | None) -> None:
        """Keep ``handle`` (the plan cache's, on the plan a repeated call's key found) for ``form``, behind a
        guard on ``arrays``."""
        builds = self._builds.get(form, 0)
        if handle is None or builds >= self.builds_per_form:
            return
        check = self.guard(*arrays)
        if check is None:
            return
        if len(self._builds) >= self.max_forms:
            self.handles.clear()
            self._builds.clear()
        self._builds[form] = builds + 1
        live = [r for r in self.handles.get(form, ()) if r[1].epoch == r[2]]  # stale handles go first
        self.handles[form] = ((check, *handle), *live[: self.per_form - 1])
