"""The shard set: routing, the operations on raw keys, retries, faults and stats.

This is the Django-free engine behind ``ShardedSQLiteCache`` (like Django's
``RedisCacheClient`` behind ``RedisCache``): keys arrive already made and
validated, expiry arrives as an absolute ``time.time()`` value (``None`` =
never). Culling lives in ``eviction.py``; the directory layout and manifest
in ``layout.py``.

Fault policy, in one place (:meth:`ShardSet._run`): a busy shard is waited for
as the ``RetryPolicy`` allows, then the operation gives up; a corrupt shard
file is set aside and recreated; other errors (disk full, I/O, read-only)
fail the operation. Each outcome is counted and logged (rate-limited) and
surfaces to the facade as ``CacheUnavailable``, which turns it into a miss or
a failed write, so a bad shard never crashes a request and never blocks the
others.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sqlite3
import time
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from ..coherence import KEEP
from ..serializers import TAG_SIZE
from .codec import INT_MAX, INT_MIN, TAMPERED, Codec, Large, sql_key, text_key
from .connections import ConnectionPool
from .counts import ShardCounts
from .retry import FIRST_SPIN, CacheUnavailable, RetryPolicy, ShardLockTimeout, spin_sleep
from .shard import BUSY_CODES, CORRUPT_CODES, Shard, error_code
from .statements import (
    SQL_ADD,
    SQL_ADD_FILE,
    SQL_CLEAR,
    SQL_DELETE,
    SQL_DELETE_MANY,
    SQL_EXPIRES,
    SQL_GARBAGE_ANY,
    SQL_GARBAGE_DONE,
    SQL_GET,
    SQL_GET_MANY,
    SQL_INCR,
    SQL_META,
    SQL_SET,
    SQL_SWEEP_DELETE,
    SQL_SWEEP_SCAN,
    SQL_TOUCH,
    SQL_UPSERT,
    SQL_UPSERT_FILE,
    chunks,
    fetch_all,
    fetch_one,
    transaction,
)
from .stats import Stats, log_event

T = TypeVar("T")
MISSING: Any = object()
# _changed(): the write left the shard's tracked counts as they were.
SAME_COUNTS: Any = object()

# Every SWEEP_EVERY writes to a shard (per process), the next SWEEP_LIMIT rows
# of that shard are checked and the expired ones removed.
SWEEP_EVERY = 256
SWEEP_LIMIT = 256

class Listener(Protocol):
    """Told after every committed change: the coherence table of TieredCache.

    ``expires_at`` is the new value's absolute expiry (``math.inf``: never),
    ``None`` for a removal (or unknown), or ``KEEP`` when the write left the
    expiry as it was (``incr``).

    ``watched()`` says whether anybody reads the stamps: while it is false the
    per-key stamps are skipped (they cost a third of a set); it is asked after
    the change committed (see ``GenerationTable.watch`` for why that is safe).
    """

    def watched(self) -> bool: ...

    def stamp_many(self, keys: Iterable[str], expires_at: Any = None) -> None: ...

    def stamp_all(self) -> None: ...


def _published(expires: float | None) -> float:
    """An engine expiry (``None``: never) as the coherence table publishes it."""
    return math.inf if expires is None else expires


class ShardFault(CacheUnavailable):
    """A shard could not serve an operation (corrupt file, disk full, I/O error)."""


class ShardSet:
    """N SQLite shards under one directory, addressed by final cache key."""

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
        listener: Listener | None = None,
    ) -> None:
        self.directory = directory
        self.shards = [
            Shard(os.path.join(directory, f"shard-{i:03d}.sqlite3"), i, mmap_size,
                  exact_bytes=size_limit is not None)
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
        self.pool = ConnectionPool(self.shards, on_replaced=self._replaced)
        self.counts = ShardCounts(os.path.join(directory, "counts.mmap"), shards)
        self._writes = [0] * shards
        self._sweep_from = [""] * shards
        self._limited = max_entries is not None or size_limit is not None
        # Late import: eviction needs ShardSet's helpers, ShardSet needs a culler.
        from .eviction import Culler

        self.culler = Culler(self)
        self.culler.recount()

    # -- routing and the fault policy ----------------------------------------

    def route(self, key: str) -> int:
        """Stable across processes and restarts (never Python's salted ``hash()``)."""
        return zlib.crc32(key.encode("utf-8", "surrogatepass")) % self.n

    def run(self, index: int, op: Callable[..., T], *args: Any) -> T:
        """Run ``op(conn, *args)`` on shard ``index`` under the fault policy."""
        start = attempt_start = deadline = 0.0
        attempt = 0
        spin = FIRST_SPIN
        while True:
            try:
                return op(self.pool.get(index), *args)
            except sqlite3.Error as exc:
                code = error_code(exc)
                if code not in BUSY_CODES:
                    raise self._fault(index, exc) from exc
                now = time.monotonic()
                if not start:
                    start = attempt_start = now
                    deadline = now + self.policy.lock_timeout
                    self.stats.lock_waits += 1
                if now < deadline:
                    spin = spin_sleep(spin, deadline, attempt_start)
                    continue
                if attempt < self.policy.retries:
                    time.sleep(self.policy.backoff_delay(attempt))
                    attempt += 1
                    attempt_start = time.monotonic()
                    deadline = attempt_start + self.policy.lock_timeout
                    spin = FIRST_SPIN
                    continue
                self.stats.give_ups += 1
                waited = now - start
                path = self.shards[index].path
                log_event(logging.WARNING, "give_up", "gave up on locked shard %s after %.3fs",
                          path, waited)
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
            log_event(logging.ERROR, f"corrupt{index}",
                      "shard %s is corrupt (%s); %s", shard.path, exc,
                      f"moved aside to {moved}, a new empty shard replaces it" if moved
                      else "already replaced by another process")
            self.counts.store(index, 0, 0)
            self._stamp_all()
            return ShardFault(f"shard {shard.path} is corrupt: {exc}")
        self.stats.errors += 1
        if isinstance(exc, sqlite3.ProgrammingError | sqlite3.InterfaceError):
            self.pool.drop(index)  # e.g. a connection closed under us: reopen next time
        log_event(logging.ERROR, f"error{index}", "shard %s failed: %s", shard.path, exc)
        return ShardFault(f"shard {shard.path}: {exc}")

    def _replaced(self, index: int) -> None:
        """A connection found its shard file deleted or replaced (see connections.py)."""
        self.stats.reopened += 1
        log_event(logging.WARNING, f"reopened{index}",
                  "shard %s was deleted or replaced while open; reopened", self.shards[index].path)
        self._stamp_all()

    def _stamp_all(self) -> None:
        """The values of a whole shard changed at once (a file quarantined or replaced):
        no L1 may keep serving any value read before. Unconditional, as for ``clear()``:
        one 8-byte store, and a reader may have started watching since."""
        if self.listener is not None:
            self.listener.stamp_all()

    def _changed(self, index: int, conn: sqlite3.Connection, keys: Sequence[str],
                 counts: Any = None, expires_at: Any = None) -> None:
        """After a committed write: refresh the shared count, sweep now and then, stamp.

        ``counts`` is the shard's (entries, bytes) if the write knows them,
        ``None`` to read them, or ``SAME_COUNTS`` for a write that added or
        removed no entry and whose byte change the shard does not track (a
        replacing set without ``SIZE_LIMIT``, ``touch``, ``incr``).

        The write has committed: nothing here may fail the operation (a retry
        would repeat it), so bookkeeping errors are ignored; counts are
        refreshed again by the next write and by culling.
        """
        swept: list[str] = []
        try:
            if counts is None:
                counts = conn.execute(SQL_META).fetchone()
            if counts is not SAME_COUNTS:
                self.counts.store(index, *counts)
            self._writes[index] += 1
            if self._writes[index] % SWEEP_EVERY == 0:
                swept = self._sweep(conn, index)
                self.shards[index].files.collect(conn)
                self.shards[index].checkpoint_if_large(conn)
        except sqlite3.Error:
            pass
        if self.listener is not None and self.listener.watched():
            if keys:
                self.listener.stamp_many(keys, expires_at)
            if swept:
                self.listener.stamp_many(swept, None)

    def _sweep(self, conn: sqlite3.Connection, index: int) -> list[str]:
        """Remove the expired rows among the next SWEEP_LIMIT keys of one shard."""
        rows = conn.execute(SQL_SWEEP_SCAN, (self._sweep_from[index], SWEEP_LIMIT)).fetchall()
        self._sweep_from[index] = rows[-1][0] if len(rows) == SWEEP_LIMIT else ""
        now = time.time()
        expired = [k for k, e in rows if e is not None and e <= now]
        if not expired:
            return []
        sql = SQL_SWEEP_DELETE % ",".join("?" * len(expired))
        swept = [text_key(r[0]) for r in conn.execute(sql, (*expired, now)).fetchall()]
        self.stats.expired_removed += len(swept)
        return swept

    def collect(self, conn: sqlite3.Connection, index: int) -> None:
        """Remove the value files the rows of shard ``index`` released (values.py);
        one indexed probe when there are none. Never fails the caller's operation:
        what is left is collected by a later call."""
        try:
            if conn.execute(SQL_GARBAGE_ANY).fetchone() is not None:
                self.shards[index].files.collect(conn)
        except sqlite3.Error:
            pass

    # -- reads -----------------------------------------------------------------

    def get(self, key: str) -> Any:
        index = zlib.crc32(key.encode("utf-8", "surrogatepass")) % self.n
        try:
            # The hot path, inlined: one indexed SELECT on a warm connection.
            row = self.pool.cursor(index).execute(SQL_GET, (key,)).fetchone()
        except (sqlite3.Error, OSError, UnicodeEncodeError):
            # OSError: opening the shard file (see run()); UnicodeEncodeError:
            # a key with a lone surrogate, bound as bytes (see sql_key).
            row = self.run(index, fetch_one, SQL_GET, (sql_key(key),))
        if row is None or (row[2] is not None and row[2] <= time.time()):
            self.stats.misses += 1
            return MISSING
        if row[3] is None:
            value = self._decode(index, key, row[0], row[1])
        else:
            value, _ = self._decode_file(index, key, row)
        if value is MISSING:
            self.stats.misses += 1
        else:
            self.stats.hits += 1
        return value

    def get_with_expiry(self, key: str) -> tuple[Any, float]:
        """``(value, expires)`` from one SELECT: :meth:`get`'s value (``MISSING``
        on a miss) and the row's wall-clock expiry (``math.inf``: never)."""
        index = zlib.crc32(key.encode("utf-8", "surrogatepass")) % self.n
        try:
            row = self.pool.cursor(index).execute(SQL_GET, (key,)).fetchone()
        except (sqlite3.Error, OSError, UnicodeEncodeError):  # see get()
            row = self.run(index, fetch_one, SQL_GET, (sql_key(key),))
        if row is None or (row[2] is not None and row[2] <= time.time()):
            self.stats.misses += 1
            return MISSING, 0.0
        if row[3] is None:
            value = self._decode(index, key, row[0], row[1])
        else:
            value, row = self._decode_file(index, key, row)
        if value is MISSING:
            self.stats.misses += 1
            return MISSING, 0.0
        self.stats.hits += 1
        return value, _published(row[2])

    def _file_payload(self, index: int, key: str, row: Any) -> tuple[bytes | None, Any]:
        """The payload of a row whose value is in a file, and the row it belongs to.

        The file may have been replaced since the SELECT (a write makes a new
        file and removes the old one after its commit): then the row is read
        again, once, so a reader racing a writer gets the old or the new
        value, not a miss. ``None`` when the file is gone or short (a file
        torn by an OS crash is caught by its tag instead)."""
        files = self.shards[index].files
        for _ in range(2):
            payload = files.read(row[3], max(row[-1] - TAG_SIZE, 0))
            if payload is not None:
                return payload, row
            again = self.run(index, fetch_one, SQL_GET, (sql_key(key),))
            if again is None or again[3] is None or again[3] == row[3]:
                return None, again if again is not None else row
            if again[2] is not None and again[2] <= time.time():
                return None, again
            row = again
        return None, row

    def _decode_file(self, index: int, key: str, row: Any) -> tuple[Any, Any]:
        """``(value or MISSING, row)`` for a row (kind, tag, expires, file, size)."""
        payload, row = self._file_payload(index, key, row)
        if payload is None:
            if row[3] is None and row[1] is not None:  # replaced by a value in the row
                return self._decode(index, key, row[0], row[1]), row
            self.stats.errors += 1
            log_event(logging.WARNING, "file", "value file of %r in %s is missing",
                      key, self.shards[index].path)
            return MISSING, row
        try:
            value = self.codec.decode_file(key, row[0], row[1], row[3], payload)
        except Exception as exc:  # a verified payload the serializer cannot read
            self.stats.errors += 1
            log_event(logging.ERROR, "decode", "cannot decode %r: %r", key, exc)
            return MISSING, row
        if value is TAMPERED:
            self._tampered(index, key)
            return MISSING, row
        return value, row

    def _decode(self, index: int, key: str, kind: int, stored: Any) -> Any:
        try:
            value = self.codec.decode(key, kind, stored)
        except Exception as exc:  # a sealed payload the serializer cannot read
            self.stats.errors += 1
            log_event(logging.ERROR, "decode", "cannot decode %r: %r", key, exc)
            return MISSING
        if value is TAMPERED:
            self._tampered(index, key)
            return MISSING
        return value

    def get_many(self, keys: Iterable[str],
                 failures: list[CacheUnavailable] | None = None,
                 with_expiry: bool = False) -> dict[str, Any]:
        """The values found (``(value, expires)`` pairs with ``with_expiry``, as
        :meth:`get_with_expiry` gives them). A shard that cannot be read raises,
        or, when a ``failures`` list is given, is recorded there and its keys
        are misses while the other shards are still read."""
        found: dict[str, Any] = {}
        now = time.time()
        for index, group in self._group(keys).items():
            pending = len(group)
            try:
                for chunk in chunks(group):
                    sql = SQL_GET_MANY % ",".join("?" * len(chunk))
                    rows = self.run(index, fetch_all, sql, [sql_key(k) for k in chunk])
                    for key, kind, stored, expires, file, size in rows:
                        if expires is not None and expires <= now:
                            continue
                        key = text_key(key)
                        if file is None:
                            value = self._decode(index, key, kind, stored)
                        else:
                            value, row = self._decode_file(index, key,
                                                           (kind, stored, expires, file, size))
                            expires = row[2]
                        if value is not MISSING:
                            found[key] = (value, _published(expires)) if with_expiry else value
                    self.stats.hits += sum(1 for k in chunk if k in found)
                    self.stats.misses += sum(1 for k in chunk if k not in found)
                    pending -= len(chunk)
            except CacheUnavailable as exc:
                if failures is None:
                    raise
                failures.append(exc)
                self.stats.misses += pending
        return found

    def has_key(self, key: str) -> bool:
        """A live row whose integrity tag verifies (so ``has_key`` agrees with ``get``)."""
        index = self.route(key)
        row = self.run(index, fetch_one, SQL_GET, (sql_key(key),))
        if row is None or (row[2] is not None and row[2] <= time.time()):
            return False
        if row[3] is not None:
            payload, row = self._file_payload(index, key, row)
            ok = (row[3] is not None and payload is not None
                  and self.codec.verify_file(key, row[0], row[1], row[3], payload))
        else:
            ok = self.codec.verify(key, row[0], row[1])
        if not ok:
            self._tampered(index, key)
            return False
        return True

    def _live(self, key: str) -> bool:
        """Is there a live row for ``key``, verified or not (what blocks ``add``)."""
        row = self.run(self.route(key), fetch_one, SQL_EXPIRES, (sql_key(key),))
        return row is not None and (row[0] is None or row[0] > time.time())

    def _tampered(self, index: int, key: str) -> None:
        """A row that verifies under none of our keys: a miss, but left in place.

        Why not delete it: it may be a live value sealed by a process that uses
        another key (a SECRET_KEY rotation in progress, with a fallback that
        this process does not have). Deleting it would destroy that process's
        value; leaving it costs nothing, since it is never decoded. It goes
        when it is overwritten, expires or is culled.
        """
        self.stats.tampered += 1
        log_event(logging.WARNING, "tampered",
                  "value of %r in %s failed its integrity check under every key; "
                  "read as a miss", key, self.shards[index].path)

    # -- writes ----------------------------------------------------------------

    def set(self, key: str, value: Any, expires: float | None) -> None:
        kind, stored, size = self.codec.encode(key, value)  # serializer errors: nothing touched
        index = self.route(key)
        if type(stored) is Large:
            inserted = self._write_file(index, key, expires, kind, stored, size)
        else:
            inserted = self.run(index, self._upsert, index, key, expires, kind, stored, size)
        self.stats.sets += 1
        if self._limited:
            self.culler.after_write(key, inserted)

    def _upsert(self, conn: sqlite3.Connection, index: int, key: str, expires: float | None,
                kind: int, stored: Any, size: int) -> bool:
        """One statement; returns whether it inserted a new key."""
        if self.size_limit is None:
            # The lean write (see shard.py): no RETURNING, which costs ~3 µs.
            # An insert fires the insert trigger, so it changes two rows; a
            # replacement changes one (two only if another process turned on
            # exact byte counts: then we merely re-read the counts needlessly).
            before = conn.total_changes
            self.pool.cursor(index).execute(
                SQL_UPSERT, (sql_key(key), expires, time.time_ns(), kind, stored, size))
            inserted = conn.total_changes - before > 1
            self._changed(index, conn, (key,), None if inserted else SAME_COUNTS,
                          _published(expires))
            return inserted
        inserted, entries, nbytes = conn.execute(
            SQL_SET, (sql_key(key), expires, time.time_ns(), kind, stored, size)
        ).fetchall()[0]
        # Exact entries. Bytes: exact after an insert; after a replacement, the
        # shard's total before this write (one write behind, never accumulating:
        # each write stores an absolute value). Culling recounts before acting.
        counts = (entries + inserted, nbytes + size if inserted else nbytes)
        self._changed(index, conn, (key,), counts, _published(expires))
        return bool(inserted)

    def _write_file(self, index: int, key: str, expires: float | None, kind: int,
                    large: Large, size: int, add_at: float | None = None) -> bool:
        """Store a large value in a new file, then its row (see values.py for the order).

        Returns whether a new key was inserted (for ``add``, ``add_at`` given:
        whether it added). A failure anywhere leaves at most a pending name,
        which this process removes at once when it can and any process later.
        """
        files = self.shards[index].files
        name = files.new_name()
        self.run(index, files.register, name)
        written = False
        try:
            try:
                files.write(name, large.payload)
            except OSError as exc:  # disk full, quota, I/O: the write fails
                self.stats.errors += 1
                log_event(logging.ERROR, f"error{index}", "value file for shard %s: %s",
                          self.shards[index].path, exc)
                raise ShardFault(f"value file {files.path(name)}: {exc}") from exc
            done = self.run(index, self._upsert_file, index, key, expires, kind, large.tag,
                            size, name, add_at)
            written = done or add_at is None
        finally:
            if not written:
                self._forget_file(index, name)
        self.codec.remember_file(key, kind, name)
        return done

    def _forget_file(self, index: int, name: str) -> None:
        """Best effort: remove a file no row took, and its pending name."""
        files = self.shards[index].files
        files.unlink(name)
        # If this fails too, the name stays pending: collected once PENDING_AGE old.
        with contextlib.suppress(CacheUnavailable):
            self.run(index, fetch_all, SQL_GARBAGE_DONE % "?", (name,))

    def _upsert_file(self, conn: sqlite3.Connection, index: int, key: str,
                     expires: float | None, kind: int, tag: bytes, size: int, name: str,
                     add_at: float | None) -> bool:
        """The row of a value in file ``name``: one statement, which also takes the
        name out of ``garbage`` and puts the replaced file's name there (triggers)."""
        params: tuple[Any, ...] = (sql_key(key), expires, time.time_ns(), kind, tag, size, name)
        if add_at is not None:
            if conn.execute(SQL_ADD_FILE, (*params, add_at)).rowcount != 1:
                return False
            inserted = True
        else:
            inserted = bool(conn.execute(SQL_UPSERT_FILE + " RETURNING created = ?3",
                                         params).fetchall()[0][0])
        self._changed(index, conn, (key,), None, _published(expires))
        self.collect(conn, index)
        return inserted

    def add(self, key: str, value: Any, expires: float | None) -> bool:
        kind, stored, size = self.codec.encode(key, value)
        index = self.route(key)
        now = time.time()
        if expires is not None and expires <= now:
            # Django: adding with a timeout <= 0 "succeeds" unless a live value
            # is there, and leaves no value behind.
            if self._live(key):
                return False
            self.delete(key)
            return True
        if type(stored) is Large:
            added = self._write_file(index, key, expires, kind, stored, size, now)
        else:
            added = self.run(index, self._add, index, key, expires, kind, stored, size, now)
        if added:
            self.stats.sets += 1
            if self._limited:
                self.culler.after_write(key, True)
        return added

    def _add(self, conn: sqlite3.Connection, index: int, key: str, expires: float | None,
             kind: int, stored: Any, size: int, now: float) -> bool:
        params = (sql_key(key), expires, time.time_ns(), kind, stored, size, now)
        if conn.execute(SQL_ADD, params).rowcount != 1:
            # A live row is there, even one we cannot verify: it may be a value
            # sealed under a key this process lacks (see _tampered), and
            # add() used as a lock must never let both sides of a key
            # rotation win.
            return False
        self._changed(index, conn, (key,), None, _published(expires))
        return True

    def set_many(self, items: Mapping[str, Any], expires: float | None,
                 failures: list[CacheUnavailable] | None = None) -> list[str]:
        """Store every item; return the keys that could not be stored.

        When ``failures`` is given, the errors behind those keys are appended
        to it, so the caller can re-raise one (RAISE_ON_TIMEOUT)."""
        encoded = {k: self.codec.encode(k, v) for k, v in items.items()}  # all or nothing
        entries, _ = self.counts.total()
        if self._limited and (
            self.size_limit is not None
            or (self.max_entries is not None and entries + len(encoded) >= self.max_entries)
        ):
            # Near a limit, culling must happen between single inserts for
            # Django's semantics (set_many == a loop of set).
            failed = []
            for key, (kind, stored, size) in encoded.items():
                index = self.route(key)
                try:
                    if type(stored) is Large:
                        inserted = self._write_file(index, key, expires, kind, stored, size)
                    else:
                        inserted = self.run(index, self._upsert, index, key, expires, kind,
                                            stored, size)
                    self.stats.sets += 1
                    self.culler.after_write(key, inserted)
                except CacheUnavailable as exc:
                    failed.append(key)
                    if failures is not None:
                        failures.append(exc)
            return failed
        failed: list[str] = []
        for key in [k for k, e in encoded.items() if type(e[1]) is Large]:
            kind, large, size = encoded.pop(key)
            try:
                self._write_file(self.route(key), key, expires, kind, large, size)
                self.stats.sets += 1
            except CacheUnavailable as exc:
                failed.append(key)
                if failures is not None:
                    failures.append(exc)
        for index, group in self._group(encoded).items():
            rows = [(sql_key(k), expires, time.time_ns(), *encoded[k]) for k in group]  # ?1..?6
            try:
                self.run(index, self._upsert_batch, index, group, rows)
                self.stats.sets += len(rows)
            except CacheUnavailable as exc:
                failed.extend(group)
                if failures is not None:
                    failures.append(exc)
        return failed

    def _upsert_batch(self, conn: sqlite3.Connection, index: int, keys: list[str],
                      rows: list[tuple]) -> None:
        with transaction(conn):
            conn.executemany(SQL_UPSERT, rows)
        self._changed(index, conn, keys, None, _published(rows[0][1]))

    def delete(self, key: str) -> bool:
        try:
            return self.run(self.route(key), self._delete_one, key)
        except CacheUnavailable:
            self._stamp_failed((key,))
            raise

    def _stamp_failed(self, keys: Sequence[str]) -> None:
        """A delete that could not reach its shard reads as one that found nothing
        (``False``), so it stamps as that one does (see ``_delete_one``)."""
        if self.listener is not None and self.listener.watched():
            self.listener.stamp_many(keys, None)

    def _delete_one(self, conn: sqlite3.Connection, key: str) -> bool:
        rows = conn.execute(SQL_DELETE, (sql_key(key),)).fetchall()
        deleted = bool(rows)
        if deleted:
            self.stats.deletes += 1
            if rows[0][0] is not None:
                self.collect(conn, self.route(key))
        # Stamped even when there was nothing to delete: another process's
        # delete of the key may have committed without having stamped yet, and
        # this call is acknowledged too, so no L1 may serve the value after it.
        self._changed(self.route(key), conn, (key,), None if deleted else SAME_COUNTS)
        return deleted

    def delete_many(self, keys: Iterable[str],
                    failures: list[CacheUnavailable] | None = None) -> list[str]:
        """Delete every key; return the keys whose shard could not be reached
        (and their errors in ``failures``, when given)."""
        failed: list[str] = []
        for index, group in self._group(keys).items():
            try:
                self.run(index, self._delete_batch, index, group)
            except CacheUnavailable as exc:
                self._stamp_failed(group)
                failed.extend(group)
                if failures is not None:
                    failures.append(exc)
        return failed

    def _delete_batch(self, conn: sqlite3.Connection, index: int, keys: list[str]) -> None:
        deleted = 0
        with transaction(conn):
            for chunk in chunks(keys):
                sql = SQL_DELETE_MANY % ",".join("?" * len(chunk))
                deleted += conn.execute(sql, [sql_key(k) for k in chunk]).rowcount
        self.stats.deletes += deleted
        self.collect(conn, index)
        # Every key is stamped, found or not (see _delete_one).
        self._changed(index, conn, keys)

    def touch(self, key: str, expires: float | None) -> bool:
        return self.run(self.route(key), self._touch, key, expires)

    def _touch(self, conn: sqlite3.Connection, key: str, expires: float | None) -> bool:
        if conn.execute(SQL_TOUCH, (expires, sql_key(key), time.time())).rowcount != 1:
            self._stamp_observed_absent(key)
            return False
        self._changed(self.route(key), conn, (key,), SAME_COUNTS, _published(expires))
        return True

    def incr(self, key: str, delta: int) -> int:
        """Add ``delta`` atomically; ``ValueError`` if the key is missing (as Django)."""
        return self.run(self.route(key), self._incr, key, delta)

    def _incr(self, conn: sqlite3.Connection, key: str, delta: int) -> int:
        index = self.route(key)
        now = time.time()
        bound = sql_key(key)
        if type(delta) is int and INT_MIN <= delta <= INT_MAX:
            # One UPDATE: atomic across processes. The bounds keep the sum in
            # 64 bits (SQLite would otherwise silently turn it into a float).
            lo, hi = (INT_MIN, INT_MAX - delta) if delta >= 0 else (INT_MIN - delta, INT_MAX)
            rows = conn.execute(SQL_INCR, (delta, time.time_ns(), bound, now, lo, hi)).fetchall()
            if rows:
                self._changed(index, conn, (key,), SAME_COUNTS, KEEP)
                return rows[0][0]
        # Anything else (not an SQL integer, overflow, odd delta) is a
        # read-modify-write under the shard's write lock.
        with transaction(conn):
            row = conn.execute(SQL_GET, (bound,)).fetchone()
            if row is None or (row[2] is not None and row[2] <= now):
                self._stamp_observed_absent(key)
                raise ValueError(f"Key '{key}' not found")
            if row[3] is None:
                current = self.codec.decode(key, row[0], row[1])
            else:
                payload = self.shards[index].files.read(row[3], max(row[4] - TAG_SIZE, 0))
                current = (TAMPERED if payload is None else
                           self.codec.decode_file(key, row[0], row[1], row[3], payload))
            if current is TAMPERED:
                self.stats.tampered += 1
                raise ValueError(f"Key '{key}' not found")
            new = current + delta  # TypeError for non-numbers, as Django's backends
            kind, stored, size = self.codec.encode(key, new)
            if type(stored) is Large:
                raise TypeError(f"incr/decr of {key!r} would store a value too large for a row")
            conn.execute(SQL_UPSERT, (bound, row[2], time.time_ns(), kind, stored, size))  # ?1..?6
        self._changed(index, conn, (key,), None, KEEP)
        return new

    def _stamp_observed_absent(self, key: str) -> None:
        """A ``touch`` or ``incr`` found no live row: stamp the key anyway.

        The absence it reports may be a delete that has committed but not yet
        stamped; a caller told "absent" must not then read the old value from
        an L1 (the same reason a delete that finds nothing stamps).
        """
        if self.listener is not None and self.listener.watched():
            self.listener.stamp_many((key,))

    def clear(self) -> None:
        """Empty every shard. A shard that cannot be reached is reported."""
        failures: list[CacheUnavailable] = []
        for index in range(self.n):
            try:
                self.run(index, self._clear_one, index)
            except CacheUnavailable as exc:
                failures.append(exc)
        self._stamp_all()
        if failures:
            raise failures[0]

    def _clear_one(self, conn: sqlite3.Connection, index: int) -> None:
        conn.execute(SQL_CLEAR)
        self.counts.store(index, 0, 0)
        self.collect(conn, index)

    def reclaim(self, pending_age: float | None = None) -> None:
        """Remove every value file no row needs, in every shard: released ones, and
        pending ones older than ``pending_age`` (default ``values.PENDING_AGE``;
        0 after every writer has stopped, e.g. after a crash)."""
        for index in range(self.n):
            files = self.shards[index].files
            with contextlib.suppress(CacheUnavailable):
                if pending_age is None:
                    self.run(index, files.collect)
                else:
                    self.run(index, files.collect, pending_age)

    # -- helpers -----------------------------------------------------------------

    def _group(self, keys: Iterable[str]) -> dict[int, list[str]]:
        groups: dict[int, list[str]] = defaultdict(list)
        for key in keys:
            groups[self.route(key)].append(key)
        return groups

    def close(self) -> None:
        """Close this thread's connections (and others' on their next use)."""
        self.pool.close_all()
