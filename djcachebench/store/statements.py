"""All the SQL of the engine (schema, pragmas, statements), and the helpers that run it.

Apart from the modules that run it (``shard.py``, ``shardset.py``,
``reads.py``, ``writes.py``, ``batch.py``, ``eviction.py``, ``values.py``) so
that the operations read without the text of every statement in between.
The statements are constants: the sqlite3 module's statement cache (per
connection) finds a prepared statement again by its text.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any


class RawText(bytes):
    """A TEXT value read from SQL whose bytes are not UTF-8 (``Shard.connect``'s
    ``text_factory``): no process of ours writes one, so it is a row written by
    another program or altered. Kept as its bytes so that it can be named in SQL
    again (``placeholders``), and never taken for a value (not exactly ``bytes``)."""


def placeholders(keys: Sequence[str | bytes]) -> str:
    """The ``?`` list binding ``keys`` as read from SQL back to the same rows: a
    :class:`RawText` key is bound as its bytes and cast back to TEXT (bound as
    a BLOB it would equal no TEXT key, and a ``str`` cannot hold it)."""
    return ",".join("CAST(? AS TEXT)" if type(k) is RawText else "?" for k in keys)


# The shard's schema (why each part: shard.py's docstring; the value files'
# triggers: values.py). Idempotent: many processes may create a shard at once.
SCHEMA = """
CREATE TABLE IF NOT EXISTS cache (
    key TEXT PRIMARY KEY NOT NULL,
    expires REAL,
    stored INTEGER NOT NULL,
    created INTEGER NOT NULL,
    kind INTEGER NOT NULL,
    value,
    size INTEGER NOT NULL,
    file TEXT,
    blob INTEGER
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS blobs (id INTEGER PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS meta (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    entries INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    bytes_exact INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS garbage (name TEXT PRIMARY KEY NOT NULL, since REAL NOT NULL);
INSERT OR IGNORE INTO meta (id, entries, bytes) VALUES (0, 0, 0);
CREATE TRIGGER IF NOT EXISTS cache_insert AFTER INSERT ON cache BEGIN
    UPDATE meta SET entries = entries + 1, bytes = bytes + NEW.size WHERE id = 0;
END;
CREATE TRIGGER IF NOT EXISTS cache_delete AFTER DELETE ON cache BEGIN
    UPDATE meta SET entries = entries - 1, bytes = bytes - OLD.size WHERE id = 0;
END;
CREATE TRIGGER IF NOT EXISTS cache_resize AFTER UPDATE OF size ON cache
WHEN OLD.size != NEW.size AND (SELECT bytes_exact FROM meta WHERE id = 0) BEGIN
    UPDATE meta SET bytes = bytes - OLD.size + NEW.size WHERE id = 0;
END;
CREATE TRIGGER IF NOT EXISTS file_claimed AFTER INSERT ON cache
WHEN NEW.file IS NOT NULL BEGIN
    DELETE FROM garbage WHERE name = NEW.file;
END;
CREATE TRIGGER IF NOT EXISTS file_replaced AFTER UPDATE OF file ON cache
WHEN OLD.file IS NOT NEW.file BEGIN
    DELETE FROM garbage WHERE name = NEW.file;
    INSERT OR REPLACE INTO garbage (name, since) SELECT OLD.file, 0 WHERE OLD.file IS NOT NULL;
END;
CREATE TRIGGER IF NOT EXISTS file_released AFTER DELETE ON cache
WHEN OLD.file IS NOT NULL BEGIN
    INSERT OR REPLACE INTO garbage (name, since) VALUES (OLD.file, 0);
END;
CREATE TRIGGER IF NOT EXISTS blob_replaced AFTER UPDATE OF blob ON cache
WHEN OLD.blob IS NOT NULL AND OLD.blob IS NOT NEW.blob BEGIN
    DELETE FROM blobs WHERE id = OLD.blob;
END;
CREATE TRIGGER IF NOT EXISTS blob_released AFTER DELETE ON cache
WHEN OLD.blob IS NOT NULL BEGIN
    DELETE FROM blobs WHERE id = OLD.blob;
END;
CREATE TABLE IF NOT EXISTS tag_format (version INTEGER NOT NULL);
"""


def _split(script: str) -> tuple[str, ...]:
    """The statements of ``script`` (a trigger's body holds semicolons too)."""
    out: list[str] = []
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            out.append(pending.strip())
            pending = ""
    return tuple(out)


SCHEMA_STATEMENTS = _split(SCHEMA)
# A shard of format 4 (before ``blobs``) gets the column first; the rest of
# SCHEMA is idempotent (shard.py, ``Shard._ensure_schema``).
SQL_TABLE_COLUMNS = "SELECT name FROM pragma_table_info('%s')"
SQL_COLUMNS = SQL_TABLE_COLUMNS % "cache"
# The columns of SCHEMA's tables that the engine's statements name.
SCHEMA_COLUMNS = {
    "cache": {"key", "expires", "stored", "created", "kind", "value", "size", "file", "blob"},
    "blobs": {"id", "value"},
    "meta": {"id", "entries", "bytes", "bytes_exact"},
    "garbage": {"name", "since"},
}
SQL_ADD_BLOB_COLUMN = "ALTER TABLE cache ADD COLUMN blob INTEGER"
# Per connection (TEMP: nothing in the file): tell the coherence stamper of
# every row a write changes, inside its transaction (coherence/stamper.py).
# A deleted key goes as its bytes: culling and the sweep delete rows that no
# write of ours made, and a TEXT key that is not UTF-8 (RawText) would fail the
# call's conversion to str, and with it the delete.
SQL_CHANGE_TRIGGERS = """
CREATE TEMP TRIGGER IF NOT EXISTS djcb_inserted AFTER INSERT ON main.cache BEGIN
    SELECT djcb_changed(NEW.key);
END;
CREATE TEMP TRIGGER IF NOT EXISTS djcb_updated AFTER UPDATE ON main.cache BEGIN
    SELECT djcb_changed(NEW.key);
END;
CREATE TEMP TRIGGER IF NOT EXISTS djcb_deleted AFTER DELETE ON main.cache BEGIN
    SELECT djcb_changed(CAST(OLD.key AS BLOB));
END;
"""
# The shared copy of the shard's counts (counts.py) must never be below the
# committed counts: culling decides on it, and a count too low lets writers
# pass MAX_ENTRIES by more than the documented bound. So a write that adds
# copies the counts it leaves from inside its transaction, while it holds the
# shard's write lock: the lock orders the copies as it orders the writes, and a
# copy made before the commit is at worst ahead of it. (Copied after the
# commit, they could land out of order: a writer descheduled between its read
# of ``meta`` and its copy would put back a count from before other writers'
# inserts, as several writer processes on a loaded machine do.) A removal
# copies nothing inside its transaction, where the
# lower count would be seen before the rows are gone: culling copies it under
# the lock after its commit (eviction.py), and any write that adds copies the
# shard's exact counts again. A TEMP trigger fires before the schema's own
# (cache_insert; SQLite lists a table's temp triggers first), so it passes the
# counts as they will be.
SQL_COUNT_TRIGGERS = """
CREATE TEMP TRIGGER IF NOT EXISTS djcb_count_insert AFTER INSERT ON main.cache BEGIN
    SELECT djcb_count(entries + 1, bytes + NEW.size) FROM main.meta WHERE id = 0;
END;
"""
# And a replacement that makes the value larger, in a shard that keeps its
# bytes exact (as the schema's cache_resize): in every process, also those
# without SIZE_LIMIT, since another process's SIZE_LIMIT decides on the copy
# (otherwise a process without it could grow values to many times the limit of
# one with it, which would never cull).
SQL_COUNT_TRIGGERS += """
CREATE TEMP TRIGGER IF NOT EXISTS djcb_count_resize AFTER UPDATE OF size ON main.cache
WHEN NEW.size > OLD.size AND (SELECT bytes_exact FROM main.meta WHERE id = 0) BEGIN
    SELECT djcb_count(entries, bytes - OLD.size + NEW.size) FROM main.meta WHERE id = 0;
END;
"""
# The schema is in place once its last table is.
SQL_SCHEMA_PRESENT = (
    "SELECT count(*) FROM sqlite_master WHERE type='table' AND name='tag_format'"
)
# Rows sealed before the tags bound the key's length and the serializer
# (layout.py, format 6) cannot be told from forgeries: a shard that has them
# is emptied once, in the transaction that completes its schema.
SQL_DROP_OLD_ROWS = "DELETE FROM cache"
SQL_JOURNAL_MODE = "PRAGMA journal_mode"
SQL_WAL_MODE = "PRAGMA journal_mode=WAL"
SQL_CHECKPOINT = "PRAGMA wal_checkpoint(TRUNCATE)"
# The index on write order that culling walks in a large cache (shard.py).
SQL_HAS_STORED_INDEX = (
    "SELECT count(*) FROM sqlite_master WHERE type='index' AND name='cache_stored'"
)
SQL_STORED_INDEX = "CREATE INDEX IF NOT EXISTS cache_stored ON cache (stored)"
SQL_BYTES_EXACT = "SELECT bytes_exact FROM meta WHERE id = 0"
# Recount and flag in one statement, so no replacing write slips between the two.
# The counts made again from the rows, when the schema was (re)made: a shard
# whose ``cache`` table was dropped kept counts of rows that were gone.
SQL_RECOUNT = (
    "UPDATE meta SET entries = (SELECT count(*) FROM cache), "
    "bytes = (SELECT coalesce(sum(size), 0) FROM cache) WHERE id = 0"
)
SQL_TRACK_BYTES = (
    "UPDATE meta SET bytes = (SELECT coalesce(sum(size), 0) FROM cache), "
    "bytes_exact = 1 WHERE id = 0 AND bytes_exact = 0"
)


def pragmas(wal_limit: int, mmap_size: int, page_cache: int = 0) -> list[str]:
    """The settings of every new connection (why: shard.py's docstring)."""
    out = ["PRAGMA synchronous=NORMAL", f"PRAGMA journal_size_limit={int(wal_limit)}"]
    if page_cache:
        # A negative cache_size is a size in KiB; at least one KiB.
        out.append(f"PRAGMA cache_size={-max(1, int(page_cache) // 1024)}")
    if mmap_size:
        out.append(f"PRAGMA mmap_size={int(mmap_size)}")
    return out


# One batch statement binds at most this many keys (SQLite's limit is 32766).
BATCH = 500

# ``file``: the name of the value's file (store/values.py), NULL for a value in
# the row or in ``blobs``. ``blob``: the ``blobs`` row holding a value too long
# to stay in the key's row (codec.py ``INLINE_MAX``), NULL otherwise; then the
# row's ``value`` is NULL, and ``coalesce`` runs the subquery: only then (it
# short-circuits), so a row without a blob costs what it did before ``blobs``
# (a LEFT JOIN costs more on every get; docs/architecture.md, "Values in
# blobs").
_VALUE = "coalesce(value, (SELECT b.value FROM blobs AS b WHERE b.id = cache.blob))"
# The numbers of a row as numbers, whatever another program wrote there (TEXT,
# a BLOB, NULL): SQLite's arithmetic converts (a non-numeric text to 0), so the
# engine never compares a str with a float, and an altered expiry or write time
# reads as expired or void: a miss, never an exception (compared as they are,
# ``UPDATE cache SET expires = 'abc'`` would make get, get_many, has_key,
# touch and delete of the key raise TypeError). Also in the WHERE clauses that
# decide on them, so that add, touch and incr agree with get.
_EXPIRES = "(expires + 0)"  # NULL stays NULL: never expires
_STORED = "coalesce(CAST(stored AS INTEGER), 0)"  # an integer for the floors' compare
_SIZE = "coalesce(CAST(size AS INTEGER), 0)"
# ``stored`` last: a row stored at or before its key's floor is void, absent to
# every read and every write that reads (counts.py, "Why floors").
SQL_GET = f"SELECT kind, {_VALUE}, {_EXPIRES}, file, {_SIZE}, {_STORED} FROM cache WHERE key = ?"
# What blocks add: a row of any kind but 0 (see _ADD_WHERE) that is not void.
SQL_EXPIRES = f"SELECT {_EXPIRES}, {_STORED} FROM cache WHERE key = ? AND kind != 0"
# Every write names all three places a value can be (?5 and NULLs, or a file
# name, or a blob id), so a write replacing a value moves it wholly: the
# triggers release the file or the blob the row stops naming.
_UPSERT = (
    "INSERT INTO cache (key, expires, stored, created, kind, value, size, file, blob) "
    "VALUES (?1, ?2, ?3, ?3, ?4, {}) "
    "ON CONFLICT (key) DO UPDATE SET expires = excluded.expires, stored = excluded.stored, "
    "kind = excluded.kind, value = excluded.value, size = excluded.size, "
    "file = excluded.file, blob = excluded.blob"
)
SQL_UPSERT = _UPSERT.format("?5, ?6, NULL, NULL")
# The same for a value stored in a file: ?5 is its tag, ?7 names the file, ?8
# (add only) is now.
SQL_UPSERT_FILE = _UPSERT.format("?5, ?6, ?7, NULL")
# As SQL_ADD below (_ADD_WHERE): an expired row, one of kind 0, or a void one
# (stored at or before ?9, its key's floor) gives way.
SQL_ADD_FILE = (SQL_UPSERT_FILE
                + " WHERE (cache.expires IS NOT NULL AND cache.expires + 0 <= ?8)"
                " OR cache.kind = 0 OR coalesce(CAST(cache.stored AS INTEGER), 0) <= ?9")
# ``add`` of a value in ``blobs``: SQL_BLOB_INSERT, then SQL_ADD_BLOB with ?5 the
# new blob's id, in one transaction (``set``: SQL_BLOB_PUT below).
SQL_UPSERT_BLOB = _UPSERT.format("NULL, ?6, NULL, ?5")
SQL_BLOB_INSERT = "INSERT INTO blobs (value) VALUES (?)"
# ``set`` of a value held in ``blobs``, as one statement (one implicit
# transaction: an explicit BEGIN ... COMMIT around two statements costs more,
# docs/benchmarks.md): an INSERT into a per-connection view whose trigger writes
# both tables.
# A value replacing a blob is written over it in place (SQLite overwrites a
# record of the same size, overflow pages included, where it is), else into
# a new blob; then the row is upserted naming it (the blob_replaced trigger
# drops a blob the row stops naming). last_insert_rowid() is only taken when
# the row had no blob, that is when the INSERT into blobs ran.
SQL_BLOB_PUT_VIEW = """
CREATE TEMP VIEW IF NOT EXISTS djcb_blob_put AS
    SELECT key, expires, stored, kind, value, size FROM main.cache;
CREATE TEMP TRIGGER IF NOT EXISTS djcb_blob_put INSTEAD OF INSERT ON djcb_blob_put BEGIN
    UPDATE blobs SET value = NEW.value
        WHERE id = (SELECT blob FROM main.cache WHERE key = NEW.key);
    INSERT INTO blobs (value) SELECT NEW.value
        WHERE NOT EXISTS (SELECT 1 FROM main.cache WHERE key = NEW.key AND blob IS NOT NULL);
    INSERT INTO cache (key, expires, stored, created, kind, value, size, file, blob)
    VALUES (NEW.key, NEW.expires, NEW.stored, NEW.stored, NEW.kind, NULL, NEW.size, NULL,
            coalesce((SELECT blob FROM main.cache WHERE key = NEW.key), last_insert_rowid()))
    ON CONFLICT (key) DO UPDATE SET expires = excluded.expires, stored = excluded.stored,
        kind = excluded.kind, value = NULL, size = excluded.size, file = NULL,
        blob = excluded.blob;
END;
"""
SQL_BLOB_PUT = (
    "INSERT INTO djcb_blob_put (key, expires, stored, kind, value, size) "
    "VALUES (?1, ?2, ?3, ?4, ?5, ?6)"
)
SQL_BLOB_DROP = "DELETE FROM blobs WHERE id = ?"
# The single-key write of a cache with SIZE_LIMIT also reports, in the same
# statement, whether it inserted (``created`` is only set by an insert).
SQL_SET = SQL_UPSERT + " RETURNING created = ?3"
# add(): insert, or replace only a row that has expired.
# add replaces an expired row, and a row of kind 0 (a bare SQL integer that an
# earlier version wrote unsealed: it reads as a miss, so it must not block add;
# codec.py's docstring), and a void row (stored at or before ?8, its key's floor).
_ADD_WHERE = (" WHERE (cache.expires IS NOT NULL AND cache.expires + 0 <= ?7)"
              " OR cache.kind = 0 OR coalesce(CAST(cache.stored AS INTEGER), 0) <= ?8")
SQL_ADD = SQL_UPSERT + _ADD_WHERE
SQL_ADD_BLOB = SQL_UPSERT_BLOB + _ADD_WHERE
# With the row's kind and expiry, for touch() with a timeout already past, which
# answers whether the row was live (kind 0, an unsealed integer of an earlier
# version, reads as absent).
SQL_DELETE = f"DELETE FROM cache WHERE key = ? RETURNING file, kind, {_EXPIRES}, {_STORED}"
# kind 0 (an unsealed integer of an earlier version) and a void row read as
# absent: not touched.
SQL_TOUCH = (
    "UPDATE cache SET expires = ? WHERE key = ? AND kind != 0"
    f" AND (expires IS NULL OR {_EXPIRES} > ?) AND {_STORED} > ?"
)
# incr of a sealed 64-bit int (kind 6) in the row: one statement, so one write
# transaction; djcb_incr (codec.add_to_sealed_int) verifies, adds and seals,
# and raises for anything else, failing the statement (writes.py falls back).
SQL_INCR = (
    "UPDATE cache SET value = djcb_incr(key, value, ?), stored = ? WHERE key = ? AND kind = 6 "
    f"AND file IS NULL AND blob IS NULL AND (expires IS NULL OR {_EXPIRES} > ?) AND {_STORED} > ? "
    "RETURNING value"
)
# Integers, whatever a row's altered size made of the sums (a REAL, as _SIZE).
SQL_META = "SELECT CAST(entries AS INTEGER), CAST(bytes AS INTEGER) FROM meta WHERE id = 0"
# The sweep walks the key space SWEEP_LIMIT rows at a time (a cursor per shard
# and process), so its cost is bounded whatever the size of the shard.
SQL_SWEEP_SCAN = f"SELECT key, {_EXPIRES} FROM cache WHERE key > ? ORDER BY key LIMIT ?"
# The same from a key that is TEXT but not UTF-8 (RawText): bound as a BLOB it
# would sort after every TEXT key, and the sweep would start over from there.
SQL_SWEEP_SCAN_RAW = (
    f"SELECT key, {_EXPIRES} FROM cache WHERE key > CAST(? AS TEXT) ORDER BY key LIMIT ?"
)
SQL_GET_MANY = (
    f"SELECT key, kind, {_VALUE}, {_EXPIRES}, file, {_SIZE}, {_STORED} FROM cache "
    "WHERE key IN (%s)"
)
SQL_DELETE_MANY = "DELETE FROM cache WHERE key IN (%s)"
# The keys of a failed write that have a row to void (StoreCore.void).
SQL_STORED_KEYS = f"SELECT key, {_STORED} FROM cache WHERE key IN (%s)"
# The latest write time of a shard, as a number (an altered TEXT one reads as 0).
SQL_LATEST_STORED = f"SELECT max({_STORED}) FROM cache"
SQL_SWEEP_DELETE = f"DELETE FROM cache WHERE key IN (%s) AND {_EXPIRES} <= ? RETURNING key"
SQL_CLEAR = "DELETE FROM cache"

# Value files (store/values.py): a name in ``garbage`` is a file no row needs,
# released (since = 0) or pending its row (since = when it was registered).
SQL_GARBAGE_PENDING = "INSERT INTO garbage (name, since) VALUES (?, ?)"
# Names released by rows (since = 0), and pending names older than a cutoff:
# the latter are collected under the shard's write lock, where a late writer
# checks that its pending name is still there (SQL_GARBAGE_STILL_PENDING).
SQL_GARBAGE_RELEASED = "SELECT name FROM garbage WHERE since = 0 LIMIT ?"
SQL_GARBAGE_STALE = "SELECT name FROM garbage WHERE since > 0 AND since <= ? LIMIT ?"
SQL_GARBAGE_STILL_PENDING = "SELECT 1 FROM garbage WHERE name = ? AND since > 0"
SQL_GARBAGE_DONE = "DELETE FROM garbage WHERE name IN (%s)"
# A shard's place in its layout, in its own SQLite header (shard.py ``_place``).
SQL_APPLICATION_ID = "PRAGMA application_id"
SQL_USER_VERSION = "PRAGMA user_version"
SQL_SET_APPLICATION_ID = "PRAGMA application_id = %d"
SQL_SET_USER_VERSION = "PRAGMA user_version = %d"
SQL_CHECKPOINT_PASSIVE = "PRAGMA wal_checkpoint(PASSIVE)"
# Tells the connection's thread that one of its own statements released a value
# file (a ``garbage`` row with ``since = 0``, inserted by the schema's triggers),
# so that the write removes it at once (``StoreCore.collect``). A probe of the
# table after every write that may have released one cost a read transaction
# of its own right after the commit, which is dearer than the probe's query;
# files other processes release are theirs to remove, and what a killed
# process leaves is collected by the periodic sweep.
SQL_RELEASE_TRIGGER = """
CREATE TEMP TRIGGER IF NOT EXISTS djcb_released AFTER INSERT ON main.garbage
WHEN NEW.since = 0 BEGIN
    SELECT djcb_released();
END;
"""
# Tombstones (since = minus the time it was made): a name whose file could not be
# removed, or a stale pending name whose late writer may still create its file.
# Kept and retried until the file is gone (values.ValueFiles.collect).
SQL_GARBAGE_TOMBSTONE = "UPDATE garbage SET since = ? WHERE name IN (%s)"
SQL_GARBAGE_TOMBSTONES = "SELECT name, since FROM garbage WHERE since < 0 LIMIT ?"
# Every value file a row names, and every name pending since a cutoff (the sweep).
SQL_FILES_NAMED = "SELECT file FROM cache WHERE file IS NOT NULL"
SQL_GARBAGE_PENDING_SINCE = "SELECT name FROM garbage WHERE since > ?"


def fetch_one(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> Any:
    return conn.execute(sql, params).fetchone()


def fetch_all(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> list[Any]:
    return conn.execute(sql, params).fetchall()


def chunks(items: list[str]) -> Iterable[list[str]]:
    for i in range(0, len(items), BATCH):
        yield items[i : i + BATCH]


class transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, rolled back on any error.

    IMMEDIATE takes the write lock at BEGIN, so a busy shard is reported
    before any work is done and the whole block can simply be retried.
    """

    __slots__ = ("conn",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.conn.execute("COMMIT")
        elif self.conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self.conn.execute("ROLLBACK")


# Culling (eviction.py). The oldest rows come from the index on ``stored``
# where the shard has it (a walk of its first LIMIT entries, whatever the
# size of the shard), else from a scan of a small shard.
SQL_OLDEST = (f"SELECT {_STORED}, key, {_SIZE} FROM cache WHERE key IS NOT ? "
              "ORDER BY stored LIMIT ?")
SQL_REMOVE_KEYS = "DELETE FROM cache WHERE key IN (%s) RETURNING key"
SQL_REMOVE_EXPIRED = (f"DELETE FROM cache WHERE expires IS NOT NULL AND {_EXPIRES} <= ? "
                      "RETURNING key")
SQL_REMOVE_ALL_BUT = "DELETE FROM cache WHERE key IS NOT ?"
