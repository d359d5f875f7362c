"""The generation table's file: created, mapped, and kept whole under every process.

Why apart from the protocol (``table.py``): what a slot means and how stamps
are ordered is one job; keeping a shared mapping safe to touch is another, with
its own failure modes. A file another process or a person can truncate,
overwrite, delete or replace must never kill a process with ``SIGBUS`` nor let
an entry read under the damaged file be served. So the file is allocated for
real before it is mapped, its size, header and identity are checked before
every stamp and every fill (at most every :data:`CHECK_EVERY`), a truncated or
overwritten file is repaired with an epoch bump, a deleted or replaced one is
left for the file now at the path (the old mapping's epoch bumped), and what
cannot be repaired turns the table off (``usable``) rather than fail a request.
Opening and mapping a file is ``table_mapping.py``'s; telling a clock step, ``clock.py``'s.

This module imports nothing from Django.
"""

from __future__ import annotations

import logging
import mmap
import os
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Self

from djcachebench.coherence.clock import WallClockWatch
from djcachebench.coherence.layout import (
    EPOCH_AT,
    FORMAT,
    HEAD,
    HEADER,
    MAGIC,
    SLOT,
    U64,
    file_size,
    rewrite_header,
)
from djcachebench.coherence.registry import own_descriptor
from djcachebench.coherence.shared_file import (
    allocate,
    fork_safe_lock,
    lock_range,
    refused_now,
    unlock_range,
)
from djcachebench.coherence.table_mapping import map_again, map_table_file, private_mapping
from djcachebench.coherence.tokens import tokens

__all__ = ["CHECK_EVERY", "SETTLE_AFTER_MAPPING", "STAMP_LOCK", "STAMP_WAIT", "TableFile",
           "TableStats"]

log = logging.getLogger("djcachebench.coherence")

#: How long a stamp waits for a slot's lock before it gives up and bumps the
#: epoch instead. Holders keep the lock for microseconds; only a stopped or
#: starved holder makes anyone wait this long.
STAMP_WAIT: Final = 0.05
#: How long a passed :meth:`TableFile.check` stands (seconds).
CHECK_EVERY: Final = 0.002
#: How long after this process maps a table file it keeps nothing read or written
#: under it (``keep_after``): at least :data:`CHECK_EVERY`, the time a writer may go
#: on stamping a file that was replaced without having looked (docs/architecture.md,
#: "A table file replaced while processes run").
SETTLE_AFTER_MAPPING: Final = CHECK_EVERY
#: How often a process looks again at the directories above its table file
#: (``_same_file``): a walk of the path, one ``lstat`` per component.
VET_EVERY: Final = 1.0
_monotonic = time.monotonic

#: Serialises the stamps of this process (POSIX record locks only exclude other
#: processes). Also held while the descriptor changes (close, switch): closing
#: any descriptor of a file drops this process's record locks on it.
STAMP_LOCK: Final = fork_safe_lock()
#: Serialises this process's moves to another file (:meth:`TableFile._switch`,
#: :meth:`TableFile._adopt`); each looks again under it. Two threads whose
#: checks both saw the file replaced each opened the new one, and the second
#: closed the first's descriptor of it as "the old one": with it went the
#: record lock a stamp of a third thread held through the other descriptor
#: (closing any descriptor of a file drops all of the process's record locks
#: on it), so another process stamped the slot at the same time and a writer
#: kept its value under a token the other's later write should have ended.
MOVE_LOCK: Final = fork_safe_lock()


@dataclass
class TableStats:
    """Per-process counts of the table's faults (``TieredCache.stats()`` shows them)."""

    lock_give_ups: int = 0  # a stamp could not get its slot's lock in time: epoch bumped
    repairs: int = 0  # a truncated or overwritten file was repaired (epoch bumped)
    faults: int = 0  # the file could not be repaired: the table is unusable
    clock_steps: int = 0  # the wall clock jumped: epoch bumped


class TableFile:
    """The mapping of one generation table file, checked and repaired.

    ``path`` is created if missing (mode 0o600, parent directories 0o700) and
    opened otherwise. ``slots`` only matters to the process that creates the
    file: everyone else uses the count in the file, because processes that
    disagreed on it would look at different slots.
    """

    __slots__ = ("__weakref__", "_check_at", "_checked_size", "_claims", "_clock", "_closer", "_fd",
                 "_file_id", "_ident", "_mm", "_pending", "_vetted", "guard", "keep_after",
                 "outlet", "path", "slots", "stats", "usable")

    def __init__(self, path: str, slots: int = 1 << 16) -> None:
        if slots < 1 or slots > 1 << 32:
            raise ValueError(f"slots must be between 1 and 2**32, got {slots}")
        self.path = path
        self.stats = TableStats()
        self.usable = True
        #: The cross-host transport's seams (None on one host): ``guard()`` says
        #: whether L1 entries may be served now (:meth:`serving`); ``outlet(key)``
        #: is told of each stamp this process makes (``None``: all of them).
        self.guard: Callable[[], bool] | None = None
        self.outlet: Callable[[str | None], None] | None = None
        #: Header words this process relies on (``WATCHED_AT``, ``STAMPER_AT``):
        #: set again in any file it moves to (:meth:`_switch`, :meth:`_adopt`).
        self._claims: set[int] = set()
        self._pending = False
        mapped, rebuilt = map_table_file(path, slots)
        self.stats.repairs += rebuilt
        self._fd = mapped.fd  # kept open for the stamp locks and the size checks
        self._closer: weakref.finalize | None = own_descriptor(self, mapped.fd)
        self._file_id: tuple[int, int] | None = mapped.file_id
        self._check_at = 0.0
        # (change time, next look at the directories) of the last acceptable look.
        self._vetted: tuple[int, float] = (-1, 0.0)
        self._clock = WallClockWatch()
        self._mm = mapped.mm
        #: Nothing read or written before this ``time.monotonic()`` is kept under
        #: this file (``tiered.state.locate_for_l1``): see :data:`SETTLE_AFTER_MAPPING`.
        self.keep_after = _monotonic() + SETTLE_AFTER_MAPPING
        self._checked_size = file_size(mapped.slots)
        self.slots = mapped.slots
        # Tables of one file share chains (the L2's own instance and the adapter's).
        self._ident: object = os.path.realpath(path)

    @classmethod
    def pending(cls, path: str, slots: int, why: object) -> Self:
        """A table whose file cannot be had now (a full disk, a file that is not a
        table, a FIFO or a directory at its path): unusable, so no L1 keeps
        anything under it, until a check finds a table file it can use
        (:meth:`_adopt`). Logged.

        Why not refuse: the cache's construction is part of a request, and the
        file is shared state that anything on the host can damage; the L2 itself
        is fine. Why it is sound to write without stamping meanwhile: a writer
        of this process checks after each commit (``check``, in its stamp), so
        a table that another process made usable before that commit is adopted
        and stamped; and it can only be usable for another process of this
        user if it is for this one too.
        """
        table = cls._without_file(slots, path, pending=True)
        U64.pack_into(table._mm, EPOCH_AT, tokens.next())
        table._ident = os.path.realpath(path)
        table._check_at = 0.0
        table.stats = TableStats(faults=1)
        table.usable = False
        log.error("%s: cannot use the generation table (%s); TieredCache L1s over it are "
                  "off until it can be", path, why)
        return table

    @classmethod
    def in_process(cls, slots: int = 1 << 16) -> Self:
        """A table private to this process (``COHERENCE="none"``).

        Anonymous and ``MAP_PRIVATE``: a forked child gets a copy-on-write copy
        and the two never see each other's stamps, exactly like two processes
        that were started separately. Anonymous memory cannot be truncated.
        """
        # One process: the thread lock is enough.
        table = cls._without_file(slots, "", pending=False)
        table._ident = table
        table._check_at = float("inf")  # anonymous memory: nothing to check, ever
        table.stats = TableStats()
        table.usable = True
        return table

    @classmethod
    def _without_file(cls, slots: int, path: str, pending: bool) -> Self:
        """The fields :meth:`pending` and :meth:`in_process` share: private
        memory (:func:`private_mapping`), no descriptor (``_fd`` -1), no claims."""
        table = cls.__new__(cls)
        table._mm = private_mapping(slots)
        table.slots = slots
        table.path = path
        table._fd = -1
        table._closer = None
        table._checked_size = file_size(slots)
        table._clock = WallClockWatch()
        table._vetted = (-1, 0.0)
        table._file_id = None
        table._claims = set()
        table._pending = pending
        # In-process: no other process maps it. Pending: set when a file is adopted.
        table.keep_after = 0.0
        table.guard = table.outlet = None
        return table

    # --- the guard of every slow path ------------------------------------------

    def check(self) -> bool:
        """Is the mapped file still whole? Repairs it if it can; False if unusable.

        Called before every stamp and every L1 fill: a truncated file is
        re-extended (its lost slots read as 0, a token nobody holds) and an
        overwritten header is rewritten, each with an epoch bump, so that no
        entry read under the damaged file is served. One ``lseek``, at most
        once per :data:`CHECK_EVERY` in a process: one write calls this several
        times, and each system call is a measurable share of a write.
        """
        if self._fd < 0:
            return self._adopt() if self._pending else True
        now = _monotonic()
        if now < self._check_at and self.usable:
            return True
        # Nothing is served on this check's say-so before it has passed, guard
        # included: a deadline set first would let another thread serve a hit
        # in between, up to CHECK_EVERY after the guard stopped passing.
        self._check_at = 0.0
        try:
            size = os.lseek(self._fd, 0, os.SEEK_END)  # the size, cheaper than fstat
        except OSError:
            return self._fault("cannot read the table's size", 0)
        if size == self._checked_size and HEAD.unpack_from(self._mm, 0) == (
                MAGIC, FORMAT, SLOT, self.slots):
            st = self._stat()
            if st is None or (st.st_dev, st.st_ino) != self._file_id:
                if not self._switch():
                    return False
            elif self._refused(st):
                self.stats.faults += self.usable
                self.usable = False
                return False
            else:
                if not self.usable and self._vetted[0] >= 0:
                    # Acceptable again after a refusal: processes refused meanwhile
                    # wrote unstamped, so nothing read before is current.
                    U64.pack_into(self._mm, EPOCH_AT, tokens.next())
                self.usable = True
        elif not self._repair(size):
            return False
        if self._clock.stepped():
            # Every expiry on the host was computed on the clock before the
            # step: no entry read under it, nor any board value, is served.
            U64.pack_into(self._mm, EPOCH_AT, tokens.next())
            self.stats.clock_steps += 1
            log.warning("%s: the wall clock stepped; every L1 entry on the host is now "
                        "stale", self.path)
        if self.guard is None or self.guard():
            self._check_at = now + CHECK_EVERY
        # else every L1 hit comes back here until the guard passes
        return True

    def confirm(self) -> bool:
        """Is the file this process maps the one at ``path`` *now*? Uncached: one
        ``stat``. If not, the check runs and moves to the file at the path
        (:meth:`_switch`, which ends every token of both files) and this
        returns False.

        Why :meth:`check` is not enough at these two points: it stands for
        :data:`CHECK_EVERY`, and inside that window the file may be deleted and
        made again by another process. A writer that stamped the deleted file
        would then leave the readers of the new one serving the value it
        replaced, for good if it wrote nothing more; a reader that filled under
        the deleted file would keep a value no later writer (on the new file)
        could end. So a writer confirms after its stamp
        (or its decision not to stamp) and a reader confirms after its L2 read,
        before it keeps what it read: whichever of the two comes second sees the
        replacement and ends the other's tokens. What stays is documented in
        ``docs/architecture.md``: an entry read under a file that is deleted
        before a writer that never mapped it writes may be served until the
        reader's next check, at most ``CHECK_EVERY`` later.
        """
        if self._fd < 0:
            if not self._pending:
                return True  # in-process: nothing at any path
            self._adopt()  # a new mapping either way: nothing read before counts
            return False
        if self._same_file():
            return True
        self._check_at = 0.0
        self.check()
        return False

    def serving(self) -> bool:
        """May L1 entries read under this table be served now? False while the
        cross-host guard (``guard``) says this host may have missed invalidations;
        the file's own health is :meth:`check`'s. While it is False, ``check``
        keeps ``_check_at`` at 0, so every hit asks again."""
        guard = self.guard
        return guard is None or bool(guard())

    def _stat(self) -> os.stat_result | None:
        try:
            return os.stat(self.path)
        except OSError:
            return None

    def _same_file(self) -> bool:
        """Is the file at ``path`` still the one this process mapped?"""
        st = self._stat()
        return st is not None and (st.st_dev, st.st_ino) == self._file_id

    def _refused(self, st: os.stat_result) -> bool:
        """Would a process opening the file (``st``: the check's own ``stat``) now refuse it
        (``shared_file.refused_now``)? Then it writes without stamping, and
        nothing read under this mapping may be served: the table is unusable,
        without a write to it (a write to the mapping of an immutable file
        raises SIGBUS), until the file is acceptable again, when the epoch moves.
        Its owner, mode and write access are looked at again when its change
        time moves (``chmod`` and ``chattr`` move it), the directories above it
        at most every :data:`VET_EVERY`."""
        now = _monotonic()
        if st.st_ctime_ns == self._vetted[0] and now < self._vetted[1]:
            return False
        problem = refused_now(self.path, st, ancestry=now >= self._vetted[1])
        if problem is not None:
            if self.usable:
                log.error("%s would be refused by a process opening it now (%s): L1s "
                          "using it are off until it is acceptable again", self.path, problem)
            self._vetted = (-1, 0.0)
            return True
        self._vetted = (st.st_ctime_ns,
                        now + VET_EVERY if now >= self._vetted[1] else self._vetted[1])
        return False

    def claim(self, word: int) -> None:
        """Set the header word at ``word`` (``WATCHED_AT``, ``STAMPER_AT``) to 1,
        in this file and in every file this process moves to later: a table made
        again after its file was deleted must still say that readers rely on it
        (else writers that skip stamps while nobody watches would skip them)."""
        self._claims.add(word)
        if self.check() and not U64.unpack_from(self._mm, word)[0]:
            U64.pack_into(self._mm, word, 1)

    def _adopt(self) -> bool:
        """A pending table (:meth:`pending`): try the file at ``path`` now. On
        success the table is this file's from now on, with a new epoch (this
        process wrote unstamped meanwhile); else still unusable (True/False)."""
        with MOVE_LOCK:
            if self._pending and not self._adopt_locked():
                return False
        return self.check()

    def _adopt_locked(self) -> bool:
        try:
            fd, mm, file_id, _ = map_again(self.path, self.slots, self._mm, self._claims)
        except (OSError, ValueError):
            return False
        U64.pack_into(self._mm, EPOCH_AT, tokens.next())  # nothing read under it stays current
        U64.pack_into(mm, EPOCH_AT, tokens.next())
        with STAMP_LOCK:
            self._fd, self._mm = fd, mm
            self._closer = own_descriptor(self, fd)
            self._file_id = file_id
            self._pending = False
            self.keep_after = _monotonic() + SETTLE_AFTER_MAPPING
        self.stats.repairs += 1
        self.usable = True
        self._check_at = 0.0
        log.warning("%s: the generation table can be used again", self.path)
        return True

    def _switch(self) -> bool:
        """The file was deleted or replaced under this process: move to the one
        at ``path`` now (creating it if it is gone), so that this process's stamps
        reach the processes that opened the new file, and bump the epoch of the
        old mapping so that nothing read under it is served again. The old
        mapping stays open (instances may still hold it; every token in it is
        stale now). Counted as a repair, logged.
        """
        with MOVE_LOCK:
            if self._same_file():
                return True  # another thread of this process moved first
            return self._switch_locked()

    def _switch_locked(self) -> bool:
        U64.pack_into(self._mm, EPOCH_AT, tokens.next())
        try:
            fd, mm, file_id, _ = map_again(self.path, self.slots, self._mm, self._claims)
        except (OSError, ValueError) as exc:
            return self._fault(f"the table file was replaced and cannot be used: {exc}",
                               self._checked_size)
        old = self._mm
        with STAMP_LOCK:
            old_closer, self._closer = self._closer, own_descriptor(self, fd)
            self._fd, self._mm = fd, mm
            self._file_id = file_id
            self.keep_after = _monotonic() + SETTLE_AFTER_MAPPING
        # Again, now that nobody can take a token from it: a reader of another
        # thread may have taken one after the first bump, and would have kept
        # its value under a mapping nobody stamps any more (readers also refuse
        # tokens whose epoch is not the current mapping's,
        # ``TieredCache._get_through``).
        U64.pack_into(old, EPOCH_AT, tokens.next())
        if old_closer is not None:
            old_closer()  # closes the old descriptor
        # Our tokens were taken from the old file: make sure none matches the new one.
        U64.pack_into(mm, EPOCH_AT, tokens.next())
        self.stats.repairs += 1
        self.usable = True
        log.warning("%s was deleted or replaced under this process; now using the file at "
                    "that path (every L1 entry read before is stale)", self.path)
        return True

    def _repair(self, size: int) -> bool:
        expected = self._checked_size
        if not lock_range(self._fd, HEADER, 0, time.monotonic() + STAMP_WAIT):
            return self._fault("the header is locked by a stopped or busy process", size)
        try:
            size = os.fstat(self._fd).st_size
            if size < expected:
                os.ftruncate(self._fd, expected)
            allocate(self._fd, expected)
            if size != expected or HEAD.unpack_from(self._mm, 0) != (
                    MAGIC, FORMAT, SLOT, self.slots):
                self.stats.repairs += 1
                rewrite_header(
                    self._fd, self.slots,
                    f"{self.path}: the table was truncated to {size} bytes or its header "
                    f"overwritten; repaired it, every L1 entry on the host is now stale")
        except OSError as exc:
            return self._fault(f"repair failed: {exc}", os.fstat(self._fd).st_size)
        finally:
            unlock_range(self._fd, HEADER, 0)
        self.usable = True
        return True

    def _fault(self, why: str, size: int) -> bool:
        """The table cannot be trusted now: L1s using it go off. The epoch is
        still bumped when the header's page is there, so that a writer that
        cannot stamp its slot still makes every older L1 entry unservable."""
        if size >= mmap.PAGESIZE:
            U64.pack_into(self._mm, EPOCH_AT, tokens.next())
        if self.usable:
            log.error("%s: %s; TieredCache L1s using it are off until it can be repaired",
                      self.path, why)
        self.stats.faults += 1
        self.usable = False
        return False

    @property
    def buffer(self) -> mmap.mmap:
        """The mapped table, read-only use: see :data:`TOKEN`."""
        return self._mm

    def close(self) -> None:
        """Unmap the table; the file stays for the other processes."""
        with STAMP_LOCK:
            if self._closer is not None:
                self._closer()
            self._fd = -1
            self._mm.close()
