"""Call keys remembered behind a guard, for arrays whose signatures are costly to read.

A call key (see :mod:`nvdispatch._dispatch`) holds each operand's adapter signature. For most frameworks that
is one native attribute read; a Torch tensor's takes six (dtype, size, stride, device, autograd), ~0.6 us per
tensor, more than the rest of a cached call. An adapter that can build a *guard* — one native check that
arrays still have the dtype, shape, strides, device and autograd state they had — lets the route skip them:
per *form* of call (everything of the key but the signatures: operation, epilog, scalar classes, backend
state...), the memo keeps the keys of the last few repeated calls, each behind its guard. A call whose guard
passes reuses that key, and its plan is still looked up in the plan cache by it: the memo holds keys, never
plans, so eviction, clearing and pinning work as for any key.

One memo per array class (the route keeps them in ``nvdispatch._adapters.call_key_memo_by_class``, dropped
when adapters change). The route reads :attr:`CallKeyMemo.keys` without a lock; every update replaces a
form's tuple whole.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

__all__ = ["CallKeyMemo"]


class CallKeyMemo:
    """The call keys of repeated calls of one array class, by form, each behind a guard.

    ``guard(*arrays)`` is the adapter's guard factory: a function ``check(*arrays) -> bool`` telling whether
    arrays have again the signatures these had, or None where it cannot tell cheaply (the call then keeps its
    signatures).
    """

    #: keys kept per form (the newest first): calls alternating between a few shapes all find theirs
    per_form = 4
    #: guards built per form at most: beyond, a form whose shapes keep changing stops paying for new guards
    builds_per_form = 16
    #: forms kept at most (each backend state is a form of its own): beyond, the memo starts afresh
    max_forms = 1024

    def __init__(self, guard: Callable[..., Callable[..., bool] | None]):
        self.guard = guard
        #: form -> ((check, key), ...), newest first; the route reads it without a lock and takes the first key
        #: whose check its arrays pass
        self.keys: dict[Hashable, tuple[tuple[Callable[..., bool], Hashable], ...]] = {}
        self._builds: dict[Hashable, int] = {}

    def remember(self, form: Hashable, arrays: tuple, key: Hashable) -> None:
        """Keep ``key`` (a repeated call's, found in the plan cache) for ``form``, behind a guard on ``arrays``."""
        builds = self._builds.get(form, 0)
        if builds >= self.builds_per_form:
            return
        check = self.guard(*arrays)
        if check is None:
            return
        if len(self._builds) >= self.max_forms:
            self.keys.clear()
            self._builds.clear()
        self._builds[form] = builds + 1
        self.keys[form] = ((check, key), *self.keys.get(form, ())[: self.per_form - 1])
