"""Process-wide objects over shared files: one per path, alive while used.

Why share: Django builds a cache instance per thread (and, under ASGI, per
request context), and each instance that opened its own descriptor and
mapping of the generation table, the value board or the shard counts kept them
until a full collection; a server whose threads come and go ran out of
descriptors. So each of those objects is the process's one for its path.

Why not forever: a process that uses many cache directories one after the
other (a test suite with a temporary ``LOCATION`` per test, a tool that opens
caches by path) would keep every one it had ever opened, four descriptors and
two mappings a directory, and fail at the open-file limit. So a
:class:`Registry` holds its objects weakly: an object lives as long as a cache
instance (or another shared object) refers to it, plus, strongly, the
``keep`` most recently opened ones, so that instances made and dropped per
request still find a warm object (an L1 full of values, a mapped table)
instead of opening it again. An object nobody refers to and that fell out of
the recent ones is collected, and :func:`own_descriptor` closes its file.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

from djcachebench.coherence.shared_file import fork_safe_lock

__all__ = ["KEEP_RECENT", "Registry", "own_descriptor"]

#: Objects a registry keeps alive after their last user is gone, most recent
#: first: more than the cache directories a site uses in turn.
KEEP_RECENT = 8

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def own_descriptor(owner: object, fd: int) -> weakref.finalize:
    """Close ``fd`` once ``owner`` is collected, or when the returned finalizer
    is called (at most once either way: a replaced descriptor is closed by
    calling it, an explicit ``close()`` too).

    Not ``__del__``: a finalizer runs after the weak references to ``owner``
    are cleared, so no registry lookup can hand out an object whose
    descriptor is being closed.
    """
    return weakref.finalize(owner, _close_quietly, fd)


class Registry(Generic[K, V]):
    """One object per key in this process, shared by whoever asks for it
    while any of them holds it (see the module doc).

    :meth:`find` and :meth:`add` are called with :attr:`lock` held (the
    callers check and build under it); a forked child gets the lock unheld.
    """

    def __init__(self, keep: int = KEEP_RECENT) -> None:
        self.lock = fork_safe_lock()
        self._keep = keep
        self._live: weakref.WeakValueDictionary[K, V] = weakref.WeakValueDictionary()
        self._recent: OrderedDict[K, V] = OrderedDict()

    def find(self, key: K) -> V | None:
        """The live object for ``key`` (now the most recently used), or None."""
        value = self._live.get(key)
        if value is not None:
            self._used(key, value)
        return value

    def add(self, key: K, value: V) -> V:
        """Make ``value`` the object for ``key`` (replacing any other) and return it."""
        self._live[key] = value
        self._used(key, value)
        return value

    def _used(self, key: K, value: V) -> None:
        recent = self._recent
        recent[key] = value
        recent.move_to_end(key)
        while len(recent) > self._keep:
            recent.popitem(last=False)

    def __len__(self) -> int:
        return len(self._live)
