"""The cross-process generation table: how every L1 on a host learns of a write.

Why it exists: an in-process L1 is only as good as its invalidation. A TTL alone
lets a user see their own write vanish on the next request served by another
worker. Here every process of the host maps one small file (``MAP_SHARED``), so a
write to it is visible to all of them at memory speed, with no syscall and no
server round trip on the read path.

The protocol (see ``docs/architecture.md`` (TieredCache) for guarantees and limits):

* The table has many slots; a key's slot is a *stable* hash of the L2's final
  cache key (BLAKE2b, never Python's randomised ``hash()``), so every process
  and every backend instance agrees on it.
* A writer first completes its L2 write, then :meth:`GenerationTable.stamp` puts
  a fresh, never-repeating token into the key's slot.
* A reader calls :meth:`GenerationTable.token` *before* it reads the L2 and keeps
  the token with the L1 entry; an L1 hit is served only while
  :meth:`GenerationTable.is_current` holds.

Tokens, not increments: two writers racing on one slot each write a token that
no reader can hold (``n += 1`` from two processes could both write ``n+1`` and
leave a reader's value in place). Tokens are a per-process random 64-bit start,
counted up and passed through a bijective mixer (the SplitMix64 finaliser): a
process never repeats one, two processes collide with probability ~2**-64, and
consecutive tokens differ in both 32-bit halves, so even a torn 8-byte read
(which x86-64 and AArch64 do not produce for aligned words) reads as "changed".
:meth:`GenerationTable.stamp_all` (``clear()``) writes a fresh token into a
global epoch word that every token also records.

Besides its token, a slot carries the fingerprint of the last key stamped into
it and that write's L2 expiry (whole seconds, rounded down), so a reader in any
process can cap its L1 entry at the L2 expiry without asking the L2 for a TTL.
The fingerprint tells a reader whether that expiry is about *its* key (two keys
can share a slot); when it is not, the expiry is unknown.

Stamps are serialised (a process-wide thread lock plus a POSIX byte-range
lock on the slot; readers take no lock). That makes a compare-and-stamp
possible: a writer that records the slot's token before its L2 write, and finds
that every stamp on the slot since then was its own (:meth:`begin_chain`,
:meth:`chained`), knows no other write to the key completed in between, so it
may keep the value it wrote in its own L1 under the token it stamped.

This module imports nothing from Django.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import math
import mmap
import os
import struct
import tempfile
import threading
from collections.abc import Iterable
from typing import Any, Final

__all__ = ["EPOCH_OFFSET", "KEEP", "TOKEN", "GenerationTable", "KeepFrom", "Token"]

# A token as the reader holds it: (slot byte offset, epoch, slot token). Opaque
# to callers; a tuple so that it is cheap, hashable and carries its own slot, so
# that checking it needs no hashing.
Token = tuple[int, int, int]

_MAGIC: Final = b"DJCBGEN1"
_FORMAT: Final = 1
_HEADER: Final = 64  # magic(8) format(u32) slot_size(u32) slots(u64) epoch(u64) watched(u64)
_EPOCH_AT: Final = 24
# Non-zero once any reader has relied on the table (see GenerationTable.watch).
# It was a reserved zero word before, so older files read as "not watched".
_WATCHED_AT: Final = 32
_SLOT: Final = 16  # token(u64) fingerprint(u32) expiry(u32)
_MASK64: Final = (1 << 64) - 1

# Expiry encoding in a slot: 0 = unknown, _NEVER = no expiry, else floor(epoch s).
_UNKNOWN_EXP: Final = 0
_NEVER_EXP: Final = 0xFFFFFFFF

_U64 = struct.Struct("<Q")
#: For a reader that inlines :meth:`GenerationTable.is_current` on its hot path:
#: ``token`` is current iff ``TOKEN.unpack_from(buffer, token[0])[0] == token[2]``
#: and ``TOKEN.unpack_from(buffer, EPOCH_OFFSET)[0] == token[1]``.
TOKEN = _U64
EPOCH_OFFSET: Final = _EPOCH_AT
_META = struct.Struct("<II")  # also splits an 8-byte digest into two 32-bit halves
_HEAD = struct.Struct("<8sIIQ")


class _Keep:
    """Type of :data:`KEEP`."""

    def __repr__(self) -> str:
        return "KEEP"


#: ``stamp(key, expires_at=KEEP)``: the write did not change the key's expiry
#: (``incr``/``decr``); keep the published one if it is this key's.
KEEP: Final = _Keep()


class KeepFrom:
    """``stamp(key, expires_at=KeepFrom(token, expiry))``: like :data:`KEEP`, for
    a writer that read ``token`` and ``expiry`` before its write and recorded a
    chain (:meth:`GenerationTable.begin_chain`). The expiry is published only if
    every stamp of the slot since ``token`` is in this thread's chain: then no
    other write can have changed it (an L2 that stamps without expiries, for
    one, leaves it unknown in between)."""

    __slots__ = ("expires_at", "token")

    def __init__(self, token: Token, expires_at: float | None) -> None:
        self.token = token
        self.expires_at = expires_at


def _mix(z: int) -> int:
    """SplitMix64's finaliser: a bijection on 64-bit integers."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


class _TokenSource:
    """Fresh tokens for this process; re-seeded in a forked child.

    ``next()`` on an ``itertools.count`` is atomic under the GIL, so threads of
    one process never draw the same number (``self.n += 1`` could).
    """

    def __init__(self) -> None:
        self._count = itertools.count()
        self.reseed()

    def reseed(self) -> None:
        self._count = itertools.count(int.from_bytes(os.urandom(8), "little"))

    def next(self) -> int:
        while True:
            token = _mix(next(self._count) & _MASK64)
            if token:  # 0 is what a never-stamped slot holds
                return token


_tokens = _TokenSource()

# Serialises the stamps of this process (POSIX record locks, taken as well, only
# exclude other processes). Also held by close(): closing any descriptor of a
# file drops this process's record locks on it.
_stamp_lock = threading.Lock()
# Per thread: (table ident, slot offset) -> [token before, token after, stamps],
# recorded only between begin_chain() and end_chain().
_chain = threading.local()


def _after_fork_in_child() -> None:
    # A forked child must not replay its parent's sequence, nor inherit a lock
    # some other thread held at fork time. The mapping itself needs nothing:
    # MAP_SHARED pages stay shared with the file, and record locks are not
    # inherited.
    global _stamp_lock
    _tokens.reseed()
    _stamp_lock = threading.Lock()
    _chain.__dict__.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _locate(
    key: str, slots: int, _blake2b=hashlib.blake2b, _halves=_META.unpack
) -> tuple[int, int]:
    """(byte offset of the key's slot, 32-bit fingerprint, never 0).

    One 64-bit BLAKE2b digest: the low half picks the slot, the high half is
    the fingerprint, so two keys sharing a slot still differ in it (CRC32 with
    two seeds would not do: CRC is affine, the two values are not independent).
    """
    lo, hi = _halves(_blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest())
    return _HEADER + (lo % slots) * _SLOT, hi or 1


def _encode_expiry(expires_at: float | None) -> int:
    """Wall-clock expiry -> slot field. Rounded *down*: an L1 may only end earlier."""
    if expires_at is None:
        return _UNKNOWN_EXP
    if math.isinf(expires_at):
        return _NEVER_EXP
    seconds = math.floor(expires_at)
    if seconds <= 0:
        return 1  # already expired: known, in the past
    return min(seconds, _NEVER_EXP - 1)


class GenerationTable:
    """A shared-memory table of write tokens, one file mapped by every process.

    ``path`` is created if missing (mode 0o600, parent directories 0o700) and
    opened otherwise; when many processes create it at once exactly one file
    wins (it is built under a temporary name and published with ``link()``, so
    nobody ever maps a half-initialised table). ``slots`` only matters to the
    process that creates the file: everyone else uses the count in its header,
    because processes that disagreed on it would look at different slots.
    """

    __slots__ = ("_fd", "_ident", "_mm", "path", "slots")

    def __init__(self, path: str, slots: int = 1 << 16) -> None:
        if slots < 1 or slots > 1 << 32:
            raise ValueError(f"slots must be between 1 and 2**32, got {slots}")
        self.path = path
        fd = self._open_or_create(path, slots)
        try:
            size = os.fstat(fd).st_size
            if size < _HEADER:
                raise ValueError(f"{path} is too small to be a generation table")
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            magic, fmt, slot_size, file_slots = _HEAD.unpack_from(mm, 0)
            if magic != _MAGIC or fmt != _FORMAT or slot_size != _SLOT:
                mm.close()
                raise ValueError(
                    f"{path} is not a djcachebench generation table (format {_FORMAT})")
            if not file_slots or size < _HEADER + file_slots * _SLOT:
                mm.close()
                raise ValueError(f"{path} is truncated ({size} bytes for {file_slots} slots)")
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd  # kept open for the stamp locks
        self._mm = mm
        self.slots = file_slots
        # Tables of one file share chains (the L2's own instance and the adapter's).
        self._ident: object = os.path.realpath(path)

    @classmethod
    def in_process(cls, slots: int = 1 << 16) -> GenerationTable:
        """A table private to this process (``COHERENCE="none"``).

        Anonymous and ``MAP_PRIVATE``: a forked child gets a copy-on-write copy
        and the two never see each other's stamps, exactly like two processes
        that were started separately.
        """
        table = cls.__new__(cls)
        size = _HEADER + slots * _SLOT
        mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
        _HEAD.pack_into(mm, 0, _MAGIC, _FORMAT, _SLOT, slots)
        table._mm = mm
        table.slots = slots
        table.path = ""
        table._fd = -1  # one process: the thread lock is enough
        table._ident = table
        return table

    @staticmethod
    def _open_or_create(path: str, slots: int) -> int:
        try:
            return os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            pass
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".gen-", dir=directory)  # mode 0o600
        try:
            os.ftruncate(fd, _HEADER + slots * _SLOT)  # sparse zeroes: no slot stamped
            os.pwrite(fd, _HEAD.pack(_MAGIC, _FORMAT, _SLOT, slots), 0)
            with contextlib.suppress(FileExistsError):  # another process won the race
                os.link(tmp, path)
        finally:
            os.close(fd)
            os.unlink(tmp)
        return os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))

    # --- who relies on the table ------------------------------------------

    def watch(self) -> None:
        """Declare that a reader keeps values under this table's tokens.

        A TieredCache calls this before its first L2 read. A writer that stamps
        only for the benefit of such readers (ShardedSQLiteCache stamping its
        own writes) may skip its stamps while :meth:`watched` is false: a stamp
        costs ~5 µs (a thread lock and two record-lock system calls), a third
        of a plain SQLite set, and nobody would read it.

        Why skipping is safe: the writer checks :meth:`watched` *after* its
        write has committed, the reader sets the word *before* its first read.
        If the writer saw the word unset, the reader set it later, so the
        reader's first read already sees the committed write; the word is never
        unset again (it lives as long as the file).
        """
        if not _U64.unpack_from(self._mm, _WATCHED_AT)[0]:
            _U64.pack_into(self._mm, _WATCHED_AT, 1)

    def watched(self) -> bool:
        """Has any reader ever relied on this table (:meth:`watch`)?"""
        return _U64.unpack_from(self._mm, _WATCHED_AT)[0] != 0

    # --- writers ---------------------------------------------------------

    def stamp(self, key: str, expires_at: float | _Keep | KeepFrom | None = None) -> None:
        """A write to ``key`` (the L2's final key) has completed in the L2.

        ``expires_at`` is the new value's L2 expiry as wall-clock seconds
        (``math.inf`` for none), ``None`` when unknown or irrelevant (delete),
        or :data:`KEEP` when the write left the expiry as it was. Pass a time
        taken *before* the L2 write, so the published expiry is never later
        than the real one. The expiry is written before the token, so a reader
        that sees the new token also sees its expiry.
        """
        off, fp = _locate(key, self.slots)
        with _stamp_lock:
            if self._fd >= 0:
                fcntl.lockf(self._fd, fcntl.LOCK_EX, _SLOT, off, os.SEEK_SET)
            try:
                self._stamp_locked(off, fp, expires_at)
            finally:
                if self._fd >= 0:
                    fcntl.lockf(self._fd, fcntl.LOCK_UN, _SLOT, off, os.SEEK_SET)

    def stamp_through(self, off: int, fp: int, expires_at: float, since: Token,
                      max_stamps: int, board: Any = None, kind: int = 0,
                      payload: bytes = b"") -> Token | None:
        """The writer's own stamp, the compare-and-stamp check, and the board, at once.

        For a writer that located its key (:meth:`locate`), read ``since``
        before its L2 write and recorded a chain: stamps the slot like
        :meth:`stamp`, then returns the token to keep its value under (see
        :meth:`chained`, ``max_stamps`` counting this stamp) or ``None``; with
        a ``board`` and a ``kind``, publishes ``payload`` there under that
        token. One lock for what :meth:`stamp`, :meth:`chained` and
        :meth:`publish` would take three times.
        """
        with _stamp_lock:
            if self._fd >= 0:
                fcntl.lockf(self._fd, fcntl.LOCK_EX, _SLOT, off, os.SEEK_SET)
            try:
                self._stamp_locked(off, fp, expires_at)
                links = getattr(_chain, "links", None) or {}
                token = self.chained(links, since, max_stamps)
                if token is not None and board is not None and kind:
                    board.write((off - _HEADER) // _SLOT, token[2], token[1], expires_at, fp,
                                kind, payload)
                return token
            finally:
                if self._fd >= 0:
                    fcntl.lockf(self._fd, fcntl.LOCK_UN, _SLOT, off, os.SEEK_SET)

    def _stamp_locked(self, off: int, fp: int,
                      expires_at: float | _Keep | KeepFrom | None) -> None:
        mm = self._mm
        prev = _U64.unpack_from(mm, off)[0]
        links = getattr(_chain, "links", None)
        if expires_at is KEEP:
            old_fp, exp = _META.unpack_from(mm, off + 8)
            if old_fp != fp:
                exp = _UNKNOWN_EXP
        elif type(expires_at) is KeepFrom:
            link = None if links is None else links.get((self._ident, off))
            since = expires_at.token
            unbroken = (link[0] == since[2] and link[1] == prev) if link else prev == since[2]
            exp = _encode_expiry(expires_at.expires_at) if unbroken else _UNKNOWN_EXP
        else:
            exp = _encode_expiry(expires_at)  # type: ignore[arg-type]
        new = _tokens.next()
        _META.pack_into(mm, off + 8, fp, exp)
        _U64.pack_into(mm, off, new)
        if links is not None:
            link = links.get((self._ident, off))
            if link is not None and link[1] == prev:
                link[1] = new
                link[2] += 1
            else:  # first stamp of this write, or someone else's came in between
                links[(self._ident, off)] = [prev, new, 1]

    def stamp_many(self, keys: Iterable[str], expires_at: float | _Keep | None = None) -> None:
        """:meth:`stamp` each key (one expiry for all, as ``set_many`` has)."""
        for key in keys:
            self.stamp(key, expires_at)

    def stamp_all(self) -> None:
        """``clear()``: every token handed out so far stops being current."""
        with _stamp_lock:
            _U64.pack_into(self._mm, _EPOCH_AT, _tokens.next())

    # --- compare-and-stamp for write-through ----------------------------------

    @staticmethod
    def begin_chain() -> None:
        """Record this thread's stamps (of any table) until :meth:`end_chain`."""
        _chain.links = {}

    @staticmethod
    def end_chain() -> dict[tuple[object, int], list[int]]:
        """Stop recording; returns what :meth:`chained` reads."""
        links = getattr(_chain, "links", None)
        _chain.links = None
        return links or {}

    def chained(self, links: dict[tuple[object, int], list[int]], since: Token,
                max_stamps: int) -> Token | None:
        """The token to keep a just-written value under, or ``None``.

        ``since`` was read before the write; ``links`` came from
        :meth:`end_chain`. A token is returned only if the stamps on the slot
        since ``since`` were all made by this thread during the write (at most
        ``max_stamps`` of them): then no other write of the key completed in
        between, and the value written is the L2's latest acknowledged one.
        """
        link = links.get((self._ident, since[0]))
        if link is None or link[0] != since[2] or link[2] > max_stamps:
            return None
        return (since[0], since[1], link[1])

    # --- readers ---------------------------------------------------------

    def token(self, key: str) -> Token:
        """The key's current token; take it BEFORE reading the L2."""
        return self.read(key)[0]

    def locate(self, key: str) -> tuple[int, int]:
        """(slot offset, key fingerprint): hash once, then use :meth:`read_at`."""
        return _locate(key, self.slots)

    @staticmethod
    def slot_index(offset: int) -> int:
        """The slot number of a slot offset (a token's first field)."""
        return (offset - _HEADER) // _SLOT

    def read(self, key: str) -> tuple[Token, float | None]:
        """The key's token and the L2 expiry published with it, if known.

        The expiry is wall-clock seconds (``math.inf``: never expires), or
        ``None`` when the slot's last stamp was for another key, did not say,
        or came from a writer that does not publish expiries. The token is read
        before the expiry: an expiry newer than its token only concerns an
        entry whose token is already stale.
        """
        return self.read_at(*_locate(key, self.slots))

    def read_at(self, off: int, fp: int) -> tuple[Token, float | None]:
        """:meth:`read` for a key already located."""
        mm = self._mm
        token = (off, _U64.unpack_from(mm, _EPOCH_AT)[0], _U64.unpack_from(mm, off)[0])
        slot_fp, exp = _META.unpack_from(mm, off + 8)
        if slot_fp != fp or exp == _UNKNOWN_EXP:
            return token, None
        return token, (math.inf if exp == _NEVER_EXP else float(exp))

    def is_current(self, key: str | None, token: Token) -> bool:
        """May an L1 entry read under ``token`` still be served?

        ``key`` is accepted for symmetry with :meth:`token`; the token already
        names its slot, so no hashing happens here (this is the L1 hit path).
        """
        mm = self._mm
        return (
            _U64.unpack_from(mm, token[0])[0] == token[2]
            and _U64.unpack_from(mm, _EPOCH_AT)[0] == token[1]
        )

    def publish(self, board: Any, token: Token, expires: float, fp: int, kind: int,
                payload: bytes) -> bool:
        """Write a value to ``board`` (a ``ValueBoard``) if ``token`` is still current.

        Done under the slot's stamp lock, so no stamp of the key can land while
        the board slot is being written: a board value always belongs to the
        token it carries.
        """
        off = token[0]
        with _stamp_lock:
            if self._fd >= 0:
                fcntl.lockf(self._fd, fcntl.LOCK_EX, _SLOT, off, os.SEEK_SET)
            try:
                mm = self._mm
                if (_U64.unpack_from(mm, off)[0] != token[2]
                        or _U64.unpack_from(mm, _EPOCH_AT)[0] != token[1]):
                    return False
                board.write((off - _HEADER) // _SLOT, token[2], token[1], expires, fp, kind,
                            payload)
                return True
            finally:
                if self._fd >= 0:
                    fcntl.lockf(self._fd, fcntl.LOCK_UN, _SLOT, off, os.SEEK_SET)

    @property
    def buffer(self) -> mmap.mmap:
        """The mapped table, read-only use: see :data:`TOKEN`."""
        return self._mm

    def close(self) -> None:
        """Unmap the table; the file stays for the other processes."""
        with _stamp_lock:
            self._mm.close()
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __repr__(self) -> str:
        where = self.path or "<in-process>"
        return f"<GenerationTable {where} slots={self.slots}>"
