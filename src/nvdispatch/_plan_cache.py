"""The one plan cache every executor shares: a bounded, thread-safe LRU of prepared plans.

Keys are tuples holding everything that changes a plan (operation, executor, device, dtypes, shapes,
strides, epilog, options, strategy...). Values are executor plans. One plan may be held under several keys
(a hot path's cheap key beside the full problem key): it is **one entry** — it counts once towards the
size, is evicted once (with all its keys), and is shown once by :meth:`PlanCache.show_info`.

Lifetime. A plan is *used* by the cache itself while cached, by each stateful ``Matmul``/``FFT`` planned
with it (a :class:`PlanHold`) and by each call running it (:meth:`PlanCache.acquire` ...
:meth:`PlanCache.let_go`). Eviction and :meth:`PlanCache.clear` only retire an entry; its plan is released
(``plan.release()``: cuFFT handles destroyed, workspaces given back) when its last user lets go. A plan
whose release frees nothing says so (``needs_release = False``, the CPU plans): calls do not pin it, which
spares the per-call hot path its bookkeeping; stateful holds are still counted.

Bounds. The cache holds at most ``maxsize`` plans and ``max_bytes`` bytes of plan workspaces (a plan
reports its bytes as ``workspace_bytes``; plans without one count 0). A plan's bytes are read once, when it
is cached; a plan that allocates more later (per-stream cuBLASLt workspaces, on first use) says so with
:meth:`PlanCache.resized`, and the bound holds from then on.

Tunings. The cache hands each plan it makes the tuned choice known for its key (autotuned here, or loaded
from a file by :meth:`PlanCache.load`), and saves those of its plans with :meth:`PlanCache.save`; what a
tuning is, how it is keyed, checked and written is :mod:`nvdispatch._tunings`'.

Compiled. Where the extension is built, an instance's per-call steps (:meth:`PlanCache.acquire`,
:meth:`PlanCache.acquire_handle`, :meth:`PlanCache.pin`, :meth:`PlanCache.let_go`) are their compiled forms
(``_hotpath_cache.c``: the same steps on the same objects, without a Python frame per cached call); the methods
here define them and run where it is not built (or ``NVDISPATCH_PURE_PYTHON`` is set).

Small memoised answers that are not plans (which cuBLASLt epilogues fuse natively, say) live here too
(:meth:`PlanCache.memo`), bounded by ``maxsize`` and dropped by :meth:`clear`.
"""

from __future__ import annotations

import math
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

from ._compiled import hotpath
from ._tunings import Tunings
from .errors import InvalidArgumentError

__all__ = ["PlanCache", "PlanHold", "plan_cache", "workspace_bytes_of", "DEFAULT_MAX_BYTES"]

#: default bound on the workspace bytes the cache holds
DEFAULT_MAX_BYTES = 1 << 30


class _Entry:
    """One cached plan: its keys, its users and its bytes."""

    __slots__ = ("plan", "keys", "users", "retired", "released", "nbytes", "pinless", "epoch")

    def __init__(self, plan: Any):
        self.plan = plan
        self.keys: list[Hashable] = []
        # one item per user besides the cache; list.append/pop are atomic, so calls pin without the lock
        self.users: list[None] = []
        self.retired = False  # no longer cached: released when the last user lets go
        self.released = False
        self.nbytes = 0  # counted while cached: set by PlanCache._insert
        # release frees nothing: a call may run it unpinned, even after it was retired and released
        self.pinless = getattr(plan, "needs_release", True) is False
        # bumped whenever the entry loses keys (retired, or keys forgotten): handles taken before go stale
        self.epoch = 0


class PlanHold:
    """A stateful object's hold on a plan: the plan stays usable until :meth:`close` (or until the hold is
    garbage-collected), even if the cache evicts it meanwhile.

    Examples
    --------
    >>> from nvdispatch._plan_cache import PlanCache
    >>> class Plan:
    ...     def release(self): print("released")
    >>> cache = PlanCache(maxsize=1)
    >>> hold = cache.hold(cache.put("key", Plan()))
    >>> cache.clear()  # retired, but still held
    >>> hold.close()
    released
    """

    __slots__ = ("plan", "_cache", "_token", "__weakref__")

    def __init__(self, cache: PlanCache, plan: Any):
        # the hold counts itself by a token of its own, so that letting go can be retried (by close() again or
        # __del__) after an interrupt at any point without taking another user's count
        self.plan, self._cache, self._token = plan, cache, object()
        cache._count_user(plan, self._token)

    def close(self) -> None:
        """Let go of the plan (idempotent; safe to call again after an interrupt)."""
        cache = self._cache
        if cache is not None:
            cache._uncount_user(self.plan, self._token)
            self._cache = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class PlanCache:
    """Bounded LRU cache of plans (count and workspace bytes) with hit/miss statistics.

    Parameters
    ----------
    maxsize : int
        The most plans kept (0 disables caching).
    max_bytes : int
        The most bytes of plan workspaces kept (``math.inf`` for no bound).

    Examples
    --------
    >>> from nvdispatch import plan_cache
    >>> plan_cache.stats()["maxsize"] > 0
    True
    """

    def __init__(self, maxsize: int = 512, max_bytes: int | float = DEFAULT_MAX_BYTES):
        self._keys: dict[Hashable, _Entry] = {}  # every key -> its entry
        self._lru: OrderedDict[_Entry, _Entry] = OrderedDict()  # entries (hashed by identity), least recent first
        self._users: dict[int, _Entry] = {}  # id(plan) -> entry, for every plan cached or in use
        self._retired: dict[_Entry, None] = {}  # the entries retired and not released yet (in retirement order)
        self._nbytes = 0  # the sum of the cached entries' nbytes (recounted where `_recount` says so)
        self._recount = False  # set while _nbytes is being changed: an interrupt in between leaves it set
        self._tuned = Tunings()
        self._memos: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.RLock()
        self._maxsize = self._check_size(maxsize)
        self._max_bytes = self._check_bytes(max_bytes)
        self._hits = 0  # the hits the Python steps counted (see hits)
        self._compiled_hits: Callable[[], int] | None = None  # those the compiled steps counted, where they run
        self.misses = 0
        self.evictions = 0
        compiled = hotpath()
        if compiled is not None:  # the per-call steps without Python frames (the same steps: _hotpath_cache.c)
            calls = compiled.make_cache_calls(self)
            self.acquire, self.acquire_handle, self.pin, self.let_go, self._compiled_hits = calls

    @property
    def hits(self) -> int:
        """Lookups that found their plan (the per-call steps count them: in C where the extension is built)."""
        counted = self._compiled_hits
        return self._hits + (0 if counted is None else counted())

    @hits.setter
    def hits(self, value: int) -> None:
        counted = self._compiled_hits
        self._hits = value - (0 if counted is None else counted())

    @staticmethod
    def _check_size(maxsize: int) -> int:
        if not isinstance(maxsize, int) or isinstance(maxsize, bool) or maxsize < 0:
            raise InvalidArgumentError("maxsize", "an int >= 0", repr(maxsize))
        return maxsize

    @staticmethod
    def _check_bytes(max_bytes) -> int | float:
        if max_bytes == math.inf:
            return math.inf
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 0:
            raise InvalidArgumentError("max_bytes", "an int >= 0 or math.inf", repr(max_bytes))
        return max_bytes

    # -- sizing -----------------------------------------------------------------------------------------
    @property
    def maxsize(self) -> int:
        """The most plans kept (0 disables caching)."""
        return self._maxsize

    @maxsize.setter
    def maxsize(self, value: int) -> None:
        value = self._check_size(value)
        with self._lock:
            self._maxsize = value
            released = self._trim()
        _release(released)

    @property
    def max_bytes(self) -> int | float:
        """The most bytes of plan workspaces kept."""
        return self._max_bytes

    @max_bytes.setter
    def max_bytes(self, value: int | float) -> None:
        value = self._check_bytes(value)
        with self._lock:
            self._max_bytes = value
            released = self._trim()
        _release(released)

    def __len__(self) -> int:
        with self._lock:
            return len(self._lru)

    @property
    def size(self) -> int:
        """How many plans are cached (a plan under several keys counts once)."""
        return len(self)

    @property
    def nbytes(self) -> int:
        """Workspace bytes of the cached plans."""
        with self._lock:
            return self._bytes()

    def _bytes(self) -> int:
        if self._recount:
            self._nbytes = sum(e.nbytes for e in self._lru)
            self._recount = False
        return self._nbytes

    def resized(self, plan: Any) -> None:
        """Count ``plan``'s workspace bytes again: a cached plan that allocated more (or gave some back) since
        it was cached calls this, and the byte bound holds from now on (least recently used plans retired).
        A plan not cached is ignored."""
        with self._lock:
            entry = self._users.get(id(plan))
            if entry is None or entry.plan is not plan or entry.retired:
                return
            nbytes = workspace_bytes_of(plan)
            self._recount = True
            self._nbytes += nbytes - entry.nbytes
            entry.nbytes = nbytes
            self._recount = False
            released = self._trim()
        _release(released)

    # -- lookup -----------------------------------------------------------------------------------------
    def get(self, key: Hashable) -> Any | None:
        """The plan cached under ``key`` (counted as a hit or a miss), or None.

        To *run* a plan use :meth:`acquire`/:meth:`acquire_or_create` and :meth:`let_go`, so that it cannot
        be released while it runs."""
        with self._lock:
            entry = self._keys.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._lru.move_to_end(entry)
            self._hits += 1
            return entry.plan

    def contains(self, key: Hashable) -> bool:
        """Whether a plan is cached under ``key`` (statistics and recency untouched)."""
        return key in self._keys

    def peek(self, key: Hashable) -> Any | None:
        """The plan cached under ``key``, or None (statistics and recency untouched: to look at, not to run)."""
        entry = self._keys.get(key)
        return None if entry is None else entry.plan

    def acquire(self, key: Hashable) -> Any | None:
        """The plan cached under ``key``, pinned for the caller until :meth:`let_go`; None on a miss.

        Lock-free (the per-call hot path): a hit refreshes recency and is counted (concurrent hits may be
        under-counted); a miss is not counted (the caller falls back to :meth:`acquire_or_create`).
        """
        entry = self._keys.get(key)
        if entry is None:
            return None
        if not entry.pinless:
            entry.users.append(None)  # pin first, then check: eviction sets `retired` first, then reads users
            if entry.retired:
                self._unpin(entry)
                return None
        try:
            self._lru.move_to_end(entry)
        except KeyError:  # retired by another thread just now; our pin keeps the plan usable
            pass
        self._hits += 1
        return entry.plan

    def handle(self, key: Hashable) -> tuple[Any, int] | None:
        """A handle on the plan cached under ``key`` for :meth:`acquire_handle`, or None when none is.

        A handle finds its plan without hashing ``key`` again (a call key holds every operand's signature):
        the call-key memo keeps them (see :mod:`nvdispatch._call_key_memo`). It stays good while ``key``
        leads to that plan, and goes stale once the plan loses the key (eviction, :meth:`clear`,
        :meth:`forget_keys_but`); a stale handle finds nothing."""
        entry = self._keys.get(key)
        return None if entry is None else (entry, entry.epoch)

    def acquire_handle(self, entry: Any, epoch: int) -> Any | None:
        """:meth:`acquire` by a handle ``(entry, epoch)`` from :meth:`handle`: the plan, pinned until
        :meth:`let_go`, or None when the handle is stale. Lock-free, as :meth:`acquire` is."""
        if entry.epoch != epoch:
            return None
        if not entry.pinless:
            entry.users.append(None)  # pin first, then check (see acquire)
            if entry.retired or entry.epoch != epoch:
                self._unpin(entry)
                return None
        try:
            self._lru.move_to_end(entry)
        except KeyError:  # retired by another thread just now
            pass
        self._hits += 1
        return entry.plan

    def acquire_or_create(self, key: Hashable, factory: Callable[[Any], Any], alias: Hashable | None = None) -> Any:
        """The plan for ``key``, pinned until :meth:`let_go`: the cached one, or ``factory(tuning)`` cached
        (``tuning``: a loaded autotune choice for ``key``, or None). ``alias``: keep the plan under that key too
        (unless a plan is cached there already), as :meth:`put` would, in the same step."""
        with self._lock:
            entry = self._keys.get(key)
            if entry is not None:
                self._lru.move_to_end(entry)
                self._hits += 1
                if not entry.pinless:
                    entry.users.append(None)
                if alias is not None:
                    self._alias(entry, alias)
                return entry.plan
            self.misses += 1
        plan = self._tuned.build(key, factory)
        with self._lock:
            entry = self._keys.get(key)
            if entry is not None:  # another thread planned it meanwhile: use theirs, drop ours
                if not entry.pinless:
                    entry.users.append(None)
                kept, release = entry.plan, [plan]
            else:
                entry = self._insert(key, plan)
                if not entry.pinless:
                    entry.users.append(None)  # before trimming: a cache of size 0 retires it at once
                kept, release = plan, self._trim()
            if alias is not None:
                self._alias(entry, alias)
        _release(release)
        return kept

    def _alias(self, entry: _Entry, key: Hashable) -> None:
        """Keep ``entry`` (cached) under ``key`` too, unless a plan is cached there already."""
        if not entry.retired and key not in self._keys:
            entry.keys.append(key)
            self._keys[key] = entry

    def get_or_create(self, key: Hashable, factory: Callable[[Any], Any]) -> Any:
        """:meth:`acquire_or_create` without the pin (for callers that do not run the plan)."""
        plan = self.acquire_or_create(key, factory)
        self.let_go(plan)
        return plan

    def put(self, key: Hashable, plan: Any) -> Any:
        """Insert ``plan`` under ``key`` unless a plan is cached there already; returns the plan kept there.

        ``plan`` may already be cached under other keys (an alias: still one entry) or be in use.
        """
        release: list[Any] = []
        with self._lock:
            if self._maxsize == 0 and id(plan) not in self._users:
                return plan  # caching disabled: the caller keeps the plan
            entry = self._keys.get(key)
            if entry is not None:
                self._lru.move_to_end(entry)
                if plan is not entry.plan and id(plan) not in self._users:
                    release.append(plan)  # a duplicate planned by a racing thread
                kept = entry.plan
            else:
                self._insert(key, plan)
                kept, release = plan, self._trim()
        _release(release)
        return kept

    def _insert(self, key: Hashable, plan: Any) -> _Entry:
        entry = self._users.get(id(plan))
        if entry is None or entry.released:
            entry = self._users[id(plan)] = _Entry(plan)
        if self._maxsize == 0:
            self._mark_retired(entry)  # caching disabled: released when its users let go
            return entry
        if entry not in self._lru:  # newly cached (not another key of a cached plan): its bytes count from now
            nbytes = workspace_bytes_of(plan)
            self._recount = True
            self._lru[entry] = entry
            entry.nbytes = nbytes
            self._nbytes += nbytes
            self._recount = False
        entry.retired = False
        self._retired.pop(entry, None)
        entry.keys.append(key)
        self._keys[key] = entry
        self._lru.move_to_end(entry)
        return entry

    def _trim(self) -> list[Any]:
        """Retire least-recently-used entries beyond the bounds; returns the plans to release now."""
        while self._lru and (len(self._lru) > self._maxsize or self._bytes() > self._max_bytes):
            self.evictions += 1
            self._retire(next(iter(self._lru.values())))
        return self._collect_unused()

    def _collect_unused(self) -> list[Any]:
        """Mark every retired entry nobody uses released; returns their plans (to release outside the lock).

        Idempotent and keyed by entry, so a finalizer re-entering the cache meanwhile (a PlanHold collected
        by the garbage collector in this very thread) cannot make it release a plan twice. Only the retired
        entries are looked at (:attr:`_retired`), not every plan the cache knows."""
        plans = []
        for e in list(self._retired):
            if e.released or not e.retired:
                self._retired.pop(e, None)
            elif not e.users:
                e.released = True
                self._retired.pop(e, None)
                if self._users.get(id(e.plan)) is e:
                    del self._users[id(e.plan)]
                plans.append(e.plan)
        return plans

    def _mark_retired(self, entry: _Entry) -> None:
        """``entry`` is no longer cached (a call pinning it from now on sees it and backs off); called with the
        lock held."""
        self._retired[entry] = None  # first: an interrupt in between leaves it collectable, never lost
        entry.retired = True

    def _retire(self, entry: _Entry) -> bool:
        """Drop ``entry`` from the cache; True when nobody uses it (then the caller releases it)."""
        self._mark_retired(entry)  # first: a call pinning it from now on sees it and backs off
        entry.epoch += 1
        for k in entry.keys:
            if self._keys.get(k) is entry:
                del self._keys[k]
        entry.keys.clear()
        self._recount = True
        if self._lru.pop(entry, None) is not None:
            self._nbytes -= entry.nbytes
        self._recount = False
        return not entry.users

    def forget_keys_but(self, plan: Any, keep: Hashable) -> None:
        """Forget every key ``plan`` is cached under except ``keep``: calls that found it by another key (their
        call key) choose their plan again. ``Matmul.autotune`` does this to the plans it did not choose, so
        that stateless calls of the problem take the recorded choice from their next call on."""
        with self._lock:
            entry = self._users.get(id(plan))
            if entry is None or entry.plan is not plan:
                return
            if any(key != keep for key in entry.keys):
                entry.epoch += 1  # first: handles taken by the forgotten keys go stale
            for key in entry.keys:
                if key != keep and self._keys.get(key) is entry:
                    del self._keys[key]
            entry.keys[:] = [key for key in entry.keys if key == keep]

    # -- users ------------------------------------------------------------------------------------------
    def pin(self, plan: Any) -> None:
        """Begin one more use of ``plan`` by a call (ended by :meth:`let_go`): it will not be released
        meanwhile (a plan with ``needs_release = False`` is not pinned: releasing it frees nothing).

        Only for a plan the caller already uses (pinned or held), or one never cached."""
        if getattr(plan, "needs_release", True) is not False:
            self._count_user(plan)

    def _count_user(self, plan: Any, token: Any = None) -> None:
        """Count a user of ``plan``: a call's pin (``None``) or a hold (its own ``token``)."""
        entry = self._users.get(id(plan))
        if entry is not None and entry.plan is plan and entry.users and not entry.released:
            # the caller's own use keeps the entry alive, and list.append is atomic: no lock needed
            entry.users.append(token)
            return
        with self._lock:
            entry = self._users.get(id(plan))
            if entry is None or entry.released:  # a plan never cached (caching disabled, say)
                entry = self._users[id(plan)] = _Entry(plan)
                self._mark_retired(entry)
            entry.users.append(token)

    def let_go(self, plan: Any) -> None:
        """End one use of ``plan`` begun by :meth:`acquire`/:meth:`acquire_or_create`/:meth:`pin`; a
        retired plan is released when its last user lets go."""
        entry = self._users.get(id(plan))
        if entry is not None and entry.plan is plan and not entry.pinless:
            self._unpin(entry)

    def _uncount_user(self, plan: Any, token: Any) -> None:
        """End a hold's use of ``plan`` (holds are counted for every plan, pinless ones included): its ``token``
        leaves the users (once: a repeat finds it gone) and a retired plan without users is released."""
        entry = self._users.get(id(plan))
        if entry is not None and entry.plan is plan:
            try:
                entry.users.remove(token)
            except ValueError:  # a repeat after an interrupt: only the release may be left to do
                pass
            if entry.retired:
                self._release_if_unused(entry)

    def _unpin(self, entry: _Entry) -> None:
        try:
            entry.users.remove(None)  # a call's pin; holds' tokens stay
        except ValueError:  # unbalanced let_go: nothing to undo
            return
        if entry.retired:
            self._release_if_unused(entry)

    def _release_if_unused(self, entry: _Entry) -> None:
        if not entry.users:
            with self._lock:
                if not (entry.retired and not entry.users and not entry.released):
                    return
                entry.released = True
                self._retired.pop(entry, None)
                if self._users.get(id(entry.plan)) is entry:
                    del self._users[id(entry.plan)]
            _release([entry.plan])

    def hold(self, plan: Any) -> PlanHold:
        """A long-lived use of ``plan`` (a stateful object's), ended by ``PlanHold.close()``."""
        return PlanHold(self, plan)

    def users(self, plan: Any) -> int:
        """How many users besides the cache hold ``plan`` now (0 when unknown to the cache; the calls running a
        plan with ``needs_release = False`` are not counted, its holds are)."""
        entry = self._users.get(id(plan))
        return len(entry.users) if entry is not None and entry.plan is plan else 0

    # -- memoised answers -------------------------------------------------------------------------------
    def memo(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """``compute()`` memoised under ``key`` (bounded by ``maxsize``, dropped by :meth:`clear`): for
        small answers that planning asks repeatedly (which epilogues cuBLASLt fuses, say)."""
        with self._lock:
            if key in self._memos:
                self._memos.move_to_end(key)
                return self._memos[key]
        value = compute()
        with self._lock:
            if self._maxsize:
                self._memos[key] = value
                while len(self._memos) > self._maxsize:
                    self._memos.popitem(last=False)
        return value

    # -- statistics and maintenance --------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """``hits``, ``misses``, ``size`` (plans), ``keys``, ``maxsize``, ``bytes``, ``max_bytes``,
        ``evictions`` (plans), ``in_use`` (plans retired but still used), ``tunings`` (tuned choices
        known: loaded or recorded) and ``memos``.

        Examples
        --------
        >>> from nvdispatch._plan_cache import PlanCache
        >>> PlanCache(maxsize=4).stats()["size"]
        0
        """
        with self._lock:
            return {
                "hits": self.hits,
                "misses": self.misses,
                "size": len(self._lru),
                "keys": len(self._keys),
                "maxsize": self._maxsize,
                "bytes": self._bytes(),
                "max_bytes": self._max_bytes,
                "evictions": self.evictions,
                "in_use": sum(1 for e in list(self._users.values()) if e.retired and not e.released),
                "tunings": len(self._tuned),
                "memos": len(self._memos),
            }

    def plans(self) -> list[Any]:
        """The plans cached now, least recently used first (each once, whatever its keys)."""
        with self._lock:
            return [e.plan for e in self._lru]

    def show_info(self, file=None) -> None:
        """Print the statistics and one line per cached plan (most recent last).

        Examples
        --------
        >>> from nvdispatch._plan_cache import PlanCache
        >>> PlanCache(maxsize=4).show_info()  # doctest: +ELLIPSIS
        nvdispatch plan cache: 0 / 4 plans, 0 / ... workspace bytes, ...
        """
        file = sys.stdout if file is None else file
        s = self.stats()
        with self._lock:
            rows = [(e.plan, e.nbytes, len(e.keys), len(e.users)) for e in list(self._lru.values())]
        print(
            f"nvdispatch plan cache: {s['size']} / {s['maxsize']} plans, {s['bytes']} / {s['max_bytes']} "
            f"workspace bytes, {s['keys']} keys, hits {s['hits']}, misses {s['misses']}, "
            f"evictions {s['evictions']}, retired but in use {s['in_use']}, tunings {s['tunings']}",
            file=file,
        )
        for plan, nbytes, keys, users in rows:
            print(f"  {_describe_plan(plan)}: {nbytes} B, {keys} key(s), {users} user(s)", file=file)

    def clear(self) -> None:
        """Drop every cached plan (each is released once its last user lets go), memoised answers and the
        statistics. Tuned choices are kept: :meth:`clear_tunings` drops them."""
        with self._lock:
            for e in list(self._lru.values()):
                self._retire(e)
            released = self._collect_unused()
            self._keys.clear()
            self._memos.clear()
            self.hits = self.misses = self.evictions = 0
        _release(released)

    # -- tuned choices (nvdispatch._tunings) ------------------------------------------------------------
    def record_tuning(self, key: Hashable, tuning: Any, kind: str | None = None) -> None:
        """Remember an autotuned choice (of ``kind``: the ``tuning_kind`` of the class that applies it) for
        ``key``; later plans for ``key`` start with it, and :meth:`save` writes it."""
        self._tuned.record(key, tuning, kind)

    def tuning_for(self, key: Hashable) -> Any | None:
        """The tuned choice known for ``key``, or None."""
        return self._tuned.get(key)

    def has_tunings(self, op: str | None = None) -> bool:
        """Whether any tuned choice is known (loaded or recorded); given ``op`` (``"matmul"``, ``"fft"``, ...),
        whether one keyed by that operation is (its plan key or its strategy choice)."""
        if op is None or not self._tuned:
            return bool(self._tuned)
        return self._tuned.concern(op)

    def tunings(self) -> dict[str, Any]:
        """A copy of the tuned choices known, by the canonical text of their keys (see :mod:`nvdispatch._tunings`)."""
        return self._tuned.by_text()

    def clear_tunings(self) -> None:
        """Forget every tuned choice (loaded or recorded); plans made later start untuned."""
        self._tuned.clear()

    def save(self, path: str | os.PathLike) -> int:
        """Write the tuned choices known (recorded, loaded, and those of the cached plans) to ``path`` as JSON;
        returns how many.

        The file is written beside ``path`` under a temporary name and renamed over it when complete, so an
        error part-way leaves the previous file as it was; it keeps the previous file's permissions (a new
        file gets the umask's).

        Raises
        ------
        TuningsFileError
            ``path`` is a directory.

        Examples
        --------
        >>> import os, tempfile, numpy as np, nvdispatch
        >>> a = np.ones((64, 8))
        >>> with nvdispatch.Matmul(a, a.T) as mm:
        ...     timings = mm.plan(epilog="RELU").autotune(iterations=1)
        >>> path = os.path.join(tempfile.mkdtemp(), "tunings.json")
        >>> nvdispatch.plan_cache.save(path) >= 1
        True
        >>> nvdispatch.plan_cache.load(path) >= 1
        True
        """
        with self._lock:
            plans = [(k, e.plan) for k, e in self._keys.items()]
        return self._tuned.save(path, plans)

    def load(self, path: str | os.PathLike) -> int:
        """Read tuned choices written by :meth:`save`; later plans with the same keys start tuned.

        Returns how many entries were applied. Each entry is checked on its own (by the class that applies
        its kind): a bad one is skipped with a :class:`~nvdispatch.errors.TuningsWarning` naming it. A file
        saved by another nvdispatch version loads with a warning (its keys may describe plans differently, so
        its entries may never match); one of a format before ``nvdispatch-tunings/3`` applies nothing, with a
        warning saying why.

        Raises
        ------
        TuningsFileError
            ``path`` is missing, a directory, unreadable, or not a tunings file of a format this version
            recognises (nothing is applied; the underlying error is ``__cause__``).
        """
        return self._tuned.load(path)


def workspace_bytes_of(plan: Any) -> int:
    """The workspace bytes a plan reports (``workspace_bytes``, an int or a method returning one; else 0)."""
    value = getattr(plan, "workspace_bytes", 0)
    try:
        value = value() if callable(value) else value
        return max(int(value or 0), 0)
    except Exception:  # noqa: BLE001 - a plan's report must not break the cache
        return 0


def _describe_plan(plan: Any) -> str:
    problem = getattr(plan, "problem", None)
    what = type(plan).__name__
    strategy = getattr(plan, "strategy", None)
    if strategy:
        what += f" [{strategy}]"
    if problem is not None:
        shape = getattr(problem, "shape", None) or getattr(problem, "result_shape", None)
        dtype = getattr(problem, "dtype", None) or getattr(problem, "result_dtype", None)
        if shape is not None:
            what += f" {tuple(shape)}"
        if dtype is not None:
            what += f" {dtype}"
    return what


def _release(plans) -> None:
    for plan in plans:
        release = getattr(plan, "release", None)
        if callable(release):
            release()


#: the process-wide cache shared by all executors
plan_cache = PlanCache()
