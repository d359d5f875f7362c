"""Culling: Django's MAX_ENTRIES / CULL_FREQUENCY across all shards, and SIZE_LIMIT.

Django's semantics (those of LocMemCache and FileBasedCache, which its
``test_cull`` / ``test_zero_cull`` pin down): before a *new* key is stored,
if the cache holds ``MAX_ENTRIES`` entries or more, remove
``entries // CULL_FREQUENCY`` of them, or everything when ``CULL_FREQUENCY``
is 0. We check *after* the write instead, which gives the same result: the
write reports whether it inserted a key and the shard's count, and when the
cache now holds more than ``MAX_ENTRIES`` we remove ``(entries - 1) //
CULL_FREQUENCY`` entries other than the new one. Checking before would need
an extra query per write ("is this key new?") whenever the cache is full.

We count across all shards and remove expired entries first, then the
oldest-written ones across all shards (a global order, so the result does
not depend on the shard count). Reads never write, so "oldest" means least
recently *written*, not least recently read.

``SIZE_LIMIT`` bounds the stored bytes (keys' values as stored, integrity tag
included): when a write would pass it, the oldest entries are removed until
the total is at most 90% of the limit, so culls do not run on every write.

Culling scans each shard (there is no index on ``stored`` or ``expires``:
each would make every write slower, see ``shard.py``). The scan is paid once
per cull, and a cull frees ``entries // CULL_FREQUENCY`` slots, so spread
over the inserts it makes room for it costs about CULL_FREQUENCY row visits
per insert.

Only one process culls at a time (a non-blocking ``flock`` on ``cull.lock``);
a writer that finds another one culling goes on with its write instead of
culling twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import heapq
import os
import sqlite3
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from .codec import sql_key, text_key
from .retry import CacheUnavailable

if TYPE_CHECKING:
    from .shardset import ShardSet

SIZE_LOW_WATER = 0.9
# At most this many MAX_ENTRIES rounds per cull (see Culler.cull): bounded even
# if other processes insert as fast as one cull can remove.
CULL_ROUNDS = 8
# How often a writer waiting for another process's cull looks again (seconds).
CULL_WAIT_STEP = 0.0005
ROUND = 256  # rows fetched per shard per round when culling by size


class Culler:
    """Keeps a shard set within MAX_ENTRIES and SIZE_LIMIT."""

    def __init__(self, shardset: ShardSet) -> None:
        self.s = shardset
        self._lock_path = os.path.join(shardset.directory, "cull.lock")

    def recount(self) -> tuple[int, int]:
        """Copy each shard's exact counts into the shared table; return the totals."""
        entries = nbytes = 0
        for index in range(self.s.n):
            try:
                e, b = self.s.run(index, _meta)
            except CacheUnavailable:
                e, b = 0, 0
            self.s.counts.store(index, e, b)
            entries += e
            nbytes += b
        return entries, nbytes

    def after_write(self, key: str, inserted: bool) -> None:
        """Cull if the write that stored ``key`` took the cache past a limit.

        Never raises for an unreachable shard: the write itself succeeded.
        """
        s = self.s
        if not inserted and s.size_limit is None:
            return  # a replacement adds no entry (and bytes are not bounded)
        entries, nbytes = s.counts.total()
        over = inserted and s.max_entries is not None and entries > s.max_entries
        if over or (s.size_limit is not None and nbytes > s.size_limit):
            # A writer that finds another process culling goes on without
            # culling; but once the cache is over its limit by more than one
            # cull's worth, it waits for that cull (at most LOCK_TIMEOUT)
            # instead: this is what bounds the overshoot when many processes
            # insert faster than one of them can cull. Each writer checks after
            # its insert, so the bound is one cull's worth plus one insert per
            # writer (docs/architecture.md, "Counting and culling").
            wait = over and entries > s.max_entries + max(
                s.max_entries // max(s.cull_frequency, 1), 1)
            with contextlib.suppress(CacheUnavailable):
                self.cull(keep=key, wait=wait)

    def cull(self, keep: str | None = None, wait: bool = False) -> None:
        """Bring the cache within its limits; ``keep`` (the key just written) stays.

        If another process is culling, return at once, or with ``wait`` wait
        for it (at most the retry policy's ``lock_timeout``) and then cull
        whatever is still over the limit.
        """
        with self._exclusive(wait) as mine:
            if not mine:
                return
            s = self.s
            now = time.time()
            for index in range(s.n):
                with contextlib.suppress(CacheUnavailable):
                    s.run(index, self._remove_expired, index, now)
            entries, nbytes = self.recount()
            if s.max_entries is not None and entries > s.max_entries:
                if s.cull_frequency == 0:
                    for index in range(s.n):
                        with contextlib.suppress(CacheUnavailable):
                            s.run(index, self._remove_all, index, keep)
                    if s.listener is not None:
                        s.listener.stamp_all()
                    return
                # Django removes 1/CULL_FREQUENCY of the entries for each insert that
                # finds the cache full. Writers that found this cull under way went on
                # without culling (they do not wait for it), so while other processes
                # keep inserting, this one culls for them too: another round as long
                # as the count is still over the limit and a round removed something.
                for _ in range(CULL_ROUNDS):
                    # The entries that were there before the new key, as Django counts them.
                    before = entries - 1 if keep is not None else entries
                    removed = self._remove_oldest(count=before // s.cull_frequency, keep=keep)
                    entries, nbytes = s.counts.total()
                    if entries <= s.max_entries or not removed:
                        break
            if s.size_limit is not None and nbytes > s.size_limit:
                target = nbytes - int(s.size_limit * SIZE_LOW_WATER)
                self._remove_oldest(nbytes=max(target, 0), keep=keep)

    @contextlib.contextmanager
    def _exclusive(self, wait: bool = False) -> Iterator[bool]:
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + self.s.policy.lock_timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if not wait or time.monotonic() >= deadline:
                        yield False
                        return
                    time.sleep(CULL_WAIT_STEP)
            try:
                yield True
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _remove_oldest(self, count: int | None = None, nbytes: int | None = None,
                       keep: str | None = None) -> int:
        """Remove the globally oldest-written entries: ``count`` of them, or ``nbytes`` worth.

        Returns how many were removed."""
        s = self.s
        total = 0
        while (count is not None and count > 0) or (nbytes is not None and nbytes > 0):
            limit = count if count is not None else ROUND
            candidates = []
            for index in range(s.n):
                with contextlib.suppress(CacheUnavailable):
                    rows = s.run(index, _oldest, limit, keep)
                    candidates.append([(stored, index, key, size) for stored, key, size in rows])
            chosen: dict[int, list[str]] = {}
            taken = freed = 0
            for _stored, index, key, size in heapq.merge(*candidates):
                if count is not None and taken >= count:
                    break
                if nbytes is not None and freed >= nbytes:
                    break
                chosen.setdefault(index, []).append(key)
                taken += 1
                freed += size
            if not taken:
                return total
            removed = 0
            for index, keys in chosen.items():
                with contextlib.suppress(CacheUnavailable):
                    removed += s.run(index, self._remove_keys, index, keys)
            s.stats.culled += removed
            total += removed
            if count is not None:
                return total
            assert nbytes is not None
            nbytes -= freed
            if removed == 0:
                return total
        return total

    # -- per-shard operations (run under ShardSet.run) ---------------------------

    def _remove_keys(self, conn: sqlite3.Connection, index: int, keys: list[str]) -> int:
        removed: list[str] = []
        conn.execute("BEGIN IMMEDIATE")
        try:
            for i in range(0, len(keys), 500):
                chunk = keys[i : i + 500]
                sql = f"DELETE FROM cache WHERE key IN ({','.join('?' * len(chunk))}) RETURNING key"
                removed.extend(text_key(r[0]) for r in conn.execute(sql, chunk).fetchall())
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        self._after(conn, index, removed)
        return len(removed)

    def _remove_expired(self, conn: sqlite3.Connection, index: int, now: float) -> None:
        sql = "DELETE FROM cache WHERE expires IS NOT NULL AND expires <= ? RETURNING key"
        removed = [text_key(r[0]) for r in conn.execute(sql, (now,)).fetchall()]
        self.s.stats.expired_removed += len(removed)
        self._after(conn, index, removed)

    def _remove_all(self, conn: sqlite3.Connection, index: int, keep: str | None) -> None:
        removed = conn.execute("DELETE FROM cache WHERE key IS NOT ?",
                               (None if keep is None else sql_key(keep),)).rowcount
        self.s.stats.culled += max(removed, 0)
        self.s.counts.store(index, *_meta(conn))
        self.s.collect(conn, index)

    def _after(self, conn: sqlite3.Connection, index: int, keys: list[str]) -> None:
        e, b = _meta(conn)
        self.s.counts.store(index, e, b)
        self.s.collect(conn, index)
        if keys and self.s.listener is not None and self.s.listener.watched():
            self.s.listener.stamp_many(keys, None)


def _meta(conn: sqlite3.Connection) -> tuple[int, int]:
    row = conn.execute("SELECT entries, bytes FROM meta WHERE id = 0").fetchone()
    return (row[0], row[1]) if row else (0, 0)


def _oldest(conn: sqlite3.Connection, limit: int, keep: str | None) -> list[tuple[int, str, int]]:
    """The oldest-written rows (keys as stored: bound back as they are)."""
    sql = "SELECT stored, key, size FROM cache WHERE key IS NOT ? ORDER BY stored LIMIT ?"
    return conn.execute(sql, (None if keep is None else sql_key(keep), limit)).fetchall()

