"""The SQL of the shard set's operations, and the helpers that run it.

Apart from ``shardset.py`` so that the operations read without the text of
every statement in between. The statements are constants: the sqlite3
module's statement cache (per connection) finds a prepared statement again
by its text.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

# One batch statement binds at most this many keys (SQLite's limit is 32766).
BATCH = 500

SQL_GET = "SELECT kind, value, expires FROM cache WHERE key = ?"
SQL_EXPIRES = "SELECT expires FROM cache WHERE key = ?"
SQL_UPSERT = (
    "INSERT INTO cache (key, expires, stored, created, kind, value, size) "
    "VALUES (?1, ?2, ?3, ?3, ?4, ?5, ?6) "
    "ON CONFLICT (key) DO UPDATE SET expires = excluded.expires, stored = excluded.stored, "
    "kind = excluded.kind, value = excluded.value, size = excluded.size"
)
# The single-key write also reports, in the same statement, whether it
# inserted (``created`` is only set by an insert) and the shard's counts as
# they were before it (RETURNING sees the state before AFTER triggers ran):
# one statement instead of a write plus a read of ``meta``.
SQL_SET = (
    SQL_UPSERT + " RETURNING created = ?3, (SELECT entries FROM meta WHERE id = 0), "
    "(SELECT bytes FROM meta WHERE id = 0)"
)
# add(): insert, or replace only a row that has expired.
SQL_ADD = SQL_UPSERT + " WHERE cache.expires IS NOT NULL AND cache.expires <= ?7"
SQL_DELETE = "DELETE FROM cache WHERE key = ?"
SQL_TOUCH = "UPDATE cache SET expires = ? WHERE key = ? AND (expires IS NULL OR expires > ?)"
SQL_INCR = (
    "UPDATE cache SET value = value + ?, stored = ? WHERE key = ? AND kind = 0 "
    "AND (expires IS NULL OR expires > ?) AND value BETWEEN ? AND ? RETURNING value"
)
SQL_META = "SELECT entries, bytes FROM meta WHERE id = 0"
# The sweep walks the key space SWEEP_LIMIT rows at a time (a cursor per shard
# and process), so its cost is bounded whatever the size of the shard.
SQL_SWEEP_SCAN = "SELECT key, expires FROM cache WHERE key > ? ORDER BY key LIMIT ?"


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
