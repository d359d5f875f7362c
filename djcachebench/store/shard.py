"""One shard: a SQLite file, its schema, its connections, and its quarantine.

Why these SQLite settings:
- WAL: readers never block writers nor each other; a commit appends to the
  log instead of rewriting the database, and a reader takes no write lock.
- ``synchronous=NORMAL`` in WAL mode: a commit is durable against a crash of
  the process (SIGKILL included) and is only exposed to an OS crash or power
  loss, where a cache may lose its last writes; it saves an fsync per write.
- ``busy_timeout=0``: we wait for locks ourselves (see ``retry.py``).
- ``WITHOUT ROWID`` with the key as primary key: a get is one B-tree lookup.
- At most one secondary index, on ``stored``, and only where culling needs it:
  in a large cache culling finds the oldest rows by walking it instead of
  scanning the shard (eviction.py). It costs every replacing set two more
  index pages in its commit, half again the cost of the set
  (docs/benchmarks.md), so a shard gets it only when a process that may cull
  a large cache opens it (``SIZE_LIMIT`` set, or ``MAX_ENTRIES`` above
  ``eviction.SMALL_CACHE``), or when a cull finds a large cache without it.
  A cache that never culls, or culls at most ``SMALL_CACHE`` entries (scanned
  in a few milliseconds), writes without it. There is no index on
  ``expires``: expired rows are swept in bounded steps instead.
- No memory mapping unless ``MMAP_SIZE`` asks for one: SQLite drops a
  connection's mapping at every read that follows another connection's
  write, and mapping again costs more than the ``pread`` calls it saves
  when several processes write (docs/benchmarks.md: a million keys under 8
  processes run slower mapped). SQLite maps every shard's
  ``-shm`` anyway, so ``ConnectionPool.check_files`` watches for a file cut
  short under a mapping (nothing of ours ever shrinks one).
- A page cache of ``PAGE_CACHE`` per connection (32 MiB by default, as
  diskcache's 8,192 pages): without a mapping, a page that is not in it is
  copied in with a ``pread`` at every read, and a 10 KB value spans three
  pages. SQLite allocates its cache as pages are read, so a connection holds
  at most what it read of its shard; and in WAL mode it empties it whenever
  another connection has committed to the shard since its last read, so it
  pays where a process reads more than others write (docs/benchmarks.md).
- ``journal_size_limit`` (``WAL_LIMIT``) cuts the ``-wal`` file back whenever
  the log is reset; the writers reset it once it passes twice that (wal.py),
  which holds it within three times ``WAL_LIMIT`` while readers keep moving.
  A reader that holds a snapshot for good keeps it unbounded: no checkpoint
  can pass a snapshot.
- Triggers keep ``meta.entries`` exact inside the same transaction as the
  change, so counts survive crashes with the data. ``meta.bytes`` follows
  inserts and deletes too, but a *replacing* write changes it only once
  ``meta.bytes_exact`` is set, which a process with ``SIZE_LIMIT`` does when
  it opens the shard (recounting the bytes first; it is never unset). Why:
  the resize trigger writes the ``meta`` page, a second WAL frame on a commit
  that otherwise writes one, a large share of a replacing set's cost
  (docs/benchmarks.md), and only ``SIZE_LIMIT`` reads the byte total.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import sqlite3
import stat
import threading
from collections.abc import Callable, Iterator
from typing import Any

from .layout import SHARD_APPLICATION_ID, LayoutChanged, LayoutGuard, aside_name
from .statements import (
    SCHEMA_COLUMNS,
    SCHEMA_STATEMENTS,
    SQL_ADD_BLOB_COLUMN,
    SQL_APPLICATION_ID,
    SQL_BLOB_PUT_VIEW,
    SQL_BYTES_EXACT,
    SQL_CHANGE_TRIGGERS,
    SQL_COLUMNS,
    SQL_COUNT_TRIGGERS,
    SQL_DROP_OLD_ROWS,
    SQL_HAS_STORED_INDEX,
    SQL_JOURNAL_MODE,
    SQL_RECOUNT,
    SQL_RELEASE_TRIGGER,
    SQL_SCHEMA_PRESENT,
    SQL_SET_APPLICATION_ID,
    SQL_SET_USER_VERSION,
    SQL_STORED_INDEX,
    SQL_TABLE_COLUMNS,
    SQL_TRACK_BYTES,
    SQL_USER_VERSION,
    SQL_WAL_MODE,
    RawText,
    pragmas,
)
from .stats import log_event
from .values import ValueFiles
from .wal import WAL_LIMIT

# What identifies the file a path names: (st_dev, st_ino).
FileId = tuple[int, int]


# SQLite primary result codes (exc.sqlite_errorcode & 0xff), Python >= 3.11.
SQLITE_BUSY = 5
SQLITE_LOCKED = 6
SQLITE_CORRUPT = 11
SQLITE_NOTADB = 26

BUSY_CODES = frozenset({SQLITE_BUSY, SQLITE_LOCKED})
CORRUPT_CODES = frozenset({SQLITE_CORRUPT, SQLITE_NOTADB})


SQLITE_ERROR = 1
SQLITE_CONSTRAINT = 19

# What the engine's own statements can only meet in a file it did not write
# that way: a table of its schema dropped or of another shape (another
# program's database at the shard's path), a NULL where its schema forbids
# one (pages cut away under a running process read as empty records). SQLite
# calls these plain errors; they fail every call on the shard for good, in
# every process, so they are taken for corruption and the file is set aside:
# otherwise such a shard stays dead, and a cut one makes every new cache
# object raise TypeError.
_NOT_OURS = re.compile(
    r"no such table: (?:main\.)?(?:cache|blobs|meta|garbage|tag_format)\b"
    r"|no such column|has no column named|NOT NULL constraint failed"
)


class DamagedShard(sqlite3.DatabaseError):
    """The shard's data or schema is not what this engine writes: corrupt
    (code SQLITE_CORRUPT), set aside by the fault policy."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.sqlite_errorcode = SQLITE_CORRUPT


def error_code(exc: sqlite3.Error) -> int:
    """The primary SQLite result code of an exception (0 if unknown); an error
    that only a file not written by this engine causes is SQLITE_CORRUPT."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:  # pragma: no cover - Python < 3.11
        text = str(exc)
        if "locked" in text or "busy" in text:
            return SQLITE_BUSY
        if "malformed" in text or "not a database" in text or _NOT_OURS.search(text):
            return SQLITE_CORRUPT
        return 0
    code &= 0xFF
    if code in (SQLITE_ERROR, SQLITE_CONSTRAINT) and _NOT_OURS.search(str(exc)):
        return SQLITE_CORRUPT
    return code


def _lenient_text(data: bytes) -> str | RawText:
    """A TEXT column as ``str``, or as :class:`RawText` if it is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return RawText(data)


# Descriptors that ``regrow`` opened, by the file they name (and any second one
# opened while a file was being replaced): never closed. Why: closing any
# descriptor of a file drops every POSIX lock this process holds on it, SQLite's
# included, and the other threads' connections to the shard would go on without
# theirs: another process closing its last connection then takes the file for
# unused and deletes the log under them (their commits lost). SQLite itself
# closes a descriptor only when no connection of the process holds a lock. At
# most one is kept per shard file or ``-shm`` a process ever regrew.
_kept: dict[FileId, int] = {}
_kept_spare: list[int] = []
_kept_lock = threading.Lock()


def _kept_descriptor(path: str) -> int | None:
    """A read-write descriptor of the file at ``path``, kept open for good (see
    ``_kept``); ``None`` if there is no such file."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    with _kept_lock:
        fd = _kept.get((st.st_dev, st.st_ino))
        if fd is not None:
            return fd
        try:
            fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        except OSError:
            return None
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) in _kept:  # replaced between the stat and the open
            _kept_spare.append(fd)
        else:
            _kept[st.st_dev, st.st_ino] = fd
        return fd


class Shard:
    """Opens connections to one shard file and knows how to set it up or set it aside."""

    def __init__(
        self,
        path: str,
        index: int,
        mmap_size: int,
        exact_bytes: bool = False,
        index_stored: bool = False,
        on_change: Callable[[str | bytes], None] | None = None,
        page_cache: int = 0,
        add_to_int: Callable[[str, Any, int], bytes] | None = None,
        on_count: Callable[[int, int], None] | None = None,
        layout: LayoutGuard | None = None,
    ) -> None:
        self.path = path
        # Looked at before every connection is opened: a shard file made again
        # (deleted, or the whole directory removed) must be made under the
        # layout the directory holds now, not this process's (layout.py).
        self._layout = layout
        # Called inside each write transaction for every row it changes (the
        # coherence stamper's mark; see coherence/stamper.py), by TEMP triggers
        # of each connection: nothing of it is stored in the file, so any other
        # program can still open and write the shard.
        self._on_change = on_change
        # djcb_incr of SQL_INCR (codec.add_to_sealed_int).
        self._add_to_int = add_to_int
        # Called inside each transaction that changes the shard's counts, with
        # the counts it leaves (SQL_COUNT_TRIGGERS): the shared copy (counts.py).
        self._on_count = on_count
        self.index = index
        self._mmap_size = mmap_size
        self._page_cache = page_cache
        # SIZE_LIMIT reads the byte total: make sure the file keeps it exact.
        self._exact_bytes = exact_bytes
        # A large cache may be culled: write order indexed (see the docstring).
        self.index_stored = index_stored
        self.files = ValueFiles(os.path.dirname(path) or ".", index)
        # Per thread, as connections are: did a statement of this thread's
        # connection release a value file since the last ``take_released``?
        self._released = threading.local()

    def connect(self) -> sqlite3.Connection:
        """A new connection with the schema in place (creating the file 0o600 if needed)."""
        if self._layout is not None:
            self._layout.confirm()
        try:
            mode = os.lstat(self.path).st_mode
        except FileNotFoundError:
            self._create()
        else:
            if stat.S_ISLNK(mode):
                # A link to a regular file is followed, as SQLite does; a link
                # to nothing (whose target SQLite cannot create) or to a
                # device is as odd as a device at the path.
                try:
                    target = os.stat(self.path).st_mode
                except OSError:
                    target = None
                if target is None or not stat.S_ISREG(target):
                    self._set_aside_odd(mode)
            elif not stat.S_ISREG(mode):
                self._set_aside_odd(mode)
        conn = sqlite3.connect(
            self.path,
            timeout=0,
            isolation_level=None,  # autocommit: one statement = one transaction
            check_same_thread=False,  # owned by one thread; closed from others on shutdown
            cached_statements=64,
        )
        # TEXT that is not UTF-8 (a row written by another program, or altered)
        # made the sqlite3 module raise while fetching, failing every row of the
        # statement: one such row turned a whole get_many into misses, and the
        # scans of culling and the sweep into errors, so that a one-shard cache
        # stopped culling. Read as RawText, it is one row that does not verify,
        # and culling can still name it. Only keys and file names are TEXT here.
        conn.text_factory = _lenient_text
        try:
            for pragma in pragmas(WAL_LIMIT, self._mmap_size, self._page_cache):
                conn.execute(pragma)
            self._ensure_schema(conn)
            if self._layout is not None:
                self._place(conn)
            if self._exact_bytes:
                _track_bytes(conn)
            if self.index_stored:
                ensure_stored_index(conn)
            conn.executescript(SQL_BLOB_PUT_VIEW)
            conn.create_function("djcb_released", 0, self._mark_released)
            conn.executescript(SQL_RELEASE_TRIGGER)
            if self._add_to_int is not None:
                conn.create_function("djcb_incr", 3, self._add_to_int)
            if self._on_count is not None:
                conn.create_function("djcb_count", 2, self._on_count)
                conn.executescript(SQL_COUNT_TRIGGERS)
            if self._on_change is not None:
                conn.create_function("djcb_changed", 1, self._on_change)
                conn.executescript(SQL_CHANGE_TRIGGERS)
        except BaseException:
            conn.close()
            raise
        return conn

    def _place(self, conn: sqlite3.Connection) -> None:
        """The file records its place in the layout in its own SQLite header
        (``application_id``, ``user_version``: see ``layout.shard_place``), so
        that the shard count can be told from the data when the manifest is
        lost; a file that records another place (another layout's shard, or
        another index's file put here) is refused: keys routed to it would
        find another routing's rows. A file that records nothing yet (new, or
        made by an older version) is given its place, in one transaction."""
        want = self._layout.shards << 16 | self.index  # type: ignore[union-attr]
        application = conn.execute(SQL_APPLICATION_ID).fetchone()[0]
        version = conn.execute(SQL_USER_VERSION).fetchone()[0]
        if application == SHARD_APPLICATION_ID and version == want:
            return
        if application == SHARD_APPLICATION_ID and version > 0:
            raise LayoutChanged(
                f"{self.path} records that it is shard {version & 0xFFFF} of a "
                f"{version >> 16}-shard cache, not shard {self.index} of "
                f"{self._layout.shards}: it belongs to another layout")  # type: ignore[union-attr]
        if application not in (0, SHARD_APPLICATION_ID):
            raise DamagedShard(f"{self.path} is not a shard of this cache: another "
                               f"program's database (application id {application})")
        with _immediate(conn):
            conn.execute(SQL_SET_APPLICATION_ID % SHARD_APPLICATION_ID)
            conn.execute(SQL_SET_USER_VERSION % want)

    def _mark_released(self) -> None:
        self._released.any = True

    def take_released(self) -> bool:
        """Did a statement of this thread release a value file since the last
        call (``statements.SQL_RELEASE_TRIGGER``)? Clears the flag."""
        local = self._released
        if getattr(local, "any", False):
            local.any = False
            return True
        return False

    def _ensure_schema(self, conn: sqlite3.Connection) -> None:
        """WAL mode and tables; cheap when already there (one read of sqlite_master)."""
        have = conn.execute(SQL_SCHEMA_PRESENT).fetchone()[0]
        mode = conn.execute(SQL_JOURNAL_MODE).fetchone()[0]
        if have and mode == "wal" and _ours(conn):
            return
        columns = {row[0] for row in conn.execute(SQL_COLUMNS)}
        if columns and not columns | {"blob"} >= SCHEMA_COLUMNS["cache"]:
            # Before anything is written to it (WAL mode alters the header):
            # another program's database, set aside as it is.
            raise DamagedShard(f"{self.path} is not a shard of this cache: its table "
                               "cache has another shape")
        # Many processes may create the same shard at once: the schema is
        # idempotent, and the caller retries on SQLITE_BUSY.
        if mode != "wal":
            conn.execute(SQL_WAL_MODE)
        # One transaction, statement by statement (executescript() would commit
        # at its start): a shard of format 4 gets its ``blob`` column (the only
        # part of SCHEMA that is not idempotent), and every shard the rest.
        with _immediate(conn):
            columns = {row[0] for row in conn.execute(SQL_COLUMNS)}
            if columns and "blob" not in columns:
                conn.execute(SQL_ADD_BLOB_COLUMN)
            if columns and not conn.execute(SQL_SCHEMA_PRESENT).fetchone()[0]:
                # Sealed under the old tags (format 5 or before): unreadable now,
                # and indistinguishable from forgeries. The triggers release
                # their files and blobs, and keep the counts.
                conn.execute(SQL_DROP_OLD_ROWS)
            for statement in SCHEMA_STATEMENTS:
                conn.execute(statement)
            if not _ours(conn):
                raise DamagedShard(f"{self.path} is not a shard of this cache: its tables "
                                   "have another shape")
            if not columns:
                conn.execute(SQL_RECOUNT)  # the table was made now: any counts are stale

    def _create(self) -> None:
        """Create the missing database file (0o600), first removing a stale -wal/-shm.

        We create the file so SQLite (and its -wal/-shm, which copy the mode of
        the database file) never makes it world-readable.

        Why the leftovers go: the database file is always created before its
        -wal/-shm, so a -wal or -shm without it belongs to a file that was
        deleted (possibly still open in other processes). A new file opened
        next to them would take that log and shared index as its own, and
        share them with the connections still on the deleted file. The
        directory's lock makes "still missing, remove, create" one step among
        our processes, so a log just made for a new file is never removed.
        """
        directory = os.path.dirname(self.path) or "."
        fd = os.open(directory, os.O_RDONLY)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                # Another process is creating it (or holds the directory's lock,
                # stopped): busy, like a locked shard, so that the caller's retry
                # policy bounds the wait. A blocking lock would wait for as long
                # as the holder is stopped.
                busy = sqlite3.OperationalError(f"{self.path} is being created elsewhere")
                busy.sqlite_errorcode = SQLITE_BUSY  # type: ignore[attr-defined]
                raise busy from None
            if not os.path.exists(self.path):
                for suffix in ("-wal", "-shm"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self.path + suffix)
                # Value files of a deleted database: no row can name them again.
                self.files.remove_all()
                with contextlib.suppress(FileExistsError):
                    os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        finally:
            os.close(fd)  # releases the lock

    def state(self) -> tuple[FileId | None, tuple[int, int]]:
        """What :meth:`file_id` says, and the bytes of the file and of its
        ``-shm`` now (0 for one that is missing): one ``stat`` of each."""
        try:
            st = os.stat(self.path)
        except OSError:
            ident, size = None, 0
        else:
            ident, size = (st.st_dev, st.st_ino), st.st_size
        try:
            shm = os.stat(self.path + "-shm").st_size
        except OSError:
            shm = 0
        return ident, (size, shm)

    def regrow(self, sizes: tuple[int, int], opened: FileId | None) -> None:
        """Give a file cut from outside its bytes back (zeros), and its ``-shm``
        at least ``sizes[1]``, so that no mapping of either can touch a page
        past their end.

        Why: a page of a mapping past the end of its file kills the process
        that touches it with SIGBUS, whether it reads, checkpoints or closes,
        and every process that maps the shard, not only this one. The file is
        given back as much as any connection may map (``mmap_size``), sparse:
        what was cut is lost anyway, and SQLite finds zeros there (a corrupt
        shard, set aside when read). A ``-shm`` gets its size back, zeroed:
        its header no longer verifies, and SQLite rebuilds it from the log.
        Both only ever grow here: a file that grew again meanwhile is left.
        Only the file ``opened`` (the connection's ``(st_dev, st_ino)``) is
        touched: a new shard another process put at the path is not ours to
        grow, and neither is its ``-shm``.
        """
        for path, size, sparse in ((self.path, max(sizes[0], self._mmap_size), True),
                                   (self.path + "-shm", sizes[1], False)):
            if not size:
                continue
            fd = _kept_descriptor(path)
            if fd is None:
                continue
            try:
                if sparse:
                    st = os.fstat(fd)
                    if (st.st_dev, st.st_ino) != opened:
                        return
                    if st.st_size < size:
                        os.ftruncate(fd, size)
                else:
                    os.posix_fallocate(fd, 0, size)
            except OSError:
                pass  # a full disk: nothing better to do than the reopen that follows

    def file_id(self) -> FileId | None:
        """(device, inode) of the file at ``path`` now, ``None`` if there is none."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def _set_aside_odd(self, mode: int) -> None:
        """The shard's path is a directory, a FIFO, a socket or a device (put there
        by hand, or by a broken tool): no value of the cache can be in it, and
        SQLite fails on it at every call, for good. Move it aside as a corrupt
        file is (nothing deleted) and create the shard again."""
        target = self._aside_name()
        try:
            os.rename(self.path, target)
        except OSError:
            return  # gone meanwhile, or another process moved it: connect as usual
        log_event(logging.ERROR, f"odd{self.index}", "shard %s was not a regular file "
                  "(mode %o); moved aside to %s, a new empty shard replaces it", self.path,
                  mode, target)
        self._create()

    def _aside_name(self) -> str:
        return aside_name(self.path)

    def quarantine(self, opened: FileId | None) -> str | None:
        """Move a corrupt shard file (and its -wal/-shm) aside; return the new name.

        Only if the file at ``path`` is still the one our connection opened:
        another process may already have set it aside and created a fresh
        shard, which must not be moved in turn. Nothing is deleted, so an
        operator can inspect or salvage the file.
        """
        if opened is None or self.file_id() != opened:
            return None
        target = self._aside_name()
        try:
            os.rename(self.path, target)
        except OSError:
            return None
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(OSError):
                os.rename(self.path + suffix, target + suffix)
        self.files.move_aside(target + "-values")
        return target


@contextlib.contextmanager
def _immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """The block as one write transaction (``BEGIN IMMEDIATE``), committed at its
    end or rolled back when it raises."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise


def _ours(conn: sqlite3.Connection) -> bool:
    """Do the shard's tables have every column the engine reads and writes?
    (A table dropped is made again by the schema; one of another shape is not.)"""
    return all({row[0] for row in conn.execute(SQL_TABLE_COLUMNS % table)} >= columns
               for table, columns in SCHEMA_COLUMNS.items())


def ensure_stored_index(conn: sqlite3.Connection) -> None:
    """Create the index on ``stored`` if the shard lacks it; a read when it is there.

    Creating it over a large shard takes as long as a scan and sort of the
    shard, once; it happens only when the configuration changes (see the
    module docstring)."""
    if not conn.execute(SQL_HAS_STORED_INDEX).fetchone()[0]:
        conn.execute(SQL_STORED_INDEX)


def _track_bytes(conn: sqlite3.Connection) -> None:
    """Turn on exact byte counting in this shard (recounted and flagged in one statement,
    so no replacing write slips between the two); a read only when it is already on."""
    if not conn.execute(SQL_BYTES_EXACT).fetchone()[0]:
        conn.execute(SQL_TRACK_BYTES)
