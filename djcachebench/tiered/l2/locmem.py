"""Django's LocMemCache (and DummyCache) as the L2: stores of this process alone.

LocMemCache raises on every failure, gives back what was set (it pickles),
keeps a timeout exactly, and its entries' expiries can be read under its own
lock. Both it and DummyCache, and their subclasses, are named per process and
LOCATION on the value board (``coherence.board.LocalStore``): Django keeps one
LocMemCache store per process and LOCATION.
"""

from __future__ import annotations

import math
import pickle
from typing import Any

from djcachebench.tiered.l2.base import ExpiryReader, L2Adapter, LocalPicklingAdapter
from djcachebench.tiered.l2.generic import GenericAdapter

__all__ = ["CLASSES"]


class ProcessLocalAdapter(GenericAdapter):
    """DummyCache, and subclasses of it or of LocMemCache: nothing known of
    their values, but their store is this process's."""

    process_local = True


class LocMemAdapter(LocalPicklingAdapter):
    descendant = ProcessLocalAdapter
    process_local = True

    def known_expiry_reader(self) -> ExpiryReader | None:
        """LocMemCache's own ``get``, reading the entry's expiry under the same lock.

        Reads LocMemCache's private ``_lock``, ``_cache``, ``_expire_info``,
        ``_has_expired`` and ``_delete``: it has no public read that returns an
        entry's expiry, and reading it apart from the value (outside the lock)
        could pair one entry's value with another's expiry.
        """
        l2 = self.l2

        def read(key: Any, default: Any, version: Any) -> tuple[Any, float | None]:
            final = l2.make_and_validate_key(key, version=version)
            with l2._lock:
                if l2._has_expired(final):
                    l2._delete(final)
                    return default, None
                pickled = l2._cache[final]
                expires = l2._expire_info.get(final, -1)
                l2._cache.move_to_end(final, last=False)
            return pickle.loads(pickled), math.inf if expires is None else expires

        return read


ProcessLocalAdapter.descendant = ProcessLocalAdapter  # a DummyCache's subclass too

CLASSES: dict[str, type[L2Adapter]] = {
    "django.core.cache.backends.locmem.LocMemCache": LocMemAdapter,
    "django.core.cache.backends.dummy.DummyCache": ProcessLocalAdapter,
}
