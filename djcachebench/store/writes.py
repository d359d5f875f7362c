"""The write path of single keys: set, add, delete, touch, incr, and large values.

Each write is one statement on one shard where it can be (``BEGIN
IMMEDIATE`` only where a read-modify-write needs it: an ``incr`` of a value
that is not a sealed 64-bit int). After its commit, :meth:`StoreCore.changed`
refreshes the shared counts and stamps the key; then, when the cache has
limits, the culler decides whether this insert must cull or pay a batch of
an earlier cull's debt (``eviction.py``).

A value large enough to live in a file (``codec.Large``) is written in the
order ``values.py`` explains: a pending name, the file, then the row that
claims it, so a writer killed at any point leaves no torn value and no file
that cannot be collected.

A ``set`` or ``delete`` that fails voids the rows of its key
(:meth:`StoreCore.void`), and every write that reads a row first (``add``,
``touch``, ``incr``, ``delete``'s answer) takes a void row for absent, as the
reads do.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sqlite3
import time
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from ..coherence import KEEP
from ..serializers import TAG_SIZE
from .codec import INLINE_MAX, INT_MAX, INT_MIN, TAMPERED, Large, in_blob, sql_key
from .forkgate import enter as _enter
from .forkgate import leave as _leave
from .protocol import ShardFault, published
from .retry import CacheUnavailable, budget
from .statements import (
    SQL_ADD,
    SQL_ADD_BLOB,
    SQL_ADD_FILE,
    SQL_BLOB_DROP,
    SQL_BLOB_INSERT,
    SQL_BLOB_PUT,
    SQL_DELETE,
    SQL_EXPIRES,
    SQL_GARBAGE_DONE,
    SQL_GARBAGE_STILL_PENDING,
    SQL_GET,
    SQL_INCR,
    SQL_SET,
    SQL_TOUCH,
    SQL_UPSERT,
    SQL_UPSERT_FILE,
    fetch_all,
    fetch_one,
    transaction,
)
from .stats import log_event

if TYPE_CHECKING:
    from .core import StoreCore
    from .eviction import Culler
    from .reads import Reader


_crc32 = zlib.crc32
_time_ns = time.time_ns
_INF = math.inf  # protocol.published of no expiry

# What the sqlite3 module says when a function called from SQL raised.
_UDF_FAILED = "user-defined function raised exception"


#: Compare-and-set rounds of an incr whose sum needs a value file, before it
#: gives up (each lost round means another write of the key came in between).
_SUM_TRIES = 16


class _LargeSum(NamedTuple):
    """An incr's sum that needs a value file, and the row it was made from."""

    value: int
    kind: int
    large: Large
    size: int
    seen: tuple[Any, Any, Any]  # (kind, value or tag, file) of that row


class Writer:
    """The single-key writes of a shard set (the batch ones are in ``batch.py``)."""

    def __init__(self, core: StoreCore, reader: Reader, culler: Culler) -> None:
        self.s = core
        self.n = core.n
        # Its siblings: rows read back (has_key, decoding), limits after a write.
        self.reader = reader
        self.culler = culler
        self.pool = core.pool
        self.stats = core.stats
        self.codec = core.codec
        self.shards = core.shards

    def set(self, key: str, value: Any, expires: float | None,
            copy: bool = False) -> bytes | None:
        """Store ``value``. With ``copy``, return the pickle it was stored as
        (None for a value stored raw or by another serializer): see
        ``Reader.get_with_expiry``."""
        kind, stored, size = self.codec.encode(key, value)  # serializer errors: nothing touched
        s = self.s
        index = _crc32(key.encode("utf-8", "surrogatepass")) % self.n  # s.route, inlined
        # A set that may wait more than once (its cull, a file's two statements)
        # shares one wait budget (retry.CallBudget), inlined: this is the hot path.
        large = type(stored) is Large
        entered = (s.limited or large) and budget.until is None
        if entered:
            budget.until = 0.0
        try:
            try:
                if large:
                    inserted = self.write_file(index, key, expires, kind, stored, size)
                elif len(stored) + len(key) > INLINE_MAX:  # in_blob
                    inserted = s.run(index, self.upsert_blob, index, key, expires, kind,
                                     stored, size)
                else:
                    # One attempt without StoreCore.run's frame, as the read path
                    # does: a failed attempt changed nothing (the statement rolled
                    # back, and what follows its commit never raises), so run
                    # makes it again under the fault policy.
                    try:
                        _enter()
                        try:
                            cur = self.pool.cursor(index)
                            inserted = self.upsert(cur.connection, index, key, expires, kind,
                                                   stored, size, cur)
                        finally:
                            _leave()
                    except (sqlite3.Error, OSError):
                        inserted = s.run(index, self.upsert, index, key, expires, kind,
                                         stored, size)
            except CacheUnavailable:
                s.void((key,))  # the value it meant to replace must not be read after it
                raise
            self.stats.sets += 1
            # A replacement adds no entry: without SIZE_LIMIT it cannot take the
            # cache past a limit (the culler's own first test, spared a frame).
            if s.limited and (inserted or s.size_limit is not None):
                self.culler.after_write(key, inserted)
        finally:
            if entered:
                budget.until = None
        if copy and kind == self.codec.pickle_kind:
            return stored.payload if type(stored) is Large else stored[TAG_SIZE:]
        return None

    def upsert(
        self,
        conn: sqlite3.Connection,
        index: int,
        key: str,
        expires: float | None,
        kind: int,
        stored: Any,
        size: int,
        cur: sqlite3.Cursor | None = None,
    ) -> bool:
        """One statement; returns whether it inserted a new key. ``cur``: the
        pool's cursor of ``conn``, when the caller has it already."""
        if self.s.size_limit is None:
            # The lean write (see shard.py): no RETURNING, a real share of a
            # write's cost (docs/benchmarks.md).
            # An insert fires the insert trigger, so it changes two rows; a
            # replacement changes one (two if another process turned on exact
            # byte counts, or if the value it replaces was in ``blobs``, which a
            # trigger deletes: then the culler merely checks limits that a
            # replacement did not change).
            core = self.s
            # core.write_time and sql_key, inlined (the hot path's frames).
            now = _time_ns()
            if now <= core.counts.highest_floor():
                now = core.write_time(key)
            before = conn.total_changes
            (cur or self.pool.cursor(index)).execute(
                SQL_UPSERT, (key if key.isascii() else sql_key(key), expires, now, kind,
                             stored, size)
            )
            inserted = conn.total_changes - before > 1
            core.changed(index, conn, (key,), _INF if expires is None else expires, size)
            if inserted:
                # Two changes are also a replaced value file's name entering
                # ``garbage`` (by trigger): its file goes now, as after any
                # other write that releases one, not at the shard's next
                # collection, up to SWEEP_EVERY writes later.
                self.s.collect(conn, index)
            return inserted
        inserted = conn.execute(
            SQL_SET, (sql_key(key), expires, self.s.write_time(key), kind, stored, size)
        ).fetchall()[0][0]
        self.s.changed(index, conn, (key,), published(expires), size)
        # A replaced value file counts against SIZE_LIMIT's disk until it goes:
        # removed by the write that released it (nothing to do when it released none).
        self.s.collect(conn, index)
        return bool(inserted)

    def upsert_blob(
        self,
        conn: sqlite3.Connection,
        index: int,
        key: str,
        expires: float | None,
        kind: int,
        stored: bytes,
        size: int,
        add_at: float | None = None,
    ) -> bool:
        """The value in ``blobs`` and the row that names it, atomically. Returns
        whether a new key was inserted (for ``add``, ``add_at`` given: whether
        it added).

        ``set`` is one statement (``SQL_BLOB_PUT``); it changes three rows for
        a new key (blob, row, ``meta``) and two for a replacement, more only
        when it releases a value file: then the culler checks limits needlessly,
        as in upsert(). ``add`` is a transaction: insert the blob, upsert the
        row only over an expired one, drop the blob if it did not."""
        version = self.s.write_time(key)
        params = (sql_key(key), expires, version, kind)
        if add_at is None:
            before = conn.total_changes
            conn.execute(SQL_BLOB_PUT, (*params, stored, size))
            self.codec.remember_written(key, kind, stored)
            inserted = conn.total_changes - before > 2
            same = not inserted and self.s.size_limit is None
            self.s.changed(index, conn, (key,), published(expires), size)
            if not same:
                self.s.collect(conn, index)  # a released value file looks like an insert
            return inserted
        with transaction(conn):
            blob = conn.execute(SQL_BLOB_INSERT, (stored,)).lastrowid
            if conn.execute(SQL_ADD_BLOB, (*params, blob, size, add_at,
                                           self.s.floor(key))).rowcount != 1:
                conn.execute(SQL_BLOB_DROP, (blob,))  # a live row is there: see _add
                return False
        self.codec.remember_written(key, kind, stored)
        self.s.changed(index, conn, (key,), published(expires), size)
        self.s.collect(conn, index)  # added over an expired row, whose file it released
        return True

    def write_file(
        self,
        index: int,
        key: str,
        expires: float | None,
        kind: int,
        large: Large,
        size: int,
        add_at: float | None = None,
    ) -> bool:
        """Store a large value in a new file, then its row (see values.py for the order).

        Returns whether a new key was inserted (for ``add``, ``add_at`` given:
        whether it added). A failure anywhere leaves at most a pending name,
        which this process removes at once when it can and any process later.
        """
        return self._in_new_file(
            index, large.payload,
            lambda name: self.s.run(index, self._upsert_file, index, key, expires, kind,
                                    large.tag, size, name, add_at),
            lambda done: done or add_at is None)

    def _in_new_file(self, index: int, payload: bytes, store: Callable[[str], bool],
                     keeps: Callable[[bool], bool]) -> bool:
        """Write ``payload`` to a new file (its name registered as pending first),
        then ``store(name)`` its row; the file is removed again unless
        ``keeps(result)``. Returns ``store``'s result.

        A writer so late that its pending name was reclaimed (``store`` raises
        :class:`FileReclaimed`) writes the value again under a new name, once."""
        for _ in range(2):
            try:
                return self._in_one_new_file(index, payload, store, keeps)
            except FileReclaimed:
                self.stats.errors += 1
                log_event(logging.WARNING, f"reclaimed{index}",
                          "value file for shard %s was reclaimed before its row was "
                          "written (a writer later than PENDING_AGE); writing it again",
                          self.shards[index].path)
        raise ShardFault(f"value files of shard {self.shards[index].path} were reclaimed "
                         "twice before their row was written")

    def _in_one_new_file(self, index: int, payload: bytes, store: Callable[[str], bool],
                         keeps: Callable[[bool], bool]) -> bool:
        files = self.shards[index].files
        name = files.new_name()
        self.s.run(index, files.register, name)
        kept = False
        try:
            try:
                files.write(name, payload)
            except OSError as exc:  # disk full, quota, I/O: the write fails
                self.stats.errors += 1
                log_event(
                    logging.ERROR,
                    f"error{index}",
                    "value file for shard %s: %s",
                    self.shards[index].path,
                    exc,
                )
                raise ShardFault(f"value file {files.path(name)}: {exc}") from exc
            done = store(name)
            kept = keeps(done)
        finally:
            if not kept:
                self._forget_file(index, name)
        return done

    def _forget_file(self, index: int, name: str) -> None:
        """Best effort: remove a file no row took, and its pending name."""
        files = self.shards[index].files
        files.unlink(name)
        # If this fails too, the name stays pending: collected once PENDING_AGE old.
        with contextlib.suppress(CacheUnavailable):
            self.s.run(index, fetch_all, SQL_GARBAGE_DONE % "?", (name,))

    def _upsert_file(
        self,
        conn: sqlite3.Connection,
        index: int,
        key: str,
        expires: float | None,
        kind: int,
        tag: bytes,
        size: int,
        name: str,
        add_at: float | None,
    ) -> bool:
        """The row of a value in file ``name``: one statement, which also takes the
        name out of ``garbage`` and puts the replaced file's name there (triggers),
        in a transaction that first checks the name is still pending."""
        params: tuple[Any, ...] = (sql_key(key), expires, self.s.write_time(key), kind, tag,
                                   size, name)
        with transaction(conn):
            _still_pending(conn, name)
            if add_at is not None:
                if conn.execute(SQL_ADD_FILE, (*params, add_at,
                                               self.s.floor(key))).rowcount != 1:
                    return False
                inserted = True
            else:
                inserted = bool(conn.execute(SQL_UPSERT_FILE + " RETURNING created = ?3",
                                             params).fetchall()[0][0])
        self.s.changed(index, conn, (key,), published(expires))
        self.s.collect(conn, index)
        return inserted

    def add(self, key: str, value: Any, expires: float | None) -> bool:
        entered = budget.enter()
        try:
            return self._add_one(key, value, expires)
        finally:
            budget.leave(entered)

    def _add_one(self, key: str, value: Any, expires: float | None) -> bool:
        kind, stored, size = self.codec.encode(key, value)
        s = self.s
        index = s.route(key)
        now = time.time()
        if expires is not None and expires <= now:
            # Django: adding with a timeout <= 0 "succeeds" unless a live value
            # is there, and leaves no value behind.
            if self._live(key):
                return False
            self.delete(key)
            return True
        if type(stored) is Large:
            added = self.write_file(index, key, expires, kind, stored, size, now)
        elif in_blob(key, stored):
            added = s.run(index, self.upsert_blob, index, key, expires, kind, stored, size, now)
        else:
            added = s.run(index, self._add, index, key, expires, kind, stored, size, now)
        if added:
            self.stats.sets += 1
            if s.limited:
                self.culler.after_write(key, True)
        return added

    def _add(
        self,
        conn: sqlite3.Connection,
        index: int,
        key: str,
        expires: float | None,
        kind: int,
        stored: Any,
        size: int,
        now: float,
    ) -> bool:
        params = (sql_key(key), expires, self.s.write_time(key), kind, stored, size, now,
                  self.s.floor(key))
        if conn.execute(SQL_ADD, params).rowcount != 1:
            # A live row is there, even one we cannot verify: it may be a value
            # sealed under a key this process lacks (see Reader.tampered), and
            # add() used as a lock must never let both sides of a key
            # rotation win.
            return False
        self.s.changed(index, conn, (key,), published(expires), size)
        self.s.collect(conn, index)  # added over an expired row, whose file it released
        return True

    def _live(self, key: str) -> bool:
        """Is there a live row for ``key``, verified or not (what blocks ``add``)."""
        row = self.s.run(self.s.route(key), fetch_one, SQL_EXPIRES, (sql_key(key),))
        return (row is not None and (row[0] is None or row[0] > time.time())
                and row[1] > self.s.floor(key))

    def delete(self, key: str, live: bool = False) -> bool:
        """Whether there was a row; with ``live`` (``delete``, and ``touch`` with
        a timeout already past), whether it was live."""
        index = self.s.route(key)
        try:
            deleted, removed = self.s.run(index, self._delete_one, key, live)
        except CacheUnavailable:
            # Reads as a delete that found nothing (False): its rows are void
            # from now on, and it stamps as that one does (StoreCore.void).
            self.s.void((key,))
            raise
        if removed and self.s.limited:
            self.culler.after_delete(index)
        return deleted

    def _delete_one(self, conn: sqlite3.Connection, key: str,
                    live: bool = False) -> tuple[bool, bool]:
        """(what ``delete`` answers, whether a row was removed)."""
        index = self.s.route(key)
        rows = conn.execute(SQL_DELETE, (sql_key(key),)).fetchall()
        if rows:
            file, kind, expires, stored = rows[0]
            self.stats.deletes += 1
            if file is not None:
                self.s.collect(conn, index)
        # Stamped even when there was nothing to delete: another process's
        # delete of the key may have committed without having stamped yet, and
        # this call is acknowledged too, so no L1 may serve the value after it.
        self.s.changed(index, conn, (key,))
        if live and rows:
            return (kind != 0 and (expires is None or expires > time.time())
                    and stored > self.s.floor(key)), True
        return bool(rows), bool(rows)

    def touch(self, key: str, expires: float | None) -> bool:
        """True if a live row that this process can read took the new expiry.

        The row is verified first, as ``has_key`` does, so that ``touch``
        agrees with ``get``: a row sealed by another serializer or altered on
        disk is a miss to ``get`` and ``has_key``, and ``touch`` answers False
        for it (and leaves it as it is) instead of extending its life.
        Verifying outside the write transaction keeps a large value file's
        first hash out of the shard's lock; a row replaced between the check
        and the ``UPDATE`` is a write that raced this touch, either order of
        the two being one a caller could have seen.
        """
        if not self.reader.has_key(key):
            self._stamp_observed_absent(key)
            return False
        return self.s.run(self.s.route(key), self._touch, key, expires)

    def _touch(self, conn: sqlite3.Connection, key: str, expires: float | None) -> bool:
        params = (expires, sql_key(key), time.time(), self.s.floor(key))
        if conn.execute(SQL_TOUCH, params).rowcount != 1:
            self._stamp_observed_absent(key)
            return False
        self.s.changed(self.s.route(key), conn, (key,), published(expires))
        return True

    def incr(self, key: str, delta: int) -> int:
        """Add ``delta`` atomically; ``ValueError`` if the key is missing (as Django)."""
        index = self.s.route(key)
        entered = budget.enter()
        try:
            for _ in range(_SUM_TRIES):
                got = self.s.run(index, self._incr, index, key, delta)
                if type(got) is not _LargeSum:
                    return got  # type: ignore[no-any-return]
                if self._store_large_sum(index, key, got):
                    return got.value
            raise ShardFault(f"incr of {key!r}: the key kept changing under it")
        finally:
            budget.leave(entered)

    def _store_large_sum(self, index: int, key: str, got: _LargeSum) -> bool:
        """A sum too large for a row (an int whose pickle is 32 KiB or more): its
        file first, as ``write_file`` does, then its row, only if the key still
        holds the value the sum was made from (else False, and ``incr`` adds
        again): the file cannot be written under the shard's write lock, so the
        read-modify-write becomes a compare-and-set."""
        return self._in_new_file(
            index, got.large.payload,
            lambda name: self.s.run(index, self._put_sum, index, key, got, name), bool)

    def _put_sum(self, conn: sqlite3.Connection, index: int, key: str, got: _LargeSum,
                 name: str) -> bool:
        with transaction(conn):
            _still_pending(conn, name)
            row = conn.execute(SQL_GET, (sql_key(key),)).fetchone()
            if (row is None or (row[0], row[1], row[3]) != got.seen
                    or (row[2] is not None and row[2] <= time.time())
                    or row[5] <= self.s.floor(key)):
                return False
            conn.execute(SQL_UPSERT_FILE, (sql_key(key), row[2], self.s.write_time(key), got.kind,
                                           got.large.tag, got.size, name))
        self.s.changed(index, conn, (key,), KEEP)
        self.s.collect(conn, index)
        return True

    def _incr(self, conn: sqlite3.Connection, index: int, key: str,
              delta: int) -> int | _LargeSum:
        now = time.time()
        bound = sql_key(key)
        if type(delta) is int and INT_MIN <= delta <= INT_MAX:
            # One UPDATE: atomic across processes, the sum verified and sealed
            # inside it (codec.add_to_sealed_int).
            try:
                rows = conn.execute(SQL_INCR, (delta, self.s.write_time(key), bound, now,
                                               self.s.floor(key))).fetchall()
            except sqlite3.OperationalError as exc:
                if _UDF_FAILED not in str(exc):
                    raise  # busy, I/O...: StoreCore.run's to handle
                rows = []  # not a sealed int of this key, or past 64 bits: below
            if rows:
                self.s.changed(index, conn, (key,), KEEP)
                return self.codec.sealed_int(rows[0][0])
        # Anything else (absent, expired, another kind, a row that does not
        # verify, a sum past 64 bits) is a read-modify-write under the shard's
        # write lock, which says why or stores the sum serialized.
        with transaction(conn):
            row = conn.execute(SQL_GET, (bound,)).fetchone()
            if (row is None or (row[2] is not None and row[2] <= now)
                    or row[5] <= self.s.floor(key)):
                self._stamp_observed_absent(key)
                raise ValueError(f"Key '{key}' not found")
            if row[3] is None:
                current = self.codec.decode(key, row[0], row[1])
            else:
                read = self.shards[index].files.read(row[3], max(row[4] - TAG_SIZE, 0))
                current = (
                    TAMPERED
                    if read is None
                    else self.codec.decode_file(key, row[0], row[1], row[3], read)
                )
            if current is TAMPERED:
                self.stats.tampered += 1
                raise ValueError(f"Key '{key}' not found")
            new = current + delta  # TypeError for non-numbers, as Django's backends
            kind, stored, size = self.codec.encode(key, new)
            if type(stored) is Large:  # stored by incr(), outside this transaction
                return _LargeSum(new, kind, stored, size, (row[0], row[1], row[3]))
            params = (bound, row[2], self.s.write_time(key), kind, stored, size)
            conn.execute(SQL_BLOB_PUT if in_blob(key, stored) else SQL_UPSERT, params)
        self.s.changed(index, conn, (key,), KEEP)
        if row[3] is not None:
            self.s.collect(conn, index)  # the sum replaced a value in a file
        return new

    def _stamp_observed_absent(self, key: str) -> None:
        """A ``touch`` or ``incr`` found no live row: stamp the key anyway.

        The absence it reports may be a delete that has committed but not yet
        stamped; a caller told "absent" must not then read the old value from
        an L1 (the same reason a delete that finds nothing stamps).
        """
        self.s.stamp_keys((key,))


class FileReclaimed(Exception):
    """A value file's pending name was reclaimed before its row was written."""


def _still_pending(conn: sqlite3.Connection, name: str) -> None:
    """Inside the row's write transaction: is ``name`` still a pending file (not
    reclaimed by a collection that took its writer for dead)?"""
    if conn.execute(SQL_GARBAGE_STILL_PENDING, (name,)).fetchone() is None:
        raise FileReclaimed(name)
