"""The one plan cache every executor shares: a bounded, thread-safe LRU of prepared plans.

Keys are tuples holding everything that changes a plan (operation, executor, device, dtypes, shapes,
strides, epilog, options, strategy...). Values are executor plans. One plan may be held under several keys
(a hot path's cheap key beside the full problem key); it is released (its executor makes that safe with
respect to work still queued on a stream) when the last key holding it is evicted.

Autotuned choices can be saved to a JSON file and loaded in another process, so a service starts tuned:
a plan that exposes ``tuning()`` (JSON-serialisable) is saved under its key; after ``load()``, an
executor planning the same key receives that tuning.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["PlanCache", "plan_cache"]


class PlanCache:
    """Bounded LRU cache of plans with hit/miss statistics.

    Examples
    --------
    >>> from nvdispatch import plan_cache
    >>> plan_cache.stats()["maxsize"] > 0
    True
    """

    def __init__(self, maxsize: int = 512):
        self._plans: OrderedDict[Hashable, Any] = OrderedDict()
        self._holders: dict[int, int] = {}  # id(plan) -> how many keys hold it
        self._tunings: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._maxsize = self._check_size(maxsize)
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    @staticmethod
    def _check_size(maxsize: int) -> int:
        from .errors import InvalidArgumentError

        if not isinstance(maxsize, int) or isinstance(maxsize, bool) or maxsize < 0:
            raise InvalidArgumentError("maxsize", "an int >= 0", repr(maxsize))
        return maxsize

    # -- sizing -----------------------------------------------------------------------------------------
    @property
    def maxsize(self) -> int:
        return self._maxsize

    @maxsize.setter
    def maxsize(self, value: int) -> None:
        value = self._check_size(value)
        with self._lock:
            self._maxsize = value
            evicted = self._trim()
        _release(evicted)

    def set_size_limit(self, maxsize: int) -> None:
        """Bound the cache to ``maxsize`` plans (0 disables caching)."""
        self.maxsize = maxsize

    def __len__(self) -> int:
        return len(self._plans)

    @property
    def size(self) -> int:
        return len(self._plans)

    # -- lookup -----------------------------------------------------------------------------------------
    def get(self, key: Hashable) -> Any | None:
        with self._lock:
            plan = self._plans.get(key)
            if plan is None:
                self.misses += 1
                return None
            self._plans.move_to_end(key)
            self.hits += 1
            return plan

    def peek(self, key: Hashable) -> Any | None:
        """:meth:`get` without the lock, for the per-call hot path: a hit refreshes recency and is counted
        (without the lock, so concurrent hits may be under-counted); a miss is not counted (the caller
        falls back to a path that looks the plan up again)."""
        plans = self._plans
        plan = plans.get(key)
        if plan is not None:
            try:
                plans.move_to_end(key)
            except KeyError:  # evicted by another thread just now; the plan stays usable
                pass
            self.hits += 1
        return plan

    def put(self, key: Hashable, plan: Any) -> Any:
        """Insert ``plan`` under ``key`` unless another thread inserted one first; returns the plan kept.

        ``plan`` may already be held under other keys (an alias); it is released only when no key holds it.
        """
        release: list[Any] = []
        with self._lock:
            kept = self._plans.get(key)
            if kept is not None:
                self._plans.move_to_end(key)
                if plan is not kept and id(plan) not in self._holders:
                    release.append(plan)  # a duplicate planned by a racing thread
            else:
                kept = plan
                if self._maxsize:
                    self._plans[key] = plan
                    self._holders[id(plan)] = self._holders.get(id(plan), 0) + 1
                    release = self._trim()
        _release(release)
        return kept

    def get_or_create(self, key: Hashable, factory: Callable[[Any], Any]) -> Any:
        """The cached plan for ``key``, or ``factory(tuning)`` cached (tuning: a loaded autotune choice)."""
        plan = self.get(key)
        if plan is None:
            plan = self.put(key, factory(self._tunings.get(_key_text(key))))
        return plan

    def _trim(self) -> list[Any]:
        evicted = []
        while len(self._plans) > self._maxsize:
            _, plan = self._plans.popitem(last=False)
            self.evictions += 1
            left = self._holders[id(plan)] - 1
            if left:
                self._holders[id(plan)] = left
            else:
                del self._holders[id(plan)]
                evicted.append(plan)
        return evicted

    # -- statistics and maintenance --------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        """``{"hits", "misses", "size", "maxsize", "evictions"}``."""
        with self._lock:
            return {
                "hits": self.hits,
                "misses": self.misses,
                "size": len(self._plans),
                "maxsize": self._maxsize,
                "evictions": self.evictions,
            }

    def clear(self) -> None:
        """Drop (and release) every cached plan and reset the statistics; loaded tunings are kept."""
        with self._lock:
            plans = list({id(p): p for p in self._plans.values()}.values())
            self._plans.clear()
            self._holders.clear()
            self.hits = self.misses = self.evictions = 0
        _release(plans)

    # -- tuned choices ---------------------------------------------------------------------------------
    def record_tuning(self, key: Hashable, tuning: Any) -> None:
        """Remember an autotuned choice for ``key`` (saved by ``save``)."""
        with self._lock:
            self._tunings[_key_text(key)] = tuning

    def tuning_for(self, key: Hashable) -> Any | None:
        return self._tunings.get(_key_text(key))

    def save(self, path: str | os.PathLike) -> int:
        """Write the tuned choices of cached plans (and loaded ones) to ``path`` as JSON; returns the count."""
        with self._lock:
            tunings = dict(self._tunings)
            for key, plan in self._plans.items():
                get = getattr(plan, "tuning", None)
                tuned = get() if callable(get) else None
                if tuned is not None:
                    tunings[_key_text(key)] = tuned
        with open(path, "w", encoding="utf-8") as fh:
            json.dump({"format": "nvdispatch-tunings/1", "tunings": tunings}, fh, indent=1, sort_keys=True)
        return len(tunings)

    def load(self, path: str | os.PathLike) -> int:
        """Read tuned choices written by ``save``; later plans with the same keys start tuned."""
        from .errors import InvalidArgumentError

        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        if not isinstance(data, dict) or data.get("format") != "nvdispatch-tunings/1":
            raise InvalidArgumentError("path", "a file written by plan_cache.save()", str(path))
        with self._lock:
            self._tunings.update(data["tunings"])
        return len(data["tunings"])


def _key_text(key: Hashable) -> str:
    return repr(key)


def _release(plans) -> None:
    for plan in plans:
        release = getattr(plan, "release", None)
        if callable(release):
            release()


#: the process-wide cache shared by all executors
plan_cache = PlanCache()
