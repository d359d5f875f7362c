"""The cross-process generation table: how every L1 on a host learns of a write.

Why it exists: an in-process L1 is only as good as its invalidation. A TTL alone
lets a user see their own write vanish on the next request served by another
worker. Here every process of the host maps one small file (``MAP_SHARED``), so a
write to it is visible to all of them at memory speed, with no syscall and no
server round trip on the read path.

The protocol (``docs/architecture.md``, TieredCache, states the guarantees and limits):

* The table has many slots; a key's slot is a *stable* hash of the L2's final
  cache key (CRC-32, never Python's randomised ``hash()``), so every process
  and every backend instance agrees on it. A slot holds one 64-bit token and
  nothing else: nothing here says *which* key wrote it, so no collision of
  keys can make one key's value or expiry pass for another's (two keys that
  share a slot only invalidate each other's L1 entries).
* A writer first completes its L2 write, then :meth:`GenerationTable.stamp`
  puts a fresh, never-repeating token into the key's slot.
* A reader takes the slot's token (:meth:`GenerationTable.token`) *before* it
  reads the L2 and keeps it with the L1 entry; an L1 hit is served only while
  the slot and the table's epoch still hold what the token recorded.

Tokens, not increments: two writers racing on one slot each write a token that
no reader can hold. Tokens are a per-process random 64-bit start, counted up and
passed through a bijective mixer (SplitMix64's finaliser): a process never
repeats one and two processes collide with probability ~2**-64.
:meth:`GenerationTable.stamp_all` (``clear()``, and every fault this module
cannot repair slot by slot) writes a fresh token into the epoch word that every
token also records.

Stamps of one slot are serialised (a per-process thread lock and a POSIX record
lock on the slot; readers take no lock), which makes a compare-and-stamp
possible: a writer that took the slot's token before its L2 write and finds that
every stamp since then was its own (:meth:`begin_chain`, :meth:`chained`) knows
that no other write of the key completed in between, so it may keep the value
it wrote. No lock is ever waited on without a bound (:data:`STAMP_WAIT`): a
writer that cannot get one (its holder is stopped, say) bumps the epoch instead,
which makes every L1 entry on the host unservable, and counts it. Correct, and
slow only while the holder stays stopped.

The file under the table (allocated before it is mapped, checked before every
stamp and fill, repaired or turned off when damaged) is ``table_file.py``'s job;
when it cannot be repaired (disk full) the table reports itself unusable and
TieredCache turns its L1 off (``usable``).

This module imports nothing from Django.
"""

from __future__ import annotations

import logging
import os
import time
import zlib
from collections.abc import Callable, Iterable
from typing import Any, Final

from djcachebench.coherence import chain
from djcachebench.coherence.layout import (
    EPOCH_AT,
    EPOCH_OFFSET,
    HEADER,
    SLOT,
    STAMPER_AT,
    TOKEN,
    U64,
    WATCHED_AT,
)
from djcachebench.coherence.registry import Registry
from djcachebench.coherence.shared_file import lock_range, unlock_range
from djcachebench.coherence.table_file import (
    CHECK_EVERY,
    STAMP_LOCK,
    STAMP_WAIT,
    TableFile,
    TableStats,
)
from djcachebench.coherence.tokens import tokens

_monotonic = time.monotonic

__all__ = [
    "CHECK_EVERY", "EPOCH_OFFSET", "KEEP", "STAMP_WAIT", "TOKEN", "U64", "GenerationTable",
    "TableStats", "Token", "open_table",
]

log = logging.getLogger("djcachebench.coherence")

# A token as the reader holds it: (slot byte offset, epoch, (stamp, mark)).
# Opaque to callers; a tuple so that it is cheap and carries its own slot, so
# that checking it needs no hashing.
Token = tuple[int, int, tuple[int, int]]

class _Keep:
    def __repr__(self) -> str:
        return "KEEP"


#: Accepted as ``expires_at`` for compatibility with writers that tell it
#: (``incr``: the expiry did not change). The table publishes no expiries.
KEEP: Final = _Keep()


def _slot_of(key: str, slots: int, _crc32: Any = zlib.crc32) -> int:
    """The byte offset of ``key``'s slot: CRC-32 of the final key, modulo the slots.

    Stable across processes (never Python's randomised ``hash()``). No strength
    is needed: keys that share a slot only invalidate each other, and nothing
    shared ever names a key by its slot, so a chosen collision buys an attacker
    extra misses at most. A digest cost several times more on every write.
    """
    return HEADER + (_crc32(key.encode("utf-8", "surrogatepass")) % slots) * SLOT


class GenerationTable(TableFile):
    """A shared-memory table of write tokens, one file mapped by every process.

    The file itself (creation, mapping, checks, repairs) is :class:`TableFile`'s
    job; this class is the protocol on top. Use :func:`open_table` to share one
    instance (one descriptor, one mapping) per path in a process.
    """

    __slots__ = ()

    # --- who relies on the table ------------------------------------------

    def watch(self) -> None:
        """Declare that a reader keeps values under this table's tokens.

        A TieredCache calls this before its first L2 read. A writer that stamps
        only for the benefit of such readers (ShardedSQLiteCache stamping its
        own writes) may skip its stamps while :meth:`watched` is false.

        Why skipping is safe: the writer checks :meth:`watched` *after* its
        write has committed, the reader sets the word *before* its first read.
        If the writer saw the word unset, the reader set it later, so the
        reader's first read already sees the committed write. A repaired header
        sets the word, since nobody can tell who relied on the old one.
        """
        self.claim(WATCHED_AT)

    def watched(self) -> bool:
        """Has any reader ever relied on this table (:meth:`watch`)?"""
        # check()'s passing case inlined: every write of a store asks this twice.
        if not ((self._fd >= 0 and _monotonic() < self._check_at and self.usable)
                or self.check()):
            return False
        return U64.unpack_from(self._mm, WATCHED_AT)[0] != 0

    def engine_stamped(self) -> bool:
        """Does a storage engine stamp this table from inside its transactions
        (``coherence.stamper``)? Then no adapter may stamp it with :meth:`stamp`:
        the two protocols prove different things."""
        return U64.unpack_from(self._mm, STAMPER_AT)[0] != 0

    # --- writers ---------------------------------------------------------

    def _lock(self, off: int) -> bool:
        deadline = time.monotonic() + STAMP_WAIT
        if not STAMP_LOCK.acquire(timeout=STAMP_WAIT):
            return False
        if self._fd >= 0:
            try:
                if lock_range(self._fd, SLOT, off, deadline):
                    return True
            except OSError:
                pass
            STAMP_LOCK.release()
            return False
        return True

    def _unlock(self, off: int) -> None:
        try:
            if self._fd >= 0:
                unlock_range(self._fd, SLOT, off)
        finally:
            STAMP_LOCK.release()

    def _gave_up(self, off: int) -> None:
        """A stamp without its lock: bump the epoch (lock-free, one word), so that
        no token taken before this write stays current anywhere, and make any
        chain of this thread on the slot unprovable."""
        self.stats.lock_give_ups += 1
        chain.break_link(self._ident, off)
        U64.pack_into(self._mm, EPOCH_AT, tokens.next())
        log.warning("%s: a stamp waited %.0f ms for slot %d's lock; bumped the epoch instead",
                    self.path, STAMP_WAIT * 1000, (off - HEADER) // SLOT)

    def stamp(self, key: str, expires_at: Any = None) -> None:
        """A write to ``key`` (the L2's final key) has completed in the L2.

        ``expires_at`` is accepted for writers that tell it and ignored: readers
        learn a value's expiry from the read itself, never from a slot that
        other keys share.
        """
        # The other hosts hear of every write, whatever happens here: the outlet
        # only queues (sent after the write). Told after the check, a write
        # through a table that failed its check (its directory removed, say)
        # would never be published.
        if self.outlet is not None:
            self.outlet(key)
        if self.check():
            self._stamp_key(key)
            self.confirm()

    def _stamp_key(self, key: str) -> None:
        """Stamp ``key``'s slot under its lock (the file checked by the caller,
        and confirmed by it afterwards: :meth:`confirm`)."""
        off = _slot_of(key, self.slots)
        if not self._lock(off):
            self._gave_up(off)
            return
        try:
            self._stamp_locked(off)
            pending = chain.pending()
            if pending is not None and pending[4] is None and pending[0] == key:
                # This thread's own write of ``key``, stamped by the L2 after its
                # commit: the compare-and-stamp and the board publish it prepared
                # (``begin_chain``) run under this lock, not in a second section.
                token = self.chained(chain.links() or {}, pending[1], pending[2])
                if token is not None and pending[3](token):
                    pending[4] = token
        finally:
            self._unlock(off)

    def _stamp_locked(self, off: int) -> int:
        mm = self._mm
        prev = U64.unpack_from(mm, off)[0]
        new = tokens.next()
        U64.pack_into(mm, off, new)
        chain.record(self._ident, off, prev, new)
        return new

    def stamp_through(self, off: int, since: Token, max_stamps: int,
                      publish: Callable[[Token], bool] | None = None,
                      final: str | None = None) -> Token | None:
        """The writer's own stamp and the compare-and-stamp check, under one lock.

        For a writer that located its key (:meth:`locate`), read ``since``
        before its L2 write and recorded a chain: stamps the slot like
        :meth:`stamp`, then returns the token to keep its value under (see
        :meth:`chained`, ``max_stamps`` counting this stamp) or ``None``. When
        a token is returned and ``publish`` is given, ``publish(token)`` runs
        while the lock is still held (the value board), so no later stamp of
        the slot can land before the published value carries its token.
        ``final`` (the key) is what the cross-host ``outlet`` is told, first, as in
        :meth:`stamp`.
        """
        if self.outlet is not None:
            self.outlet(final)
        if not self.check():
            return None
        if not self._lock(off):
            self._gave_up(off)
            self.confirm()
            return None
        try:
            self._stamp_locked(off)
            token = self.chained(chain.links() or {}, since, max_stamps)
            if token is not None and publish is not None:
                publish(token)
        finally:
            self._unlock(off)
        # A token of a file replaced meanwhile is dead: keep nothing under it.
        return token if self.confirm() else None

    def publish(self, token: Token, publish: Callable[[], bool]) -> bool:
        """Run ``publish()`` under the slot's lock if ``token`` is still current."""
        off = token[0]
        if not self.check() or not self._lock(off):
            return False
        try:
            if not self.is_current(None, token):
                return False
            return bool(publish())
        finally:
            self._unlock(off)

    def stamp_many(self, keys: Iterable[str], expires_at: Any = None) -> None:
        """:meth:`stamp` each key (one confirmation for them all)."""
        keys = list(keys)
        if self.outlet is not None:
            for key in keys:
                self.outlet(key)
        if self.check():
            for key in keys:
                self._stamp_key(key)
            self.confirm()

    def stamp_all(self) -> None:
        """``clear()``: every token handed out so far stops being current.

        One aligned 8-byte store, no lock: a chain-holder whose ``since`` was
        taken before it cannot keep its value, since the kept token records the
        old epoch.
        """
        if self.check():
            U64.pack_into(self._mm, EPOCH_AT, tokens.next())
            self.confirm()  # a new file at the path gets its own new epoch
        if self.outlet is not None:
            self.outlet(None)

    # --- what another host wrote (the cross-host transport) ---------------------

    def stamp_remote(self, keys: Iterable[str]) -> None:
        """Stamp keys written on another host: as :meth:`stamp`, without telling
        the ``outlet`` (which would echo them back)."""
        if self.check():
            for key in keys:
                self._stamp_key(key)
            self.confirm()

    def stamp_all_remote(self) -> None:
        """Every token handed out so far stops being current (another host
        cleared its cache, or this host may have missed invalidations); the
        ``outlet`` is not told."""
        if self.check():
            U64.pack_into(self._mm, EPOCH_AT, tokens.next())
            self.confirm()

    # --- compare-and-stamp for write-through ----------------------------------

    #: Record this thread's stamps until :meth:`end_chain` (``coherence/chain.py``).
    begin_chain = staticmethod(chain.begin)
    #: Stop recording; returns what :meth:`chained` reads.
    end_chain = staticmethod(chain.end)

    def chained(self, links: chain.Links, since: Token,
                max_stamps: int) -> Token | None:
        """The token to keep a just-written value under, or ``None``.

        ``since`` was read before the write; ``links`` came from
        :meth:`end_chain` (or are this thread's, under a slot lock). A token
        is returned only if the stamps on the slot since ``since`` were all
        made by this thread during the write (at least one, at most
        ``max_stamps``) and the epoch has not moved: then no other write of
        the key completed in between, and the value written is the L2's latest
        acknowledged one.
        """
        last = chain.check_link(links, self._ident, since[0], since[2][0], max_stamps)
        if last is None or U64.unpack_from(self._mm, EPOCH_AT)[0] != since[1]:
            return None
        return (since[0], since[1], (last, since[2][1]))

    # --- readers ---------------------------------------------------------

    def token(self, key: str) -> Token:
        """The key's current token; take it BEFORE reading the L2."""
        return self.read_at(_slot_of(key, self.slots))

    def locate(self, key: str) -> int:
        """The key's slot offset: hash once, then use :meth:`read_at`."""
        return _slot_of(key, self.slots)

    @staticmethod
    def slot_index(offset: int) -> int:
        """The slot number of a slot offset (a token's first field)."""
        return (offset - HEADER) // SLOT

    def read_at(self, off: int) -> Token:
        """The token of the slot at ``off`` (epoch read first)."""
        mm = self._mm
        return (off, U64.unpack_from(mm, EPOCH_AT)[0], TOKEN.unpack_from(mm, off))

    def is_current(self, key: str | None, token: Token) -> bool:
        """May an L1 entry read under ``token`` still be served?

        ``key`` is accepted for symmetry with :meth:`token`; the token already
        names its slot, so no hashing happens here (this is the L1 hit path).
        """
        mm = self._mm
        return (
            TOKEN.unpack_from(mm, token[0]) == token[2]
            and U64.unpack_from(mm, EPOCH_AT)[0] == token[1]
        )

    def __repr__(self) -> str:
        where = self.path or "<in-process>"
        return f"<GenerationTable {where} slots={self.slots}>"


_open: Registry[str, GenerationTable] = Registry()


def open_table(path: str, slots: int = 1 << 16) -> GenerationTable:
    """The process's one table for ``path`` (one descriptor and one mapping,
    however many backend instances Django builds: it builds one per thread),
    while anything uses it (``coherence/registry.py``)."""
    real = os.path.realpath(path)
    with _open.lock:
        table = _open.find(real)
        if table is None or (table._fd < 0 and not table._pending):
            if slots < 1 or slots > 1 << 32:
                raise ValueError(f"slots must be between 1 and 2**32, got {slots}")
            try:
                table = GenerationTable(path, slots)
            except (OSError, ValueError) as exc:
                # The file is shared state anything on the host can damage or
                # fill the disk under: unusable until it can be had, not fatal.
                table = GenerationTable.pending(path, slots, exc)
            _open.add(real, table)
        return table
