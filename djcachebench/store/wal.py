"""The bound on each shard's write-ahead log, held by the writers that grow it.

Why SQLite's own mechanisms are not enough: the log is only reset (written
again from its start, and cut to ``journal_size_limit``) when a writer
begins while every frame is checkpointed and no reader is on the log. The
automatic checkpoint after a commit is PASSIVE: it never waits, so under a
few writers that commit without a pause some frame is always newer than
the last checkpoint, and with readers that never pause some reader is
always on the log; it never resets and the file grows by every commit. A
TRUNCATE checkpoint that does not wait fails the same way: a writer's
transaction or a reader's statement is almost always under way.

So a writer looks at the size of the log after every :data:`CHECK_EVERY`
bytes it wrote to a shard (one ``stat``, counted from the sizes of its own
rows, so the hot path gains an addition, never a system call), and when the
log is over :data:`CHECKPOINT_AT` it runs a TRUNCATE checkpoint again and
again, as a writer retries a busy shard (``retry.spin_sleep``), until it
gets through or ``wait`` seconds (the shard set's ``LOCK_TIMEOUT``) have
passed. Each attempt either takes the write lock or leaves it at once
(``busy_timeout`` is 0 for it too): it never holds the lock while it waits
for readers, so other writers go on between its attempts, and once a
reader's statement ends, the next attempt passes it.

Why that bounds the log and not only shortens it: a writer that finds it
too large does not write again until its checkpoint got through or gave
up. Once the log is over :data:`CHECKPOINT_AT`, every writer process stops
at its next look, after at most :data:`CHECK_EVERY` bytes more, so the log
holds at most ``CHECKPOINT_AT + writers * CHECK_EVERY`` plus one commit per
writer while the checkpoints wait, whatever the scheduler does, as long as
no reader keeps its snapshot past ``wait``.

A reader that holds a snapshot for good (a process stopped inside a read)
keeps every checkpoint from passing it, as SQLite defines: then each
writer gives up after ``wait`` (counted in ``checkpoint_give_ups``, logged)
and goes on writing; at its later looks it makes one attempt that does not
wait, and waits again only once an attempt gets further than the one that
gave up (the reader has moved on). So the log grows as it must while the
reader holds on, each writer loses ``wait`` once to it, not at every look,
and the log is reset soon after the reader lets go.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time

from . import forkgate
from .retry import FIRST_SPIN, spin_sleep
from .statements import SQL_CHECKPOINT
from .stats import Stats, log_event

# The log's bound (bytes): ``journal_size_limit``, which cuts the file back
# to it whenever the log is reset (store/shard.py).
WAL_LIMIT = 4 * 1024 * 1024

#: Above this size a writer checkpoints the log before it writes again.
CHECKPOINT_AT = 2 * WAL_LIMIT

#: Bytes of its own writes to a shard after which a writer looks at the log.
CHECK_EVERY = 256 * 1024

#: What one commit adds to the log at least: a page (4 KiB) and its frame header.
COMMIT_BYTES = 4096 + 24


class WalBound:
    """Holds each shard's ``-wal`` to its bound; one per shard set (per process)."""

    def __init__(self, paths: list[str], wait: float, stats: Stats) -> None:
        self._logs = [path + "-wal" for path in paths]
        self._wait = wait
        self._stats = stats
        #: Bytes written to each shard since this process last looked at its log.
        self.unchecked = [0] * len(paths)
        # Per shard, after a give-up: the frames in the log and checkpointed then
        # (None: no give-up since the last checkpoint that got through).
        self._stuck_at: list[tuple[int, int] | None] = [None] * len(paths)

    def look(self, index: int, conn: sqlite3.Connection) -> None:
        """After :data:`CHECK_EVERY` bytes: checkpoint the log if it is over its bound.

        ``conn`` is this process's connection to the shard, out of any
        transaction, inside the fork gate (the caller runs under
        ``StoreCore.run``). May raise ``sqlite3.Error`` (the caller ignores it:
        its write has committed)."""
        self.unchecked[index] = 0
        if self._size(index) <= CHECKPOINT_AT:
            self._stuck_at[index] = None
            return
        stuck_at = self._stuck_at[index]
        if stuck_at is not None:
            # A reader kept the last checkpoint from passing it: one attempt,
            # without waiting, which tells whether it has moved on since (the
            # checkpoint gets further than it did, or the log was reset).
            done, reached = self._truncate(index, conn, 0.0)
            if done:
                self._stuck_at[index] = None
                return
            log, checkpointed = reached
            if log < 0 or (log >= stuck_at[0] and checkpointed <= stuck_at[1]):
                return
        done, reached = self._truncate(index, conn, self._wait)
        if done:
            self._stuck_at[index] = None
            return
        self._stuck_at[index] = reached
        self._stats.checkpoint_give_ups += 1
        log_event(logging.WARNING, f"checkpoint{index}", "a reader kept the log %s from "
                  "being reset for %.3fs; it stays at %d bytes for now", self._logs[index],
                  self._wait, self._size(index))

    def _truncate(self, index: int, conn: sqlite3.Connection,
                  wait: float) -> tuple[bool, tuple[int, int]]:
        """TRUNCATE checkpoints until one gets through, the log is small again
        (another process checkpointed it), or ``wait`` seconds have passed:
        whether it is done, and the frames in the log and checkpointed that the
        last attempt able to look reported ((-1, -1) if none could: another
        connection was checkpointing)."""
        started = time.monotonic()
        deadline = started + wait
        spin = FIRST_SPIN
        reached = (-1, -1)
        while True:
            busy, log, checkpointed = conn.execute(SQL_CHECKPOINT).fetchone()
            if log >= 0:
                reached = (log, checkpointed)
            if not busy or self._size(index) <= CHECKPOINT_AT:
                return True, reached
            if time.monotonic() >= deadline:
                return False, reached
            # Out of the fork gate while it sleeps, as StoreCore.run is between
            # attempts: a fork need not wait for a checkpoint that waits.
            forkgate.leave()
            try:
                spin = spin_sleep(spin, deadline, started)
            finally:
                forkgate.enter_waiting()  # the caller leaves the gate after us

    def _size(self, index: int) -> int:
        try:
            return os.stat(self._logs[index]).st_size
        except OSError:
            return 0
