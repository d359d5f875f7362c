"""The L1 map: a bounded LRU with a per-entry deadline. Imports nothing from Django.

Why not ``functools.lru_cache`` or cachetools: the TieredCache needs a bound on
entries *and* on bytes, a deadline per entry (each entry's life is capped by the
L2 expiry of its own value), eviction counts for its stats, and a lookup that
costs one dict probe, one clock read and one ``move_to_end``, because this is
the whole read path of an L1 hit.

Concurrency: one map is shared by every thread of a process (Django builds a
backend instance per thread; an L1 per thread would multiply memory and
misses). Lookups take no lock: single ``OrderedDict`` operations are atomic
under the GIL, and a key evicted between the probe and ``move_to_end`` is
treated as a miss. Insertions, removals and the byte count take a lock.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["L1Map", "L1Stats"]


@dataclass
class L1Stats:
    """What the map itself can count; hits and misses are counted by its user,
    who alone knows whether a present entry is still valid."""

    evictions: int = 0  # removed to make room (entries or bytes bound)
    expirations: int = 0  # found past their deadline
    rejected: int = 0  # larger than the whole byte bound: never stored


# Maps whose lock must be replaced in a forked child (the fork may have happened
# while another thread held it).
_maps: weakref.WeakSet[L1Map] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for m in list(_maps):
        m._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


class L1Map:
    """``key -> item`` with LRU eviction, an entry and a byte bound, and deadlines.

    Items are tuples. The map stores each as one flat record
    ``(deadline, size, *item)``: one tuple fewer to reach on every lookup,
    which shows when CPU caches are cold.

    ``max_entries``: at most this many entries. ``max_bytes``: the sum of the
    sizes given to :meth:`put` stays at or below it (``None``: no byte bound).
    ``clock``: a monotonic clock in seconds; deadlines are on this clock.
    """

    __slots__ = ("__weakref__", "_clock", "_data", "_lock", "_max_bytes", "max_bytes",
                 "max_entries", "nbytes", "stats")

    def __init__(
        self,
        max_entries: int,
        max_bytes: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_entries < 0 or (max_bytes is not None and max_bytes < 0):
            raise ValueError("bounds must not be negative")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._max_bytes = float("inf") if max_bytes is None else max_bytes
        self._clock = clock
        # key -> (deadline, size, *item)
        self._data: OrderedDict[Hashable, tuple[Any, ...]] = OrderedDict()
        self._lock = threading.Lock()
        self.nbytes = 0
        self.stats = L1Stats()
        _maps.add(self)

    @property
    def records(self) -> OrderedDict[Hashable, tuple[Any, ...]]:
        """``key -> (deadline, size, *item)``, for a caller that inlines :meth:`get`
        on its hot path. Read it only; on a hit call ``records.move_to_end(key)``
        (it may raise ``KeyError`` if another thread evicted the key)."""
        return self._data

    def get(self, key: Hashable) -> tuple[Any, ...] | None:
        """The item, now the most recently used; ``None`` if absent or expired."""
        record = self._data.get(key)
        if record is None:
            return None
        if record[0] <= self._clock():
            self.stats.expirations += 1
            self._discard(key, record)
            return None
        try:
            self._data.move_to_end(key)
        except KeyError:  # evicted by another thread since the probe
            return None
        return record[2:]

    def put(self, key: Hashable, item: tuple[Any, ...], size: int, deadline: float) -> bool:
        """Store ``item`` until ``deadline`` (on the map's clock); evict to fit.

        Returns ``False``, storing nothing and dropping any older entry, when
        the item cannot be kept: already past its deadline, or bigger than the
        whole byte bound (evicting everything for it would be pointless).
        """
        max_bytes = self._max_bytes
        if size > max_bytes or deadline <= self._clock() or not self.max_entries:
            if size > max_bytes:
                self.stats.rejected += 1
            self.pop(key)
            return False
        data = self._data
        with self._lock:
            old = data.get(key)
            data[key] = (deadline, size, *item)
            if old is None:
                self.nbytes += size
                if len(data) <= self.max_entries and self.nbytes <= max_bytes:
                    return True
            else:
                data.move_to_end(key)
                self.nbytes += size - old[1]
                if self.nbytes <= max_bytes:
                    return True
            evicted = 0
            while len(data) > self.max_entries or self.nbytes > max_bytes:
                self.nbytes -= data.popitem(last=False)[1][1]
                evicted += 1
            self.stats.evictions += evicted
        return True

    def has_room(self) -> bool:
        """Would an entry fit without evicting one? (Fewer entries than the bound,
        and under 7/8 of the byte bound, since entries differ in size.)"""
        return len(self._data) < self.max_entries and self.nbytes < self._max_bytes * 0.875

    def pop(self, key: Hashable) -> bool:
        """Forget ``key``; ``True`` if it was there."""
        with self._lock:
            record = self._data.pop(key, None)
            if record is None:
                return False
            self.nbytes -= record[1]
            return True

    def _discard(self, key: Hashable, record: tuple[Any, ...]) -> None:
        """Remove ``key`` only if it still holds ``record`` (another thread may
        have replaced it since it was read)."""
        with self._lock:
            if self._data.get(key) is record:
                del self._data[key]
                self.nbytes -= record[1]

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.nbytes = 0

    def purge_expired(self) -> int:
        """Drop every entry past its deadline; returns how many. O(n): for
        maintenance and tests, never called on the read path."""
        now = self._clock()
        with self._lock:
            dead = [k for k, rec in self._data.items() if rec[0] <= now]
            for k in dead:
                self.nbytes -= self._data.pop(k)[1]
        self.stats.expirations += len(dead)
        return len(dead)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: Hashable) -> bool:
        """Present and not expired; does not count as a use."""
        record = self._data.get(key)
        return record is not None and record[0] > self._clock()

    def keys(self) -> list[Hashable]:
        """Keys from least to most recently used (a copy)."""
        return list(self._data)

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self.keys())
