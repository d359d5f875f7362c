"""Large values in files beside the shard, with the shard's transactions as the truth.

Why files: above a few tens of kilobytes SQLite costs more than the disk. A
value in a table is read through its chain of overflow pages into a buffer
SQLite allocates and then copied into a Python object, and written one WAL
frame per page; a file is one ``read()`` into the result and one
``write()``. The measurements (``bench/large_layouts.py``) are in
docs/benchmarks.md.

How a file stays consistent with its row, whatever process is killed when:

* Every name is new (random; it is the row's *version*), so a file is never
  rewritten in place and a reader never sees a half-replaced value.
* Before a file is written its name is entered in the shard's ``garbage``
  table with the time (``since``): a name in ``garbage`` is a file no row
  may need. The write of the row (one statement) removes the name from
  ``garbage`` by trigger, in the same transaction; so a writer killed before
  or while writing the file leaves a name whose file nobody references, and
  it is reclaimed once older than ``PENDING_AGE``. A writer may be that late
  (stopped, swapped out): pending names are reclaimed only under the shard's
  write lock, and a writer commits its row only after checking, under the
  same lock, that its name is still pending; if it was reclaimed, the writer
  writes the value again under a new name (otherwise a writer stopped past
  ``PENDING_AGE`` would commit a row naming a removed file, and its
  acknowledged value and the one it replaced would both be gone).
* A row that stops naming a file (replaced, deleted, culled, expired,
  cleared) enters the old name in ``garbage`` with ``since = 0``, by trigger,
  in the transaction that changed the row; after the commit the file is
  unlinked and the name removed. A process killed in between leaves the name,
  and the next collection in any process removes the file.
* A name whose file could not be removed (a read-only or immutable directory),
  and a stale pending name (its writer may still be alive, and create the file
  later), stay in ``garbage`` as *tombstones* (``since`` = minus the time they
  were made) and are tried again at later collections: the first until its
  file is gone, the second until then or for ``TOMBSTONE_AGE`` (dropping the
  name instead would leave either file for good).
* A file torn by an operating-system crash (no fsync, as WAL commits with
  ``synchronous=NORMAL``) fails its tag and reads as a miss.

So every file is either named by a live row or listed in ``garbage``, and
``collect`` finds every one that is not needed. What no name covers (a writer
stalled past ``TOMBSTONE_AGE`` as well; files written into a shard whose
database was deleted, by a process that had not noticed yet) is found by
``sweep``, which ``ShardedSQLiteCache.reclaim_files()`` runs: every file under
the shard's directory that no row names and no recent pending name covers.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import shutil
import signal
import sqlite3
import stat
import tempfile
import time
from collections.abc import Callable
from typing import NamedTuple

from .statements import (
    SQL_FILES_NAMED,
    SQL_GARBAGE_DONE,
    SQL_GARBAGE_PENDING,
    SQL_GARBAGE_PENDING_SINCE,
    SQL_GARBAGE_RELEASED,
    SQL_GARBAGE_STALE,
    SQL_GARBAGE_TOMBSTONE,
    SQL_GARBAGE_TOMBSTONES,
    placeholders,
    transaction,
)

# A pending name (a file being written) older than this is taken for a
# writer that died, and its file is removed (seconds).
PENDING_AGE = 600.0
# A tombstone of a stale pending name whose file never appeared is dropped after
# this long: its writer would have had to stall longer still (seconds).
TOMBSTONE_AGE = 86400.0
# Names removed per collection statement.
COLLECT_BATCH = 256
VALUES_DIR = "values"

# What new_name makes. A name read back from a row or from ``garbage`` is used
# only if it is one: whoever can write a shard could otherwise name any path
# ("/srv/app/db.sqlite3", "../../x"), and the file would be read, and unlinked
# once the row is replaced, culled or cleared.
_IS_NAME = re.compile(r"[0-9a-f]{32}\Z").match
# Opening a FIFO or a device planted under a value's name must not block or
# stream: non-blocking, no symlinks followed, and only regular files are read.
_READ_FLAGS = (os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
               | getattr(os, "O_NONBLOCK", 0))


Identity = tuple[int, int, int, int, int]

# Where timestamps are coarse (a clock tick, or a whole second on some file
# systems), a change made within the same tick as the one before keeps the
# change time: there a file is vouched for by identity only once it is older.
SETTLE_NS = 2_000_000_000
# Changes, each after a look at the file, that must all give a new change
# time for the file system to count as fine-grained (fine_change_times).
PROBES = 16

# What a read tells of the identity it returns (FileRead.trust).
UNCHECKED = 0  # nothing: the payload must be hashed, and the identity not remembered
VOUCHABLE = 1  # looked at while nobody could write the file, unchanged through the read
KNOWN = 2  # an identity ``known`` vouched for, unchanged through the read

_F_SETLEASE = getattr(fcntl, "F_SETLEASE", None)
_F_SETSIG = getattr(fcntl, "F_SETSIG", None)


class FileRead(NamedTuple):
    """What :meth:`ValueFiles.read` read: the bytes, the file's identity while
    they were read (``None`` if it changed meanwhile), and what that identity
    is worth (``UNCHECKED``, ``VOUCHABLE`` or ``KNOWN``)."""

    payload: bytes
    ident: Identity | None
    trust: int


def identity(info: os.stat_result) -> Identity:
    """What changes whenever a file's bytes change through a write, a truncation
    or a replacement: device, inode, size, and its modification and change
    times. The change time is set from the clock, which no unprivileged process
    can set back. A shared writable mapping is the exception: once its page is
    writable, stores into it change the bytes and no time; hence
    :func:`look_alone` before an identity is trusted."""
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def settled(ident: Identity, now_ns: int) -> bool:
    """Is the file's last change older than ``SETTLE_NS``? Then any later change
    gets another change time, however coarse the file system's timestamps."""
    return now_ns - ident[4] > SETTLE_NS


_fine_by_device: dict[int, bool] = {}


def fine_change_times(directory: str) -> bool:
    """Does every change made after a look at a file (``fstat``) give it a new
    change time on the file system of ``directory``, however soon it follows?

    Linux 6.13 and later give such timestamps on ext4, XFS, btrfs and tmpfs
    (multigrain timestamps: a time that was looked at is never handed out
    again); elsewhere a change within the same clock tick keeps the time. Found
    by trying: ``PROBES`` changes in a row, each after a look, must each change
    the time (a coarse clock ticks every millisecond or more; the probe takes
    microseconds). Remembered per device; ``False`` if it cannot be tried.
    """
    try:
        device = os.stat(directory).st_dev
    except OSError:
        return False
    found = _fine_by_device.get(device)
    if found is None:
        found = _fine_by_device[device] = _probe(directory)
    return found


def _probe(directory: str) -> bool:
    try:
        fd, path = tempfile.mkstemp(prefix=".probe-", dir=directory)
    except OSError:
        return False
    try:
        os.unlink(path)  # nothing left behind if this process dies here
        for _ in range(PROBES):
            before = os.fstat(fd).st_ctime_ns
            os.write(fd, b".")
            if os.fstat(fd).st_ctime_ns == before:
                return False
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def look_alone(fd: int) -> Identity | None:
    """The identity of ``fd``'s file, taken while no one has it open for writing;
    ``None`` if someone does (or it cannot be told).

    Why: a process holding a shared writable mapping of the file can change
    its bytes without changing its times. Such a mapping keeps the file open
    for writing, and a read lease (``F_SETLEASE``) is refused while anyone
    has it so; while held, the lease stops anyone opening it for writing
    (their ``open`` waits until it is released, microseconds later). After it
    is released, a writer has to open the file again, and its first write,
    through a mapping too, stamps the file with a new change time: from then
    on, the identity taken here is enough to tell the bytes unchanged.

    Not every system allows it (leases off, another owner, a network file
    system): ``None`` then, and the file is hashed at every read, as before.
    A lease broken while held signals the holder; ``SIGURG`` is asked for,
    whose default is to be ignored (``SIGIO``'s would end the process).
    """
    if _F_SETLEASE is None or _F_SETSIG is None:
        return None
    try:
        fcntl.fcntl(fd, _F_SETSIG, signal.SIGURG)
        fcntl.fcntl(fd, _F_SETLEASE, fcntl.F_RDLCK)
    except OSError:
        return None
    try:
        return identity(os.fstat(fd))
    finally:
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, _F_SETLEASE, fcntl.F_UNLCK)



class ValueFiles:
    """The value files of one shard: ``<LOCATION>/values/<shard>/<2 hex>/<name>``."""

    def __init__(self, directory: str, index: int) -> None:
        self.root = os.path.join(directory, VALUES_DIR, f"{index:03d}")
        self._fine_times: bool | None = None

    def path(self, name: str) -> str:
        """The file of ``name``; ``ValueError`` for anything ``new_name`` did not make."""
        if type(name) is not str or not _IS_NAME(name):
            raise ValueError(f"not a value file name: {name!r}")
        return os.path.join(self.root, name[:2], name)

    @staticmethod
    def new_name() -> str:
        return secrets.token_hex(16)

    def register(self, conn: sqlite3.Connection, name: str) -> None:
        """Enter ``name`` as pending before its file exists (see the module docstring)."""
        conn.execute(SQL_GARBAGE_PENDING, (name, time.time()))

    def write(self, name: str, payload: bytes) -> None:
        """Create the file ``name`` (0o600, must not exist) holding ``payload``.

        The writer does not vouch for what it wrote: between its last write and
        a look at the file, another writer could change it within the same
        tick of the clock, unseen. Its first read verifies, as anyone's."""
        path = self.path(name)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(path, flags, 0o600)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            fd = os.open(path, flags, 0o600)
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)

    def _fine(self) -> bool:
        fine = self._fine_times
        if fine is None:
            fine = self._fine_times = fine_change_times(self.root)
        return fine

    def read(self, name: str, size: int,
             known: Callable[[Identity], bool] | None = None) -> FileRead | None:
        """The first ``size`` bytes of file ``name``, with what its identity is
        worth (nothing unless they are the whole file); ``None`` if it is gone
        or shorter, or is not a regular file of
        ours (a bad name, a symlink, a FIFO): ``size`` and ``name`` come from
        the row, which only the tag vouches for, and that is checked after.

        ``known(identity)`` says whether an identity was vouched for (the
        codec's memo and the host's board): then the bytes are taken as they
        are (``KNOWN``) if the identity is the same after the read. Otherwise
        the file is looked at under a lease (:func:`look_alone`), and the
        identity can be vouched for once the bytes verify (``VOUCHABLE``) if
        nobody could write the file, it did not change through the read, and
        any later change will show: the file system's change times are fine
        (:func:`fine_change_times`), or the file has settled."""
        try:
            fd = os.open(self.path(name), _READ_FLAGS)
        except (OSError, ValueError):
            return None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size < size:
                return None  # never allocate what the row claims before the file has it
            before = identity(info)
            if info.st_size != size:
                # A file is written whole, so a row that names a part of it was
                # altered: its bytes are hashed, never taken on the identity of
                # the whole file (verified, and vouched for, whole).
                trust = UNCHECKED
            elif known is not None and known(before):
                trust = KNOWN
            else:
                alone = look_alone(fd)
                if alone is not None and (self._fine() or settled(alone, time.time_ns())):
                    before, trust = alone, VOUCHABLE
                else:
                    trust = UNCHECKED
            data = os.read(fd, size)
            while len(data) < size:  # a read may return less (signals, huge values)
                more = os.read(fd, size - len(data))
                if not more:
                    return None
                data += more
            if identity(os.fstat(fd)) != before:  # changed while read: hash, trust nothing
                return FileRead(data, None, UNCHECKED)
            return FileRead(data, before, trust)
        except (OSError, MemoryError, OverflowError):
            # MemoryError: a row altered to claim a size no process can hold, over
            # a (sparse) file stretched to match, would make get raise it.
            # Unreadable, as a missing file is.
            return None
        finally:
            os.close(fd)

    def unlink(self, name: str) -> bool | None:
        """Remove file ``name``: True if it was there, False if it was not (or the
        name is not one of ours), None if it is there and could not be removed."""
        try:
            os.unlink(self.path(name))
        except (FileNotFoundError, ValueError):  # a bad name names no file of ours
            return False
        except OSError:
            return None
        return True

    def collect(self, conn: sqlite3.Connection, pending_age: float = PENDING_AGE) -> int:
        """Remove the files no row needs: every name released by a row, and every
        pending name older than ``pending_age``. Returns how many names went.

        Released names are never used again, so their files go without a lock.
        Stale pending names go in a write transaction (skipped when the shard is
        busy, or when the caller is inside one of its own), so that a late
        writer's check of its name and this removal cannot interleave."""
        done = self._collect(conn, SQL_GARBAGE_RELEASED, ())
        if not conn.in_transaction and conn.execute(
                SQL_GARBAGE_STALE, (time.time() - pending_age, 1)).fetchone() is not None:
            with transaction(conn):
                done += self._collect(conn, SQL_GARBAGE_STALE, (time.time() - pending_age,),
                                      stale=True)
        return done + self._retry_tombstones(conn)

    def _collect(self, conn: sqlite3.Connection, due: str, args: tuple,
                 stale: bool = False) -> int:
        """Remove the files of the names ``due`` selects, then the names; a name
        whose file stays (or, ``stale``, whose late writer may yet create it)
        becomes a tombstone instead."""
        done = 0
        while True:
            names = [r[0] for r in conn.execute(due, (*args, COLLECT_BATCH))]
            if not names:
                return done
            gone, kept = [], []
            for name in names:
                removed = self.unlink(name)
                (kept if stale or removed is None else gone).append(name)
            # Unlinked before the names go: a process killed in between leaves
            # names whose files are gone, which the next collection skips.
            if gone:
                conn.execute(SQL_GARBAGE_DONE % placeholders(gone), gone)
            if kept:
                conn.execute(SQL_GARBAGE_TOMBSTONE % placeholders(kept),
                             (-time.time(), *kept))
            done += len(gone)
            if len(names) < COLLECT_BATCH:
                return done

    def _retry_tombstones(self, conn: sqlite3.Connection) -> int:
        """Try the tombstones' files again: a name goes once its file was removed,
        or, never having appeared, after ``TOMBSTONE_AGE``."""
        rows = conn.execute(SQL_GARBAGE_TOMBSTONES, (COLLECT_BATCH,)).fetchall()
        if not rows:
            return 0
        now = time.time()
        gone = []
        for name, since in rows:
            removed = self.unlink(name)  # True: removed; False: not there; None: still stuck
            if removed or (removed is False and now + since > TOMBSTONE_AGE):
                gone.append(name)
        if gone:
            conn.execute(SQL_GARBAGE_DONE % placeholders(gone), gone)
        return len(gone)

    def sweep(self, conn: sqlite3.Connection, pending_age: float = PENDING_AGE) -> int:
        """Remove every file under the shard's directory that no row names and
        no name pending for less than ``pending_age`` covers, if it is older than
        that too. Reads every row that names a file, in a write transaction (no
        row naming a file can commit meanwhile): a maintenance call, not one for
        the request path. Returns how many files went."""
        cutoff = time.time() - pending_age
        removed = 0
        with transaction(conn):
            named = {r[0] for r in conn.execute(SQL_FILES_NAMED)}
            named.update(r[0] for r in conn.execute(SQL_GARBAGE_PENDING_SINCE, (cutoff,)))
            try:
                folders = [e.path for e in os.scandir(self.root)
                           if e.is_dir(follow_symlinks=False)]
            except OSError:
                return 0
            for folder in folders:
                with contextlib.suppress(OSError), os.scandir(folder) as entries:
                    for entry in entries:
                        if (not _IS_NAME(entry.name) or entry.name in named
                                or entry.name[:2] != os.path.basename(folder)):
                            continue
                        with contextlib.suppress(OSError):
                            if entry.stat(follow_symlinks=False).st_mtime <= cutoff:
                                removed += self.unlink(entry.name) is True
        return removed

    def remove_all(self) -> None:
        """Remove every value file of the shard (its database file was deleted)."""
        shutil.rmtree(self.root, ignore_errors=True)

    def move_aside(self, target: str) -> None:
        """Move the shard's files next to its quarantined database (nothing deleted)."""
        with contextlib.suppress(OSError):
            os.rename(self.root, target)
