"""Connections per (process, thread, shard): opened lazily, reopened after fork.

Why not close them when Django calls ``cache.close()`` at the end of every
request: opening a shard costs a file open, a schema check and cold page
caches (~0.4 ms a shard, which diskcache pays on every request). A warm
connection is kept for the life of its thread instead.

Why fork needs care: an SQLite connection must not be used by a child process
after ``fork()`` (its locks and file offsets belong to the parent), nor
closed there (closing could act on state the parent still relies on). A
child therefore abandons inherited connections, without closing them, and
opens its own. Fork is detected by a generation counter bumped in
``os.register_at_fork`` rather than a ``getpid()`` system call on every
operation.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Sequence

from .shard import Shard

_fork_generation = 0
# Inherited connections are parked here for the child's whole life: never
# used and never closed (see the module docstring).
_abandoned: list[sqlite3.Connection] = []


def _after_fork_in_child() -> None:
    global _fork_generation
    _fork_generation += 1


os.register_at_fork(after_in_child=_after_fork_in_child)


class ConnectionPool:
    """The calling thread's connection to each shard."""

    def __init__(self, shards: Sequence[Shard]) -> None:
        self._shards = shards
        self._n = len(shards)
        self._local = threading.local()
        # Bumped by close_all(); other threads notice it on their next call
        # and close their own connections there (never from another thread).
        self._epoch = 0

    def _fresh_slots(self) -> tuple[list[sqlite3.Connection | None], list[int | None]]:
        local = self._local
        old = getattr(local, "conns", None)
        if old is not None:
            if getattr(local, "generation", _fork_generation) != _fork_generation:
                _abandoned.extend(c for c in old if c is not None)
            else:
                for c in old:
                    if c is not None:
                        with contextlib.suppress(sqlite3.Error):
                            c.close()
        conns: list[sqlite3.Connection | None] = [None] * self._n
        inodes: list[int | None] = [None] * self._n
        local.conns = conns
        local.inodes = inodes
        local.curs = [None] * self._n
        local.generation = _fork_generation
        local.epoch = self._epoch
        return conns, inodes

    def get(self, index: int) -> sqlite3.Connection:
        """This thread's connection to shard ``index``, opening it if needed."""
        local = self._local
        try:
            conns = local.conns
            if local.generation != _fork_generation or local.epoch != self._epoch:
                raise AttributeError
        except AttributeError:
            conns, _ = self._fresh_slots()
        conn = conns[index]
        if conn is None:
            shard = self._shards[index]
            conn = conns[index] = shard.connect()
            local.inodes[index] = shard.inode()
            local.curs[index] = None
        return conn

    def cursor(self, index: int) -> sqlite3.Cursor:
        """A cursor of this thread's connection to shard ``index``, kept with it.

        Why: ``Connection.execute`` makes a new cursor on every call (and
        registers a weak reference to it); reusing one spares ~0.2 µs of a
        ~4 µs read. Only for statements whose rows are all fetched or that
        return none: a SELECT left half-read would keep its read snapshot
        open until the cursor's next statement.
        """
        conn = self.get(index)  # also (re)builds this thread's slots
        curs = self._local.curs
        cur = curs[index]
        if cur is None:
            cur = curs[index] = conn.cursor()
        return cur

    def opened_inode(self, index: int) -> int | None:
        """The inode of the file this thread's connection to ``index`` opened."""
        inodes = getattr(self._local, "inodes", None)
        if inodes is None:
            return self._shards[index].inode()
        return inodes[index] if inodes[index] is not None else self._shards[index].inode()

    def drop(self, index: int) -> None:
        """Close and forget this thread's connection to one shard (after a fault)."""
        conns = getattr(self._local, "conns", None)
        if conns is None or getattr(self._local, "generation", -1) != _fork_generation:
            return
        conn = conns[index]
        conns[index] = None
        self._local.inodes[index] = None
        self._local.curs[index] = None
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def warm(self) -> int:
        """How many shard connections this thread holds open (for tests and stats)."""
        conns = getattr(self._local, "conns", None)
        if conns is None or getattr(self._local, "generation", -1) != _fork_generation:
            return 0
        return sum(c is not None for c in conns)

    def close_all(self) -> None:
        """Close this thread's connections now and every other thread's on its next use."""
        self._epoch += 1
        self._fresh_slots()
