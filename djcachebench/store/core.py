"""The store's core: routing, running a statement on a shard under the fault
policy, floors, and the bookkeeping after every write.

What the parts of the engine share (``reads.py``, ``writes.py``, ``batch.py``,
``eviction.py``), and nothing of theirs: they depend on it, it depends on none
of them, and the facade (``shardset.py``) composes them. Keys arrive already
made and validated, expiry as an absolute ``time.time()`` value (``None`` =
never).

Fault policy, in one place (:meth:`StoreCore.run`): a busy shard is waited for
as the ``RetryPolicy`` allows, then the operation gives up; a corrupt shard
file is set aside and recreated; other errors (disk full, I/O, read-only)
fail the operation. Each outcome is counted and logged (rate-limited) and
surfaces to the facade as ``CacheUnavailable``, which turns it into a miss or
a failed write, so a bad shard never crashes a request and never blocks the
others. A write that fails while reads still work voids the rows it meant to
replace or remove (:meth:`StoreCore.void`), so no read serves them after it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sqlite3
import time
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from ..hoststats import publish as host_stats
from . import forkgate
from .codec import Codec, sql_key, text_key
from .connections import ConnectionPool
from .counts import LATEST_FLOOR, open_counts
from .layout import LayoutGuard, shard_name
from .protocol import Listener, ShardFault
from .retry import (
    FIRST_SPIN,
    CacheUnavailable,
    RetryPolicy,
    ShardLockTimeout,
    budget,
    spin_sleep,
)
from .shard import BUSY_CODES, CORRUPT_CODES, Shard, error_code
from .statements import (
    SQL_LATEST_STORED,
    SQL_STORED_KEYS,
    SQL_SWEEP_DELETE,
    SQL_SWEEP_SCAN,
    SQL_SWEEP_SCAN_RAW,
    RawText,
    chunks,
    placeholders,
)
from .stats import COUNTERS, STATS_FILE, Stats, log_event
from .values import PENDING_AGE
from .wal import CHECK_EVERY, COMMIT_BYTES, WalBound

__all__ = ["SWEEP_EVERY", "StoreCore"]

T = TypeVar("T")

# Every SWEEP_EVERY writes to a shard (per process), the next SWEEP_LIMIT rows
# of that shard are checked and the expired ones removed; while a batch finds at
# least 1/SWEEP_AGAIN_BELOW of its rows expired, the next batch too, up to
# SWEEP_BATCHES. Why more than one: a batch a write checks one row per write,
# while every new key that expires adds one; without a count limit (MAX_ENTRIES
# None, no SIZE_LIMIT) expired rows would then grow without bound under writes
# of unique keys, to many times the live ones. Checking up to four rows a write
# while a quarter or more are
# expired holds the expired rows to about a third of the live ones at worst.
SWEEP_EVERY = 256
SWEEP_LIMIT = 256
SWEEP_BATCHES = 4
SWEEP_AGAIN_BELOW = 4


class StoreCore:
    """N SQLite shards under one directory, addressed by final cache key: what
    every part of the engine uses (``route``, ``run``, ``changed``, ``collect``,
    ``void``, ``stamp_keys``, ``group``, floors, and the attributes set in
    ``__init__``)."""

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
        index_stored: bool = False,
    ) -> None:
        self.directory = directory
        self.shards = [
            Shard(
                os.path.join(directory, shard_name(i)),
                i,
                mmap_size,
                exact_bytes=size_limit is not None,
                index_stored=index_stored,
                on_change=getattr(listener, "changing", None),
                page_cache=page_cache,
                add_to_int=codec.add_to_sealed_int,
                on_count=functools.partial(self._counted, i),
                layout=layout,
            )
            for i in range(shards)
        ]
        self.n = shards
        self.codec = codec
        self.policy = policy
        self.max_entries = max_entries
        self.cull_frequency = cull_frequency
        self.size_limit = size_limit
        self.listener = listener
        self.stats = Stats()
        codec.stats = self.stats
        # Summed over the host's processes in the directory (djcachebench.hoststats).
        host_stats.attach(os.path.join(directory, STATS_FILE), COUNTERS, self.stats)
        self.pool = ConnectionPool(self.shards, on_replaced=self._replaced, layout=layout,
                                   on_interval=host_stats.tick)
        self.counts = open_counts(os.path.join(directory, "counts.mmap"), shards)
        self._writes = [0] * shards
        self._sweep_from = [""] * shards
        self.wal = WalBound([shard.path for shard in self.shards], policy.lock_timeout,
                            self.stats)
        self.limited = max_entries is not None or size_limit is not None

    # -- routing and the fault policy ----------------------------------------

    def route(self, key: str) -> int:
        """Stable across processes and restarts (never Python's salted ``hash()``)."""
        return zlib.crc32(key.encode("utf-8", "surrogatepass")) % self.n

    def floor(self, key: str) -> int:
        """The ``time.time_ns()`` at or before which the rows of ``key`` are void."""
        return self.counts.floor(zlib.crc32(key.encode("utf-8", "surrogatepass")))

    def write_time(self, key: str) -> int:
        """The ``stored`` time of a row of ``key`` written now: the wall clock,
        or just past the key's floor when the clock is behind it (set back
        since a failed write raised the floor from rows stored before the
        step): a write that succeeds is never born void. One shared word read
        when the clock is ahead of every floor, as it is unless it stepped."""
        now = time.time_ns()
        if now > self.counts.highest_floor():
            return now
        return max(now, self.floor(key) + 1)

    def write_time_of(self, keys: Sequence[str]) -> int:
        """:meth:`write_time` for a batch whose rows are stored a nanosecond
        apart from it on."""
        now = time.time_ns()
        if now > self.counts.highest_floor():
            return now
        return max(now, max(self.floor(k) for k in keys) + 1)

    def void(self, keys: Iterable[str]) -> None:
        """A write of ``keys`` failed (disk full, shard locked past the policy,
        I/O error) while reads may still work: every row of them stored until
        now is void from now on, for every process (counts.py, "Why floors").

        Why not delete them: that is the write that just failed. Without this,
        a ``set`` that failed silently (Django's ``set`` has no result), or a
        ``delete`` that failed (its False also means "absent"), left the value
        it meant to replace or remove readable for as long as it lived.

        The floor is the later of the clock and the rows' own ``stored``
        times: after the wall clock was set back, rows stored before the step
        are later than the clock, and a floor from the clock alone would leave
        them readable.
        """
        keys, latest = self._stored(keys)
        if not keys:
            return
        slots = self.counts.slots
        self.counts.raise_floors(
            {zlib.crc32(k.encode("utf-8", "surrogatepass")) % slots for k in keys},
            max(time.time_ns(), latest))
        self.stats.voided += len(keys)
        self.stamp_keys(keys)
        log_event(logging.WARNING, "voided",
                  "a write of %d key(s) failed; their stored values read as absent "
                  "until written again", len(keys))

    def _stored(self, keys: Iterable[str]) -> tuple[list[str], int]:
        """Those of ``keys`` that have a row (any: reads still work when writes
        fail), and all the keys of a shard that cannot be read: voiding a key
        without a row would only void its slot's other keys for nothing; with
        the latest ``stored`` time of those rows. One attempt, without waiting:
        the failed write has had its wait."""
        out: list[str] = []
        latest = 0
        for index, group in self.group(keys).items():
            for chunk in chunks(group):
                try:
                    forkgate.enter()
                    try:
                        rows = self.pool.get(index).execute(
                            SQL_STORED_KEYS % placeholders(chunk), [sql_key(k) for k in chunk]
                        ).fetchall()
                    finally:
                        forkgate.leave()
                except (sqlite3.Error, OSError):
                    out.extend(chunk)
                    continue
                out.extend(text_key(r[0]) for r in rows)
                latest = max([latest, *(r[1] for r in rows)])
        return out, min(latest, LATEST_FLOOR)

    def void_shard(self, index: int) -> None:
        """:meth:`void` for every key of shard ``index`` (a ``clear`` that failed
        there), from the later of the clock and its latest row."""
        latest = 0
        with contextlib.suppress(sqlite3.Error, OSError):
            forkgate.enter()
            try:
                latest = self.pool.get(index).execute(SQL_LATEST_STORED).fetchone()[0] or 0
            finally:
                forkgate.leave()
        self.counts.raise_floors(range(index, self.counts.slots, self.n),
                                 max(time.time_ns(), min(latest, LATEST_FLOOR)))
        self.stats.voided += 1
        self.stamp_all()
        log_event(logging.WARNING, "voided",
                  "clearing shard %s failed; its stored values read as absent "
                  "until written again", self.shards[index].path)

    def run(self, index: int, op: Callable[..., T], *args: Any) -> T:
        """Run ``op(conn, *args)`` on shard ``index`` under the fault policy."""
        start = attempt_start = deadline = call_ends = 0.0
        attempt = 0
        spin = FIRST_SPIN
        while True:
            try:
                forkgate.enter()
                try:
                    return op(self.pool.get(index), *args)
                finally:
                    forkgate.leave()
            except sqlite3.Error as exc:
                code = error_code(exc)
                if code not in BUSY_CODES:
                    raise self._fault(index, exc) from exc
                now = time.monotonic()
                if not start:
                    start = attempt_start = now
                    # A call that waits on several shards shares one budget.
                    call_ends = budget.deadline(now, self.policy)
                    deadline = min(now + self.policy.lock_timeout, call_ends)
                    self.stats.lock_waits += 1
                if now < deadline:
                    spin = spin_sleep(spin, deadline, attempt_start)
                    continue
                if attempt < self.policy.retries and now < call_ends:
                    time.sleep(min(self.policy.backoff_delay(attempt), call_ends - now))
                    attempt += 1
                    attempt_start = time.monotonic()
                    deadline = min(attempt_start + self.policy.lock_timeout, call_ends)
                    spin = FIRST_SPIN
                    continue
                self.stats.give_ups += 1
                waited = now - start
                path = self.shards[index].path
                log_event(
                    logging.WARNING,
                    "give_up",
                    "gave up on locked shard %s after %.3fs",
                    path,
                    waited,
                )
                raise ShardLockTimeout(path, waited) from exc
            except OSError as exc:
                # Shard.connect creates the file itself, so a removed or
                # unusable directory surfaces as OSError, not sqlite3.Error.
                self.stats.errors += 1
                path = self.shards[index].path
                log_event(logging.ERROR, f"error{index}", "shard %s failed: %s", path, exc)
                raise ShardFault(f"shard {path}: {exc}") from exc

    def _fault(self, index: int, exc: sqlite3.Error) -> ShardFault:
        shard = self.shards[index]
        if error_code(exc) in CORRUPT_CODES:
            self.stats.corruptions += 1
            opened = self.pool.opened_file(index)
            self.pool.drop(index)
            moved = shard.quarantine(opened)
            log_event(
                logging.ERROR,
                f"corrupt{index}",
                "shard %s is corrupt (%s); %s",
                shard.path,
                exc,
                f"moved aside to {moved}, a new empty shard replaces it"
                if moved
                else "already replaced by another process",
            )
            self.counts.store(index, 0, 0)
            self.stamp_all()
            return ShardFault(f"shard {shard.path} is corrupt: {exc}")
        self.stats.errors += 1
        if isinstance(exc, sqlite3.ProgrammingError | sqlite3.InterfaceError):
            self.pool.drop(index)  # e.g. a connection closed under us: reopen next time
        log_event(logging.ERROR, f"error{index}", "shard %s failed: %s", shard.path, exc)
        return ShardFault(f"shard {shard.path}: {exc}")

    def _replaced(self, index: int) -> None:
        """A connection found its shard file deleted or replaced (see connections.py)."""
        self.stats.reopened += 1
        log_event(
            logging.WARNING,
            f"reopened{index}",
            "shard %s was deleted, replaced or cut short while open; reopened",
            self.shards[index].path,
        )
        self.stamp_all()

    def stamp_all(self) -> None:
        """The values of a whole shard changed at once (a file quarantined or replaced):
        no L1 may keep serving any value read before. Unconditional, as for ``clear()``:
        one 8-byte store, and a reader may have started watching since."""
        if self.listener is not None:
            self.listener.stamp_all()

    def stamp_keys(self, keys: Sequence[str]) -> None:
        """Stamp keys whose write did not (or may not) change them: a delete that
        found nothing or could not reach its shard, a ``touch`` or ``incr`` that
        found no live row. What such a call reports may be another process's
        delete, committed but not stamped yet; its caller must not then read the
        old value from an L1."""
        if self.listener is not None and self.listener.watched():
            self.listener.stamp_many(keys, None)

    def _counted(self, index: int, entries: int, nbytes: int) -> None:
        """SQLite calls this inside every transaction that adds to shard
        ``index``'s counts, for each row, with the counts the row leaves
        (SQL_COUNT_TRIGGERS): the shard's write lock orders the copies as it
        orders the writes, so the shared copy is never below the committed
        counts. A rolled-back transaction (a full disk at commit, a killed
        process) leaves a copy one too high, which the next write that adds
        to the shard, or a cull's recount, replaces. Removals are copied by
        culling (``Culler.recount``). Never raises: that would fail the write."""
        try:  # noqa: SIM105 - contextlib.suppress costs more on every insert
            self.counts.store(index, entries, nbytes)
        except Exception:
            pass

    def changed(
        self,
        index: int,
        conn: sqlite3.Connection,
        keys: Sequence[str],
        expires_at: Any = None,
        logged: int = 0,
    ) -> None:
        """After a committed write: sweep now and then, hold the log to its
        bound (``logged``: the bytes of the values it wrote, see wal.py),
        stamp. (Its counts were stored inside its transaction: :meth:`_counted`.)

        The write has committed: nothing here may fail the operation (a retry
        would repeat it), so bookkeeping errors are ignored.
        """
        swept: list[str] = []
        try:
            self._writes[index] += 1
            if self._writes[index] % SWEEP_EVERY == 0:
                for _ in range(SWEEP_BATCHES):
                    found, more = self._sweep(conn, index)
                    swept += found
                    if not more:
                        break
                self.shards[index].files.collect(conn)
            unchecked = self.wal.unchecked
            unchecked[index] += logged + COMMIT_BYTES
            if unchecked[index] >= CHECK_EVERY:
                self.wal.look(index, conn)
        except sqlite3.Error:
            pass
        if self.listener is not None and self.listener.watched():
            if keys:
                self.listener.committed(keys, expires_at)
            if swept:
                self.listener.committed(swept, None)

    def _sweep(self, conn: sqlite3.Connection, index: int) -> tuple[list[str], bool]:
        """Remove the expired rows among the next SWEEP_LIMIT keys of one shard:
        the keys removed, and whether to check the next batch now (many expired,
        and the shard's end not reached)."""
        start = self._sweep_from[index]
        scan = SQL_SWEEP_SCAN_RAW if type(start) is RawText else SQL_SWEEP_SCAN
        rows = conn.execute(scan, (start, SWEEP_LIMIT)).fetchall()
        full = len(rows) == SWEEP_LIMIT
        self._sweep_from[index] = rows[-1][0] if full else ""
        now = time.time()
        expired = [k for k, e in rows if e is not None and e <= now]
        if not expired:
            return [], False
        sql = SQL_SWEEP_DELETE % placeholders(expired)
        swept = [text_key(r[0]) for r in conn.execute(sql, (*expired, now)).fetchall()]
        self.stats.expired_removed += len(swept)
        return swept, full and len(expired) * SWEEP_AGAIN_BELOW >= len(rows)

    def collect(self, conn: sqlite3.Connection, index: int) -> None:
        """Remove the value files this thread's statements on shard ``index``
        released (values.py); nothing to do, and no statement, when they released
        none (``Shard.take_released``). Never fails the caller's operation: what
        is left is collected by a later call or the periodic sweep."""
        shard = self.shards[index]
        if not shard.take_released():
            return
        with contextlib.suppress(sqlite3.Error):
            shard.files.collect(conn)

    def reclaim(self, pending_age: float | None = None) -> None:
        """Remove every value file no row needs, in every shard: released ones,
        pending ones older than ``pending_age`` (default ``values.PENDING_AGE``;
        0 after every writer has stopped, e.g. after a crash), and any other file
        of the shard's directory no row names (``ValueFiles.sweep``)."""
        age = PENDING_AGE if pending_age is None else pending_age
        for index in range(self.n):
            files = self.shards[index].files
            with contextlib.suppress(CacheUnavailable):
                self.run(index, files.collect, age)
                self.run(index, files.sweep, age)

    # -- helpers -----------------------------------------------------------------

    def group(self, keys: Iterable[str]) -> dict[int, list[str]]:
        groups: dict[int, list[str]] = defaultdict(list)
        for key in keys:
            groups[self.route(key)].append(key)
        return groups
