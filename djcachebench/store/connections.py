"""Connections per (process, thread, shard): opened lazily, reopened after fork.

Why not close them when Django calls ``cache.close()`` at the end of every
request: opening a shard costs a file open, a schema check and cold page
caches, many times a read (diskcache pays it on every request). A warm
connection is kept for the life of its thread instead.

Why fork needs care: an SQLite connection must not be used by a child process
after ``fork()`` (its locks and file offsets belong to the parent), nor
closed there (closing could act on state the parent still relies on). A
child therefore abandons inherited connections, without closing them, and
opens its own. Fork is detected by a generation counter bumped in
``os.register_at_fork`` rather than a ``getpid()`` system call on every
operation.

Why connections check their file: a connection keeps the inode it opened. If
the shard file is deleted (or replaced) under a running process, SQLite goes
on reading and writing the deleted inode, so that process would serve the old
values and never see what others write to the new file. At most every
``FILE_CHECK_INTERVAL`` seconds, each thread compares the (device, inode) its
connections opened with what the path names now, and reopens those that
differ; the caller is told (``on_replaced``) so it can count it and make L1
copies of the old file's values unservable. A clock read per operation is
the whole cost on the hot path; the ``stat()`` calls are once per interval.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence

from . import forkgate
from .layout import LayoutChanged, LayoutGuard
from .shard import FileId, Shard

_fork_generation = 0
# Inherited connections (and their cursors) are parked here for the child's
# whole life: never used and never closed (see the module docstring).
_abandoned: list[sqlite3.Connection | sqlite3.Cursor] = []
# How often (seconds) a thread checks that its connections' files are still
# the ones at the shards' paths (see the module docstring).
FILE_CHECK_INTERVAL = 1.0
_monotonic = time.monotonic


def _after_fork_in_child() -> None:
    global _fork_generation
    _fork_generation += 1


os.register_at_fork(after_in_child=_after_fork_in_child)


class _Held:
    """One thread's connections and cursors, closed through the fork gate when
    the thread ends (or abandoned, in a forked child).

    Why: a thread that ends drops its thread-local state, and the sqlite3
    module closes a connection it frees (and resets its cursors' statements)
    with the GIL released, inside SQLite. Done there, outside the fork gate, a
    fork at that moment would copy SQLite's mutexes locked into the child, whose
    first SQLite call would then block for good (children of a process whose
    short-lived threads use the cache could hang). This
    object holds the only other references to the lists, so it is freed last
    and closes them itself, inside the gate.

    In a forked child the other threads' states are cleared before any
    ``after_in_child`` hook runs, so the fork generation cannot tell yet: the
    process id does. Inherited connections are never closed, only parked.
    """

    __slots__ = ("conns", "curs", "pid")

    def __init__(self, conns: list[sqlite3.Connection | None],
                 curs: list[sqlite3.Cursor | None]) -> None:
        self.conns = conns
        self.curs = curs
        self.pid = os.getpid()

    def close(self, index: int | None = None) -> None:
        """Close one connection (``index``) or all of them; the caller is inside
        the fork gate. Cursors first: freeing one resets its statement."""
        indexes = range(len(self.conns)) if index is None else (index,)
        for i in indexes:
            self.curs[i] = None
            conn, self.conns[i] = self.conns[i], None
            if conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()

    def abandon(self) -> None:
        """Keep them for the process's life, unused and unclosed (a forked child)."""
        _abandoned.extend(c for c in self.conns if c is not None)
        _abandoned.extend(c for c in self.curs if c is not None)
        self.conns[:] = [None] * len(self.conns)
        self.curs[:] = [None] * len(self.curs)

    def __del__(self) -> None:
        if not any(c is not None for c in self.conns):
            return
        if os.getpid() != self.pid:
            self.abandon()
            return
        if not forkgate.try_enter():
            # A fork is under way, and this may run in a thread the fork waits
            # for, or in the forking thread (the garbage collector frees cache
            # instances, which are cycles, wherever it runs): waiting here
            # would stall that fork, or hang it for good. The next call
            # through the gate closes them.
            held = _Held.__new__(_Held)
            held.conns, held.curs, held.pid = self.conns, self.curs, self.pid
            _deferred.append(held)
            return
        try:
            self.close()
        finally:
            forkgate.leave()


# Connections whose thread ended (or whose pool was freed) during a fork: closed
# by the next call inside the gate (``ConnectionPool.get``).
_deferred: list[_Held] = []


def _close_deferred() -> None:
    """Inside the gate: close what finalizers could not close during a fork."""
    while _deferred:
        held = _deferred.pop()
        if held.pid != os.getpid():
            held.abandon()
        else:
            held.close()


class ConnectionPool:
    """The calling thread's connection to each shard."""

    def __init__(
        self, shards: Sequence[Shard], on_replaced: Callable[[int], None] | None = None,
        layout: LayoutGuard | None = None, on_interval: Callable[[], None] | None = None,
    ) -> None:
        self._shards = shards
        self._layout = layout
        self._n = len(shards)
        self._local = threading.local()
        # Bumped by close_all(); other threads notice it on their next call
        # and close their own connections there (never from another thread).
        self._epoch = 0
        self._on_replaced = on_replaced
        # Called with each file check (at most every FILE_CHECK_INTERVAL per
        # thread): the periodic work of others rides on it (host-wide stats).
        self._on_interval = on_interval

    def _fresh_slots(self) -> tuple[list[sqlite3.Connection | None], list[FileId | None]]:
        local = self._local
        old: _Held | None = getattr(local, "held", None)
        if old is not None:
            if (getattr(local, "generation", _fork_generation) != _fork_generation
                    or old.pid != os.getpid()):
                old.abandon()
            else:
                old.close()  # the caller is inside the fork gate
        conns: list[sqlite3.Connection | None] = [None] * self._n
        files: list[FileId | None] = [None] * self._n
        curs: list[sqlite3.Cursor | None] = [None] * self._n
        local.conns = conns
        local.files = files
        local.curs = curs
        local.held = _Held(conns, curs)
        # Per connection: the sizes of its file and -shm when last checked
        # (see check_files).
        local.sizes = [(0, 0)] * self._n
        local.generation = _fork_generation
        local.epoch = self._epoch
        local.check_at = _monotonic() + FILE_CHECK_INTERVAL
        return conns, files

    def get(self, index: int) -> sqlite3.Connection:
        """This thread's connection to shard ``index``, opening it if needed."""
        local = self._local
        try:
            conns = local.conns
            if local.generation != _fork_generation or local.epoch != self._epoch:
                raise AttributeError
        except AttributeError:
            conns, _ = self._fresh_slots()
        if _monotonic() >= local.check_at:
            self.check_files()
        if _deferred:
            _close_deferred()
        conn = conns[index]
        if conn is None:
            shard = self._shards[index]
            conn = conns[index] = shard.connect()
            local.files[index], local.sizes[index] = shard.state()
            local.curs[index] = None
        return conn

    def cursor(self, index: int) -> sqlite3.Cursor:
        """A cursor of this thread's connection to shard ``index``, kept with it.

        Why: ``Connection.execute`` makes a new cursor on every call (and
        registers a weak reference to it), a real share of a short read; reusing
        one spares that. Only for statements whose rows are all fetched or that
        return none: a SELECT left half-read would keep its read snapshot
        open until the cursor's next statement.

        The checks of :meth:`get` are repeated here inline: the clock read of
        the file check then replaces a Python call instead of adding to it.
        """
        local = self._local
        try:
            if (
                local.generation == _fork_generation
                and local.epoch == self._epoch
                and _monotonic() < local.check_at
            ):
                cur = local.curs[index]
                if cur is not None:
                    return cur
        except AttributeError:
            pass
        conn = self.get(index)  # also (re)builds this thread's slots
        curs = self._local.curs
        cur = curs[index]
        if cur is None:
            cur = curs[index] = conn.cursor()
        return cur

    def check_files(self) -> list[int]:
        """Reopen this thread's connections whose file is no longer at the shard's
        path, or was cut short; first, see that the directory still holds this
        process's layout (``LayoutGuard.confirm``: ``LayoutChanged`` if not,
        with every connection of this thread dropped).

        Returns the shards reopened. Called by :meth:`get` at most every
        ``FILE_CHECK_INTERVAL`` seconds; callable directly (tests, slow paths).
        A connection is closed, not abandoned: SQLite sees that its file was
        unlinked or renamed and then neither checkpoints nor deletes the
        ``-wal``/``-shm`` names, which may by now belong to the new file.

        Why a file that shrank is reopened: SQLite maps the ``-shm`` always,
        and the file itself when ``MMAP_SIZE`` is set; a page of a mapping
        past the end of a file that was cut under it kills the process with
        SIGBUS when touched. Neither file ever shrinks by
        SQLite's or this engine's doing (no VACUUM, and the ``-shm`` keeps its
        size), so a smaller one was cut from outside: it is given its bytes
        back (``Shard.regrow``) before anything touches the mapping again, and
        the connection is reopened. What is cut between two checks can still
        be touched: the bound is ``FILE_CHECK_INTERVAL`` (docs/settings.md,
        "What a failure looks like").
        """
        local = self._local
        conns = getattr(local, "conns", None)
        local.check_at = _monotonic() + FILE_CHECK_INTERVAL
        if self._on_interval is not None:
            self._on_interval()
        if conns is None or getattr(local, "generation", -1) != _fork_generation:
            return []
        if self._layout is not None:
            try:
                self._layout.confirm()
            except LayoutChanged:
                # Keys are routed by a count the directory no longer has: no
                # connection of this thread may serve another call.
                for index, conn in enumerate(conns):
                    if conn is not None:
                        self._drop(index)
                raise
        replaced = []
        for index, conn in enumerate(conns):
            if conn is None:
                continue
            shard = self._shards[index]
            opened = local.files[index]
            ident, sizes = shard.state()
            if ident != opened:  # another file now: ours was not cut
                self._drop(index)
                replaced.append(index)
                continue
            was = local.sizes[index]
            if sizes[0] < was[0] or sizes[1] < was[1]:
                shard.regrow(was, opened)  # before the close below touches a mapping
                self._drop(index)
                replaced.append(index)
                continue
            local.sizes[index] = sizes
        if replaced and self._on_replaced is not None:
            for index in replaced:
                self._on_replaced(index)
        return replaced

    def opened_file(self, index: int) -> FileId | None:
        """The (device, inode) of the file this thread's connection to ``index`` opened."""
        files = getattr(self._local, "files", None)
        if files is None or files[index] is None:
            return self._shards[index].file_id()
        return files[index]

    def drop(self, index: int) -> None:
        """Close and forget this thread's connection to one shard (after a fault),
        through the fork gate (the caller is outside it)."""
        forkgate.enter_waiting()
        try:
            self._drop(index)
        finally:
            forkgate.leave()

    def _drop(self, index: int) -> None:
        """:meth:`drop`, for a caller inside the fork gate."""
        local = self._local
        held: _Held | None = getattr(local, "held", None)
        if held is None or getattr(local, "generation", -1) != _fork_generation:
            return
        local.files[index] = None
        local.sizes[index] = (0, 0)
        held.close(index)

    def warm(self) -> int:
        """How many shard connections this thread holds open (for tests and stats)."""
        conns = getattr(self._local, "conns", None)
        if conns is None or getattr(self._local, "generation", -1) != _fork_generation:
            return 0
        return sum(c is not None for c in conns)

    def release(self) -> None:
        """The pool's owner is gone: close the calling thread's connections now.

        Why: a cache instance's store is a reference cycle, freed only by a full
        collection, and until then every thread that used it would keep its shard
        connections (two descriptors each): instances made and dropped in a
        thread that lives on (asgiref's executor thread, a worker pool) would
        pile up hundreds of descriptors between collections. Other threads'
        connections close when those threads end or
        the pool is collected. Never waits: during a fork (this may run in the
        collector, in the forking thread) it leaves them to that collection.
        """
        held: _Held | None = getattr(self._local, "held", None)
        if held is None or held.pid != os.getpid() or not forkgate.try_enter():
            return
        try:
            held.close()
        finally:
            forkgate.leave()

    def close_all(self) -> None:
        """Close this thread's connections now and every other thread's on its next use."""
        self._epoch += 1
        forkgate.enter_waiting()
        try:
            self._fresh_slots()
        finally:
            forkgate.leave()
