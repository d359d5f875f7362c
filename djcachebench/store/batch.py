"""The batch operations: one query or transaction per shard touched, not one per key.

``get_many``, ``set_many`` and ``delete_many`` group the keys by shard. A
shard that cannot be reached costs only its own keys (reported to the
caller), never the others'. Near a count limit, and whenever ``SIZE_LIMIT``
is set, ``set_many`` writes key by key instead, so that culling happens
between single inserts as Django's semantics want (``set_many`` == a loop of
``set``).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .codec import Large, in_blob, sql_key, text_key
from .protocol import MISSING, published
from .retry import CacheUnavailable, within_budget
from .statements import (
    SQL_BLOB_PUT,
    SQL_DELETE_MANY,
    SQL_GET_MANY,
    SQL_UPSERT,
    chunks,
    fetch_all,
    transaction,
)

if TYPE_CHECKING:
    from .core import StoreCore
    from .eviction import Culler
    from .reads import Reader
    from .writes import Writer


class Batch:
    """``get_many``, ``set_many`` and ``delete_many`` of a shard set."""

    def __init__(self, core: StoreCore, reader: Reader, writer: Writer,
                 culler: Culler) -> None:
        self.s = core
        # Its siblings: rows decoded, single rows and files written, limits after a write.
        self.reader = reader
        self.writer = writer
        self.culler = culler
        self.stats = core.stats

    @within_budget
    def get_many(
        self,
        keys: Iterable[str],
        failures: list[CacheUnavailable] | None = None,
        with_expiry: bool = False,
    ) -> dict[str, Any]:
        """The values found (``(value, expires)`` pairs with ``with_expiry``, as
        ``get_with_expiry`` gives them). A shard that cannot be read raises,
        or, when a ``failures`` list is given, is recorded there and its keys
        are misses while the other shards are still read."""
        reader = self.reader
        floor = self.s.floor
        # Rows stored after every floor need no look at their own (counts.py).
        highest = self.s.counts.highest_floor()
        found: dict[str, Any] = {}
        now = time.time()
        for index, group in self.s.group(keys).items():
            pending = len(group)
            try:
                for chunk in chunks(group):
                    sql = SQL_GET_MANY % ",".join("?" * len(chunk))
                    rows = self.s.run(index, fetch_all, sql, [sql_key(k) for k in chunk])
                    for key, kind, stored, expires, file, size, written in rows:
                        if expires is not None and expires <= now:
                            continue
                        key = text_key(key)
                        if written <= highest and written <= floor(key):  # void (counts.py)
                            continue
                        if file is None:
                            value = reader.decode(index, key, kind, stored)
                        else:
                            value, row, _ = reader.decode_file(
                                index, key, (kind, stored, expires, file, size, written)
                            )
                            expires = row[2]
                        if value is not MISSING:
                            found[key] = (value, published(expires)) if with_expiry else value
                    self.stats.hits += sum(1 for k in chunk if k in found)
                    self.stats.misses += sum(1 for k in chunk if k not in found)
                    pending -= len(chunk)
            except CacheUnavailable as exc:
                if failures is None:
                    raise
                failures.append(exc)
                self.stats.misses += pending
        return found

    @within_budget
    def set_many(
        self,
        items: Mapping[str, Any],
        expires: float | None,
        failures: list[CacheUnavailable] | None = None,
    ) -> list[str]:
        """Store every item; return the keys that could not be stored.

        When ``failures`` is given, the errors behind those keys are appended
        to it, so the caller can re-raise one (RAISE_ON_TIMEOUT)."""
        s = self.s
        writer = self.writer
        encoded = {k: s.codec.encode(k, v) for k, v in items.items()}  # all or nothing
        entries, _ = s.counts.total()
        failed: list[str] = []

        def failing(keys: list[str], exc: CacheUnavailable) -> None:
            failed.extend(keys)
            if failures is not None:
                failures.append(exc)

        if s.limited and (
            s.size_limit is not None
            or (s.max_entries is not None and entries + len(encoded) >= s.max_entries)
        ):
            # Near a limit, culling must happen between single inserts (see above).
            for key, (kind, stored, size) in encoded.items():
                index = s.route(key)
                try:
                    if type(stored) is Large:
                        inserted = writer.write_file(index, key, expires, kind, stored, size)
                    elif in_blob(key, stored):
                        inserted = s.run(
                            index, writer.upsert_blob, index, key, expires, kind, stored, size
                        )
                    else:
                        inserted = s.run(
                            index, writer.upsert, index, key, expires, kind, stored, size
                        )
                    self.stats.sets += 1
                    self.culler.after_write(key, inserted)
                except CacheUnavailable as exc:
                    failing([key], exc)
            s.void(failed)
            return failed
        for key in [k for k, e in encoded.items() if type(e[1]) is Large]:
            kind, large, size = encoded.pop(key)
            try:
                writer.write_file(s.route(key), key, expires, kind, large, size)
                self.stats.sets += 1
            except CacheUnavailable as exc:
                failing([key], exc)
        for index, group in s.group(encoded).items():
            rows = [(sql_key(k), expires, 0, *encoded[k]) for k in group]  # ?1..?6
            try:
                s.run(index, self._upsert_batch, index, group, rows)
                self.stats.sets += len(rows)
            except CacheUnavailable as exc:
                failing(group, exc)
        s.void(failed)
        return failed

    def _upsert_batch(
        self, conn: sqlite3.Connection, index: int, keys: list[str], rows: list[tuple]
    ) -> None:
        inline: list[tuple] = []
        blobs: list[tuple] = []
        # The time each row is stored at, taken at each attempt (run() retries a
        # busy shard): a time taken before a wait could be at or below a floor
        # that a failed write raised meanwhile, voiding this write once it
        # commits.
        # A nanosecond apart, in the caller's order, so that culling (oldest
        # first) removes them in that order, as separate sets would be.
        now = self.s.write_time_of(keys)
        rows = [(r[0], r[1], now + i, *r[3:]) for i, r in enumerate(rows)]
        for key, row in zip(keys, rows, strict=True):
            (blobs if in_blob(key, row[4]) else inline).append(row)
        with transaction(conn):
            conn.executemany(SQL_UPSERT, inline)
            for row in blobs:
                conn.execute(SQL_BLOB_PUT, row)
        self.s.changed(index, conn, keys, published(rows[0][1]), sum(r[5] for r in rows))
        self.s.collect(conn, index)  # the files of large values these replaced

    @within_budget
    def delete_many(
        self, keys: Iterable[str], failures: list[CacheUnavailable] | None = None
    ) -> list[str]:
        """Delete every key; return the keys whose shard could not be reached
        (and their errors in ``failures``, when given)."""
        failed: list[str] = []
        for index, group in self.s.group(keys).items():
            try:
                self.s.run(index, self._delete_batch, index, group)
                if self.s.limited:
                    self.culler.after_delete(index)
            except CacheUnavailable as exc:
                # Its rows are void from now on (stamped too: StoreCore.void).
                self.s.void(group)
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
        self.s.collect(conn, index)
        # Every key is stamped, found or not (see Writer._delete_one).
        self.s.changed(index, conn, keys)
