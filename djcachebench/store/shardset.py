"""The shard set: the Django-free engine behind ``ShardedSQLiteCache``.

Like Django's ``RedisCacheClient`` behind ``RedisCache``: keys arrive already
made and validated, expiry arrives as an absolute ``time.time()`` value
(``None`` = never). A facade over parts that each have one job: the read path
in ``reads.py``, single-key writes in ``writes.py``, the batch operations in
``batch.py``, culling in ``eviction.py``; what they share (routing, the fault
policy, floors, the bookkeeping after a write) in ``core.py``, which depends on
none of them; the SQL in ``statements.py``; the directory layout and manifest
in ``layout.py``. :class:`ShardSet` builds the core and the parts, and offers
their operations as its own.
"""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any

from .batch import Batch
from .codec import Codec
from .core import StoreCore
from .eviction import SMALL_CACHE, Culler
from .layout import LayoutGuard
from .protocol import MISSING, Listener, ShardFault
from .reads import Reader
from .retry import CacheUnavailable, RetryPolicy, within_budget
from .statements import SQL_CLEAR
from .writes import Writer

__all__ = ["MISSING", "Listener", "ShardFault", "ShardSet"]


class ShardSet:
    """N SQLite shards under one directory, addressed by final cache key.

    The operations (``get``, ``get_with_expiry``, ``has_key``; ``set``,
    ``add``, ``delete``, ``touch``, ``incr``; ``get_many``, ``set_many``,
    ``delete_many``) are those of its :class:`Reader`, :class:`Writer` and
    :class:`Batch`, held here as attributes so that a call costs no extra
    frame. What the core holds (``stats``, ``pool``, ``counts``, ``shards``,
    ``route``, ``run``...) is read through this facade too.
    """

    def __init__(
        self,
        directory: str,
        shards: int,
        *,
        codec: Codec,
        policy: RetryPolicy,
        max_entries: int | None,
        cull_frequency: int,
        size_limit: int | None,
        mmap_size: int = 0,
        page_cache: int = 0,
        listener: Listener | None = None,
        layout: LayoutGuard | None = None,
    ) -> None:
        core = self.core = StoreCore(
            directory, shards, codec=codec, policy=policy, max_entries=max_entries,
            cull_frequency=cull_frequency, size_limit=size_limit, mmap_size=mmap_size,
            page_cache=page_cache, listener=listener, layout=layout,
            # A large cache may be culled: its write order indexed (shard.py).
            index_stored=size_limit is not None
            or (max_entries is not None and max_entries > SMALL_CACHE),
        )
        # Held here too: read on every call of an L2 under a TieredCache
        # (its failure count), where __getattr__ would cost a frame.
        self.stats = core.stats
        self.culler = Culler(core)
        self.culler.recount(locked=False)
        self.reader = Reader(core)
        self.writer = Writer(core, self.reader, self.culler)
        self.batch = Batch(core, self.reader, self.writer, self.culler)
        self.get = self.reader.get
        self.get_with_expiry = self.reader.get_with_expiry
        self.has_key = self.reader.has_key
        self.set = self.writer.set
        self.add = self.writer.add
        self.delete = self.writer.delete
        self.touch = self.writer.touch
        self.incr = self.writer.incr
        self.get_many = self.batch.get_many
        self.set_many = self.batch.set_many
        self.delete_many = self.batch.delete_many

    def __getattr__(self, name: str) -> Any:
        # Only for what is not the facade's own: the core's state and helpers.
        return getattr(self.core, name)

    @within_budget
    def clear(self) -> None:
        """Empty every shard. A shard that cannot be reached is reported."""
        core = self.core
        failures: list[CacheUnavailable] = []
        for index in range(core.n):
            try:
                self.culler.remove(index, self._clear_one)
            except CacheUnavailable as exc:
                core.void_shard(index)
                failures.append(exc)
        # An outstanding cull's debt (eviction.py) went with the entries.
        core.counts.set_debt(0)
        core.stamp_all()
        if failures:
            raise failures[0]

    def _clear_one(self, conn: sqlite3.Connection, index: int) -> None:
        quiet = getattr(self.core.listener, "quiet", None)
        # One epoch bump (clear() stamps all) instead of a mark per row.
        with contextlib.nullcontext() if quiet is None else quiet():
            conn.execute(SQL_CLEAR)
        self.core.collect(conn, index)

    def close(self) -> None:
        """Close this thread's connections (and others' on their next use)."""
        self.core.pool.close_all()
