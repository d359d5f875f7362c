"""The read path: one indexed SELECT, then the value from its row or its file.

Nothing here writes: a read never takes a shard's write lock, so a reader is
never blocked by writers (WAL) nor slows them. A row whose integrity tag
fails under every key is a miss and stays in place (see
:meth:`Reader.tampered`); an expired row is a miss and is removed later, by
the sweep or culling (``core.py``, ``eviction.py``); so is a void row, one
stored at or before its key's floor (a failed write's: counts.py, "Why floors").
"""

from __future__ import annotations

import logging
import sqlite3
import time
import zlib
from typing import TYPE_CHECKING, Any

from ..serializers import TAG_SIZE
from .codec import TAMPERED, sql_key
from .forkgate import enter as _enter
from .forkgate import leave as _leave
from .protocol import MISSING, published
from .statements import SQL_GET, fetch_one
from .stats import log_event
from .values import FileRead

if TYPE_CHECKING:
    from .core import StoreCore


#: What :meth:`Reader.file_payload` gives for a row deleted since its SELECT:
#: shaped like a row (kind, value, expires, file, size, stored), expired and without a file.
_GONE = (None, None, 0.0, None, 0, 0)
# Reads of a value file whose row keeps naming a new one (each write of a large
# value makes a new file and removes the old one after its commit) before the
# reader gives up with a miss.
FILE_TRIES = 4


class Reader:
    """``get``, ``get_with_expiry`` and ``has_key`` of a shard set, and the
    decoding of rows that ``get_many`` shares (``batch.py``)."""

    def __init__(self, core: StoreCore) -> None:
        self.s = core
        # Held here too: the hot path spares an attribute hop per use.
        self.n = core.n
        self.pool = core.pool
        self.stats = core.stats
        self.codec = core.codec
        self.shards = core.shards
        self.void = core.counts.void

    def get(self, key: str) -> Any:
        crc = zlib.crc32(key.encode("utf-8", "surrogatepass"))
        index = crc % self.n
        try:
            # The hot path, inlined: one indexed SELECT on a warm connection.
            _enter()
            try:
                row = self.pool.cursor(index).execute(SQL_GET, (key,)).fetchone()
            finally:
                _leave()
        except (sqlite3.Error, OSError, UnicodeEncodeError):
            # OSError: opening the shard file (see StoreCore.run);
            # UnicodeEncodeError: a key with a lone surrogate, bound as bytes
            # (see sql_key).
            row = self.s.run(index, fetch_one, SQL_GET, (sql_key(key),))
        if (row is None or (row[2] is not None and row[2] <= time.time())
                or self.void(crc, row[5])):
            self.stats.misses += 1
            return MISSING
        if row[3] is None:
            # decode(), inlined: the read path's frames are a share of its cost.
            try:
                value = self.codec.decode(key, row[0], row[1])
            except Exception as exc:  # a sealed payload the serializer cannot read
                value = self.undecodable(key, exc)
            else:
                if value is TAMPERED:
                    self.tampered(index, key)
                    value = MISSING
        else:
            value = self.decode_file(index, key, row)[0]
        if value is MISSING:
            self.stats.misses += 1
        else:
            self.stats.hits += 1
        return value

    def get_with_expiry(self, key: str,
                        copy: bool = False) -> tuple[Any, float, bytes | None]:
        """``(value, expires, pickled)`` from one SELECT: :meth:`get`'s value
        (``MISSING`` on a miss), the row's wall-clock expiry (``math.inf``:
        never) and, with ``copy``, the verified pickle the value was loaded
        from (None for a value stored raw or by another serializer): what a
        caller that keeps a private copy of a mutable value can keep instead
        of pickling it again."""
        crc = zlib.crc32(key.encode("utf-8", "surrogatepass"))
        index = crc % self.n
        try:
            _enter()
            try:
                row = self.pool.cursor(index).execute(SQL_GET, (key,)).fetchone()
            finally:
                _leave()
        except (sqlite3.Error, OSError, UnicodeEncodeError):  # see get()
            row = self.s.run(index, fetch_one, SQL_GET, (sql_key(key),))
        if (row is None or (row[2] is not None and row[2] <= time.time())
                or self.void(crc, row[5])):
            self.stats.misses += 1
            return MISSING, 0.0, None
        payload = None
        if row[3] is None:
            value = self.decode(index, key, row[0], row[1])
        else:
            value, row, payload = self.decode_file(index, key, row)
        if value is MISSING:
            self.stats.misses += 1
            return MISSING, 0.0, None
        self.stats.hits += 1
        if copy and row[0] == self.codec.pickle_kind:
            # Verified by the decode above: the row's bytes past their tag, or
            # the file's bytes that its tag covered.
            return value, published(row[2]), row[1][TAG_SIZE:] if row[3] is None else payload
        return value, published(row[2]), None

    def has_key(self, key: str) -> bool:
        """A live row whose integrity tag verifies (so ``has_key`` agrees with ``get``)."""
        crc = zlib.crc32(key.encode("utf-8", "surrogatepass"))
        index = crc % self.n
        row = self.s.run(index, fetch_one, SQL_GET, (sql_key(key),))
        if (row is None or (row[2] is not None and row[2] <= time.time())
                or self.void(crc, row[5])):
            return False
        if row[3] is not None:
            payload, row = self.file_payload(index, key, row)
            if payload is None:
                # As decode_file: replaced by a value in the row meanwhile
                # (otherwise has_key, and so touch, would answer False for a
                # key present throughout, and count it tampered).
                if row[3] is not None or row[1] is None:
                    self.file_missing(index, key, row)
                    return False
                ok = self.codec.verify(key, row[0], row[1])
            else:
                ok = self.codec.verify_file(key, row[0], row[1], row[3], payload)
        else:
            ok = self.codec.verify(key, row[0], row[1])
        if not ok:
            self.tampered(index, key)
            return False
        return True

    # -- decoding a row ------------------------------------------------------------

    def file_payload(self, index: int, key: str, row: Any) -> tuple[FileRead | None, Any]:
        """The payload of a row whose value is in a file, and the row it belongs to.

        The file may have been replaced since the SELECT (a write makes a new
        file and removes the old one after its commit): then the row is read
        again, once, so a reader racing a writer gets the old or the new
        value, not a miss. ``None`` when the file is gone or short (a file
        torn by an OS crash is caught by its tag instead)."""
        files = self.shards[index].files
        for _ in range(FILE_TRIES):
            read = files.read(row[3], max(row[4] - TAG_SIZE, 0),
                              self.codec.known_file(key, row[0], row[3]))
            if read is not None:
                return read, row
            again = self.s.run(index, fetch_one, SQL_GET, (sql_key(key),))
            if again is None:  # deleted (or culled) since the SELECT: a plain miss
                return None, _GONE
            if again[2] is not None and again[2] <= time.time():
                return None, _GONE  # expired since: a plain miss, whatever it holds
            if again[3] is None or again[3] == row[3]:
                return None, again
            row = again
        # Replaced again at every try: writers of this key outpace the reader.
        # A miss, as if it read between two writes; not a fault.
        return None, _GONE

    def file_missing(self, index: int, key: str, row: Any) -> None:
        """No payload for ``row`` (``file_payload``): counted and logged as a fault
        when the row still names a file that should be there; a row deleted,
        expired or replaced since is not one."""
        if row is _GONE or (row[2] is not None and row[2] <= time.time()):
            return
        self.stats.errors += 1
        log_event(
            logging.WARNING,
            "file",
            "value file of %r in %s is missing",
            key,
            self.shards[index].path,
        )

    def decode_file(self, index: int, key: str, row: Any) -> tuple[Any, Any, bytes | None]:
        """``(value or MISSING, row, payload)`` for a row (kind, tag, expires, file,
        size, stored); ``payload``: the file's verified bytes, when the value came
        from the file (None when the row was found holding its value meanwhile)."""
        payload, row = self.file_payload(index, key, row)
        if payload is None:
            if row[3] is None and row[1] is not None:  # replaced by a value in the row
                return self.decode(index, key, row[0], row[1]), row, None
            self.file_missing(index, key, row)
            return MISSING, row, None
        try:
            value = self.codec.decode_file(key, row[0], row[1], row[3], payload)
        except Exception as exc:  # a verified payload the serializer cannot read
            return self.undecodable(key, exc), row, None
        if value is TAMPERED:
            self.tampered(index, key)
            return MISSING, row, None
        return value, row, payload.payload

    def decode(self, index: int, key: str, kind: int, stored: Any) -> Any:
        """The value of a row that holds it (``MISSING`` if it cannot be trusted or read)."""
        try:
            value = self.codec.decode(key, kind, stored)
        except Exception as exc:  # a sealed payload the serializer cannot read
            return self.undecodable(key, exc)
        if value is TAMPERED:
            self.tampered(index, key)
            return MISSING
        return value

    def undecodable(self, key: str, exc: Exception) -> Any:
        """A verified row whose payload its serializer cannot read: a miss, logged."""
        self.stats.errors += 1
        log_event(logging.ERROR, "decode", "cannot decode %r: %r", key, exc)
        return MISSING

    def tampered(self, index: int, key: str) -> None:
        """A row that verifies under none of our keys: a miss, but left in place.

        Why not delete it: it may be a live value sealed by a process that uses
        another key (a SECRET_KEY rotation in progress, with a fallback that
        this process does not have). Deleting it would destroy that process's
        value; leaving it costs nothing, since it is never decoded. It goes
        when it is overwritten, expires or is culled.
        """
        self.stats.tampered += 1
        log_event(
            logging.WARNING,
            "tampered",
            "value of %r in %s failed its integrity check under every key; read as a miss",
            key,
            self.shards[index].path,
        )
