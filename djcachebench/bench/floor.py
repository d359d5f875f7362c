"""``BareSQLiteCache``: a measuring instrument, not a cache to use.

Why it exists: a SQLite-backed cache's latency is partly SQLite's and the
host's (locks, the WAL commit, the scheduler) and partly the backend's own
Python. This class keeps only the first part: one bare SQLite statement per
call, on 8 WAL shards like ``ShardedSQLiteCache``'s default, with the same
lock waiting (``store.retry``), and nothing else: no key making, no expiry,
no integrity tag, no counts, no culling, no stamps, no fault handling. The
``sqlite-floor`` benchmark target runs it in the same run as the real
backends, so its figures are what any design that commits a write to SQLite
inside ``set()`` cannot beat on that machine (see docs/benchmarks.md).

It supports only what the harness calls: ``get``, ``set``, ``delete``,
``clear``, ``set_many`` (the pre-fill: one transaction per shard, so a
million keys take seconds) and BaseCache's ``incr`` (a get and a set), with
``bytes`` or ``str`` keys. Values SQLite stores as they are (bytes, str, int,
float) are stored so; any other value (the ``dict`` and ``rows`` kinds) is
pickled, as every cache must serialize it somehow, and flagged in its row so
that a get unpickles exactly those.
"""

from __future__ import annotations

import os
import pickle
import sqlite3
import time
import zlib
from typing import Any

from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache

from djcachebench.store.retry import FIRST_SPIN, spin_sleep
from djcachebench.store.shard import BUSY_CODES, error_code

SHARDS = 8
# How long one call may wait for a shard's lock before it raises.
LOCK_WAIT = 10.0
# What SQLite binds as it is; anything else is pickled.
NATIVE = (bytes, str, int, float)


class BareSQLiteCache(BaseCache):
    """One SQLite statement per call over ``SHARDS`` files in ``LOCATION``."""

    def __init__(self, location: str, params: dict[str, Any]) -> None:
        super().__init__(params)
        self._directory = location
        self._conns: list[sqlite3.Connection] = []
        self._pid = -1  # connections are opened per process, on first use

    def _connections(self) -> list[sqlite3.Connection]:
        if self._pid != os.getpid():
            self._open()
        return self._conns

    def _conn(self, key: Any) -> sqlite3.Connection:
        return self._connections()[self._shard(key)]

    @staticmethod
    def _shard(key: Any) -> int:
        raw = key if isinstance(key, bytes) else str(key).encode()
        return zlib.crc32(raw) % SHARDS

    def _open(self) -> None:
        os.makedirs(self._directory, mode=0o700, exist_ok=True)
        conns = []
        for i in range(SHARDS):
            path = os.path.join(self._directory, f"bare-{i}.sqlite3")
            # busy_timeout 0: waiting is _run's, as in the real backend. That
            # includes set-up: processes opening a new shard at once race for
            # its schema, and a lost race is an immediate SQLITE_BUSY.
            conn = sqlite3.connect(path, timeout=0, isolation_level=None,
                                   check_same_thread=False)
            self._run(conn, "PRAGMA journal_mode=WAL", ())
            conn.execute("PRAGMA synchronous=NORMAL")
            self._run(conn, "CREATE TABLE IF NOT EXISTS cache (key PRIMARY KEY, value, "
                            "pickled INTEGER NOT NULL) WITHOUT ROWID", ())
            conns.append(conn)
        self._conns, self._pid = conns, os.getpid()

    @staticmethod
    def _run(conn: sqlite3.Connection, sql: str, params: tuple) -> sqlite3.Cursor:
        """Execute, waiting for a busy shard the way ``StoreCore.run`` does."""
        started = 0.0
        spin = FIRST_SPIN
        while True:
            try:
                return conn.execute(sql, params)
            except sqlite3.OperationalError as exc:
                if error_code(exc) not in BUSY_CODES:
                    raise
                now = time.monotonic()
                started = started or now
                if now - started > LOCK_WAIT:
                    raise
                spin = spin_sleep(spin, started + LOCK_WAIT, started)

    def get(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        row = self._run(self._conn(key), "SELECT value, pickled FROM cache WHERE key = ?",
                        (key,)).fetchone()
        if row is None:
            return default
        return pickle.loads(row[0]) if row[1] else row[0]

    def set(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT,
            version: int | None = None) -> None:
        native = isinstance(value, NATIVE)
        stored = value if native else pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
        self._run(self._conn(key),
                  "INSERT OR REPLACE INTO cache (key, value, pickled) VALUES (?, ?, ?)",
                  (key, stored, 0 if native else 1))

    def set_many(self, data: Any, timeout: Any = DEFAULT_TIMEOUT,
                 version: int | None = None) -> list[Any]:
        by_shard: dict[int, list[tuple[Any, Any, int]]] = {}
        for key, value in data.items():
            native = isinstance(value, NATIVE)
            stored = value if native else pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
            by_shard.setdefault(self._shard(key), []).append((key, stored, 0 if native else 1))
        for shard, rows in by_shard.items():
            conn = self._connections()[shard]
            self._run(conn, "BEGIN IMMEDIATE", ())
            try:
                conn.executemany(
                    "INSERT OR REPLACE INTO cache (key, value, pickled) VALUES (?, ?, ?)", rows)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        return []

    def delete(self, key: Any, version: int | None = None) -> bool:
        cursor = self._run(self._conn(key), "DELETE FROM cache WHERE key = ?", (key,))
        return cursor.rowcount > 0

    def clear(self) -> None:
        for conn in self._connections():
            self._run(conn, "DELETE FROM cache", ())
