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

No call removes more than ``CULL_BATCH`` entries, whatever the size of the
cache. The oldest rows of a shard are the first entries of its index on
``stored`` (a walk of as many index entries as rows wanted, not a scan), and
a cull removes them in batches of at most ``CULL_BATCH`` rows: the entries it
decided to remove and has not removed yet are its *debt*, kept in the shared
counts file, and every later insert pays a batch of it (the writer that holds
the cull lock; the others go on) until it is paid. A cull that fits in one
batch removes the oldest rows across all shards (merged by ``stored``); a
batch of a larger debt removes the oldest rows of one shard, the shards in
turn, so that it waits for one shard's write lock instead of every one. So
a cull of a third of a
million entries is spread over the inserts that follow it, each paying a
bounded batch, instead of stalling one request for seconds. Expired rows are
removed by a full pass only while the cache is small (``SMALL_CACHE``);
in a larger one the bounded sweep (core.py) and the oldest-first order
remove them. In a small cache the oldest rows are found by a scan too (a
few milliseconds): the index on ``stored`` that makes the walk bounded costs
every replacing set half again, so shards have it only where a large cache
may be culled (shard.py); a cull that finds a large cache whose shards lack
it creates it, once.

Only one process culls at a time (a non-blocking ``flock`` on ``cull.lock``);
a writer that finds another one culling goes on with its write instead of
culling twice, unless the cache is more than one cull's worth over a limit
(``MAX_ENTRIES // CULL_FREQUENCY`` entries, or the tenth of ``SIZE_LIMIT`` a
cull frees): then it waits for that cull, within its call's wait budget
(``retry.CallBudget``). Past twice that, a writer whose wait ran out culls
without the lock: a culler that holds it and does not finish (a process
stopped, or starved of CPU) must not let the cache grow without bound (many
times ``SIZE_LIMIT`` behind a stopped culler).
Two culls at once may remove more than either would alone, never a key just
written; a cache may always drop entries, and never past its limits is what
its users size their disks by.
"""

from __future__ import annotations

import contextlib
import fcntl
import heapq
import logging
import os
import sqlite3
import stat
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from .codec import sql_key, text_key
from .layout import aside_name
from .retry import CacheUnavailable, budget
from .shard import DamagedShard, ensure_stored_index
from .statements import (
    SQL_META,
    SQL_OLDEST,
    SQL_REMOVE_ALL_BUT,
    SQL_REMOVE_EXPIRED,
    SQL_REMOVE_KEYS,
    chunks,
    placeholders,
    transaction,
)
from .stats import log_event

if TYPE_CHECKING:
    from .core import StoreCore

T = TypeVar("T")

SIZE_LOW_WATER = 0.9
# How many rows one call of a cull removes at most (one batch): the rest of
# the cull is debt, paid by later inserts.
CULL_BATCH = 128
# Up to this many entries a cull may scan every shard: it first removes every
# expired row, and finds the oldest rows without the index on ``stored``.
# Above it, only the sweep and the oldest-first order remove expired rows,
# and the oldest rows come from the index.
SMALL_CACHE = 20_000
# How often a writer waiting for another process's cull looks again (seconds).
CULL_WAIT_STEP = 0.0005
ROUND = 256  # rows fetched per shard per round when culling by size


class Culler:
    """Keeps a shard set within MAX_ENTRIES and SIZE_LIMIT."""

    def __init__(self, core: StoreCore) -> None:
        self.s = core
        self._lock_path = os.path.join(core.directory, "cull.lock")
        # Shards known to have the index on ``stored`` (this process made sure).
        self._indexed = [shard.index_stored for shard in core.shards]
        # The shard whose oldest rows the next batch of a debt removes (in turn).
        self._turn = 0

    def recount(self, locked: bool = True) -> tuple[int, int]:
        """Copy each shard's exact counts into the shared table; return the totals.

        Each shard's counts are read and copied under its write lock, as the
        writes copy theirs (``ShardSet._counted``): a copy made after the lock
        was let go could put back a count from before another process's write.
        ``locked=False`` (opening the cache) reads without the lock, and takes it
        only for a shard whose copy is below what it read (a new counts file):
        a copy made from that read could be older than another process's
        insert: every new cache object, as Django makes one per thread, could
        put the count below the committed one, and a single writer could pass
        ``MAX_ENTRIES + 1``.
        """
        entries = nbytes = 0
        recount = self.copy_counts if locked else self._raise_low_copy
        for index in range(self.s.n):
            try:
                e, b = self.s.run(index, recount, index)
            except CacheUnavailable:
                # Left as it is: never lowered without the shard's own count.
                e, b = self.s.counts.load(index)
            entries += e
            nbytes += b
        return entries, nbytes

    def copy_counts(self, conn: sqlite3.Connection, index: int) -> tuple[int, int]:
        """Shard ``index``'s counts, copied into the shared table under its write
        lock (after a removal, which copies none inside its transaction:
        ``statements.SQL_COUNT_TRIGGERS``)."""
        with transaction(conn):
            return self._copy_read(conn, index)

    def remove(self, index: int, op: Callable[..., T], *args: Any) -> T:
        """``op(conn, index, *args)`` under :meth:`StoreCore.run`, then the shard's
        lower counts copied (:meth:`copy_after_removal`), each in a call of its
        own. Never a ``run`` inside another: the inner call's fork gate refuses
        it while the outer one holds the gate open, so a fork would wait for a
        call that waits for the fork, up to ``FORK_WAIT``, and the write that
        culled would spend its wait budget against no lock at all."""
        result = self.s.run(index, op, index, *args)
        self.copy_after_removal(index)
        return result

    def copy_after_removal(self, index: int) -> None:
        """After a removal from shard ``index`` committed: its lower counts into
        the shared table (waiting for the lock in a call of its own, so that a
        busy shard does not make the caller's removal run again). If the shard
        cannot be had, the copy stays high until the next write that adds."""
        with contextlib.suppress(CacheUnavailable):
            self.s.run(index, self.copy_counts, index)

    def _raise_low_copy(self, conn: sqlite3.Connection, index: int) -> tuple[int, int]:
        entries, nbytes = _meta(conn)
        copied_entries, copied_bytes = self.s.counts.load(index)
        if entries > copied_entries or nbytes > copied_bytes:
            return self.copy_counts(conn, index)
        return entries, nbytes

    def after_delete(self, index: int) -> None:
        """After a delete removed rows of shard ``index``: a delete copies no
        counts (only writes that add do), so when the copy says the cache is at
        a limit, the shard's lower counts are copied now (under its lock).
        Otherwise the next insert would find the cache over the limit and pay a
        recount of every shard that removes nothing (a set that replaces a
        deleted key in a full cache would cost several times a plain one)."""
        s = self.s
        entries, nbytes = s.counts.total()
        if ((s.max_entries is not None and entries >= s.max_entries)
                or (s.size_limit is not None and nbytes >= s.size_limit)):
            self.copy_after_removal(index)

    def _copy_read(self, conn: sqlite3.Connection, index: int) -> tuple[int, int]:
        meta = _meta(conn)
        self.s.counts.store(index, *meta)
        return meta

    def after_write(self, key: str, inserted: bool) -> None:
        """Cull if the write that stored ``key`` took the cache past a limit, or pay a
        batch of the debt of an earlier cull.

        Never raises for an unreachable shard: the write itself succeeded.
        """
        s = self.s
        if not inserted and s.size_limit is None:
            return  # a replacement adds no entry (and bytes are not bounded)
        entries, nbytes = s.counts.total()
        over = inserted and s.max_entries is not None and entries > s.max_entries
        too_big = s.size_limit is not None and nbytes > s.size_limit
        if over or too_big or (inserted and s.counts.debt() > 0):
            # A writer that finds another process culling goes on without
            # culling; but once the cache is over a limit by more than one
            # cull's worth, it waits for that cull (within its call's budget)
            # instead: this is what bounds the overshoot when many processes
            # insert faster than one of them can cull. Each writer checks after
            # its insert, so the bound is one cull's worth plus one insert per
            # writer (docs/architecture.md, "Counting and culling"). Past two
            # culls' worth, a writer whose wait ran out culls anyway.
            excess = 0.0
            if over:
                excess = (entries - s.max_entries) / max(  # type: ignore[operator]
                    s.max_entries // max(s.cull_frequency, 1), 1)  # type: ignore[operator]
            if too_big:
                freed = max(s.size_limit - int(s.size_limit * SIZE_LOW_WATER), 1)  # type: ignore[operator]
                excess = max(excess, (nbytes - s.size_limit) / freed)  # type: ignore[operator]
            with contextlib.suppress(CacheUnavailable):
                self.cull(keep=key, wait=excess > 1, force=excess > 2)

    def cull(self, keep: str | None = None, wait: bool = False, force: bool = False) -> None:
        """Bring the cache towards its limits; ``keep`` (the key just written) stays.

        If another process is culling, return at once, or with ``wait`` wait
        for it (at most the retry policy's ``lock_timeout``, and never past
        the call's wait budget) and then go on; with ``force``, a wait that
        runs out culls without the lock (see the module docstring).
        Removes one batch (at most ``CULL_BATCH`` entries); what is left of
        the cull is debt that later inserts pay (see the module docstring).
        """
        with self._exclusive(wait or force) as mine:
            if not mine:
                if not force:
                    return
                log_event(logging.WARNING, "cull",
                          "%s: cull.lock held past LOCK_TIMEOUT by a cull that does not "
                          "finish, and the cache is two culls' worth over its limit: "
                          "culling without the lock", self.s.directory)
            s = self.s
            debt = s.counts.debt()
            entries, nbytes = self.recount()
            if entries > SMALL_CACHE and not all(self._indexed):
                self._index_shards()
            if s.max_entries is not None and entries > s.max_entries:
                if s.cull_frequency == 0:
                    for index in range(s.n):
                        with contextlib.suppress(CacheUnavailable):
                            self.remove(index, self._remove_all, keep)
                    s.counts.set_debt(0)
                    if s.listener is not None:
                        s.listener.stamp_all()
                    return
                if debt <= 0 and entries <= SMALL_CACHE:
                    now = time.time()
                    for index in range(s.n):
                        with contextlib.suppress(CacheUnavailable):
                            self.remove(index, self._remove_expired, now)
                    entries, nbytes = s.counts.total()
            # Django removes 1/CULL_FREQUENCY of the entries for each insert that
            # finds the cache full: a new debt when none is outstanding. Writers
            # that found a cull under way went on without culling, so the count
            # may still be over the limit once a debt is paid: then a new one.
            if (
                debt <= 0
                and s.max_entries is not None
                and entries > s.max_entries
                and s.cull_frequency > 0
            ):
                # The entries that were there before the new key, as Django counts them.
                debt = (entries - 1 if keep is not None else entries) // s.cull_frequency
            if debt > 0 and s.max_entries is not None and s.cull_frequency > 0:
                # A debt is what Django's cull would have removed at once; never
                # more than takes the count down to where that cull left it.
                # Entries removed since by other means (clear, deletes, expiry)
                # pay it too: paying it all would remove fresh entries from a
                # cache far below its limit.
                floor = s.max_entries - s.max_entries // s.cull_frequency
                debt = min(debt, max(entries - floor, 0))
            if debt > 0:
                if debt <= CULL_BATCH:  # the whole (rest of the) cull: exact, across shards
                    removed = self._remove_oldest(count=debt, keep=keep)
                else:
                    removed = self._remove_oldest_of_a_shard(CULL_BATCH, keep)
                debt = debt - removed if removed else 0
                entries, nbytes = s.counts.total()
            s.counts.set_debt(max(debt, 0))
            if s.size_limit is not None and nbytes > s.size_limit:
                target = nbytes - int(s.size_limit * SIZE_LOW_WATER)
                self._remove_oldest(nbytes=max(target, 0), keep=keep)

    def _index_shards(self) -> None:
        """Give every shard the index on ``stored`` (a large cache whose shards were
        opened only by processes that cull a small one, or none)."""
        for index, done in enumerate(self._indexed):
            if not done:
                with contextlib.suppress(CacheUnavailable):
                    self.s.run(index, ensure_stored_index)
                    self._indexed[index] = True

    @contextlib.contextmanager
    def _exclusive(self, wait: bool = False) -> Iterator[bool]:
        fd = self._open_lock()
        if fd is None:
            yield False
            return
        try:
            now = time.monotonic()
            # A set_many waits for the cull after each of its keys: one call,
            # one budget, shared with its waits for shards (not LOCK_TIMEOUT
            # per key, which grows with the number of keys).
            deadline = min(now + self.s.policy.lock_timeout,
                           budget.deadline(now, self.s.policy))
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

    def _open_lock(self) -> int | None:
        """The descriptor of ``cull.lock``, or None (logged) if it cannot be opened.

        Why not raise: the cull runs after a write that succeeded, and a lock
        file replaced by a directory (by hand, by a broken tool) made every
        insert into a full cache raise, for good. A path that is not a regular
        file is moved aside (nothing deleted) and the lock created again; what
        still fails skips this cull, which a later insert retries.
        """
        path = self._lock_path
        for attempt in range(2):
            try:
                return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, 0o600)
            except OSError as exc:
                error = exc
            if attempt == 0:
                with contextlib.suppress(OSError):
                    mode = os.lstat(path).st_mode
                    if not stat.S_ISREG(mode):
                        aside = aside_name(path)
                        os.rename(path, aside)
                        log_event(logging.ERROR, "cull-lock", "%s was not a regular file "
                                  "(mode %o); moved aside to %s", path, mode, aside)
        log_event(logging.ERROR, "cull-lock", "cannot open %s (%s); culling is skipped "
                  "until it can be", path, error)
        return None

    def _remove_oldest_of_a_shard(self, count: int, keep: str | None) -> int:
        """Remove the ``count`` oldest rows of one shard, the shards taken in turn
        (the next one if a shard has none or cannot be reached). Returns how many
        went.

        Why one shard: a batch of the global oldest rows touches every shard, so
        the call takes every shard's write lock in turn, each after the writers
        queued on it; with many writers that waiting, not the deletes, is most
        of a batch's time. Keys are spread evenly over the shards, so each
        shard's oldest rows, taken in turn, are the oldest of the cache to
        within a few batches."""
        s = self.s
        for _ in range(s.n):
            index = self._turn % s.n
            self._turn += 1
            with contextlib.suppress(CacheUnavailable):
                rows = s.run(index, _oldest, count, keep)
                if rows:
                    removed = self.remove(index, self._remove_keys, [r[1] for r in rows])
                    s.stats.culled += removed
                    if removed:
                        return removed
        return 0

    def _remove_oldest(
        self, count: int | None = None, nbytes: int | None = None, keep: str | None = None
    ) -> int:
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
                    removed += self.remove(index, self._remove_keys, keys)
            s.stats.culled += removed
            total += removed
            if count is not None:
                return total
            assert nbytes is not None
            nbytes -= freed
            if removed == 0:
                return total
        return total

    # -- per-shard operations (run under StoreCore.run) ---------------------------

    def _remove_keys(self, conn: sqlite3.Connection, index: int, keys: list[str]) -> int:
        removed: list[str] = []
        with transaction(conn):
            for chunk in chunks(keys):
                sql = SQL_REMOVE_KEYS % placeholders(chunk)
                removed.extend(text_key(r[0]) for r in conn.execute(sql, chunk).fetchall())
        self._after(conn, index, removed)
        return len(removed)

    def _remove_expired(self, conn: sqlite3.Connection, index: int, now: float) -> None:
        removed = [text_key(r[0]) for r in conn.execute(SQL_REMOVE_EXPIRED, (now,)).fetchall()]
        self.s.stats.expired_removed += len(removed)
        self._after(conn, index, removed)

    def _remove_all(self, conn: sqlite3.Connection, index: int, keep: str | None) -> None:
        removed = conn.execute(
            SQL_REMOVE_ALL_BUT, (None if keep is None else sql_key(keep),)
        ).rowcount
        self.s.stats.culled += max(removed, 0)
        self.s.collect(conn, index)

    def _after(self, conn: sqlite3.Connection, index: int, keys: list[str]) -> None:
        self.s.collect(conn, index)
        if keys and self.s.listener is not None and self.s.listener.watched():
            self.s.listener.committed(keys, None)


def _meta(conn: sqlite3.Connection) -> tuple[int, int]:
    row = conn.execute(SQL_META).fetchone()
    if not row:
        return 0, 0
    if row[0] is None or row[1] is None:
        # NULL in NOT NULL columns: a page cut away under a running process
        # reads as an empty record (left as it is, the counts' compare would
        # raise TypeError in every new cache object).
        raise DamagedShard("the shard's counts read as NULL: its pages were cut or altered")
    return row[0], row[1]


def _oldest(conn: sqlite3.Connection, limit: int, keep: str | None) -> list[tuple[int, str, int]]:
    """The oldest-written rows (keys as stored: bound back as they are)."""
    return conn.execute(SQL_OLDEST, (None if keep is None else sql_key(keep), limit)).fetchall()
