"""The value board: the latest small value of each generation slot, in a shared file.

Why: with invalidation alone, every write sends every *other* process back to
the L2 for that key. A writer already holds the new value and has proved, with
the compare-and-stamp of ``GenerationTable.chained``, that no other write of the
key came in between; it publishes the value here, next to the token it stamped.
A reader whose L1 entry went stale takes the value from the board instead of
the L2 when the board holds exactly the slot's current token and epoch, *and
the very final key it asks for*.

Identity: many keys share a slot. The board stores the whole final key with the
value and a reader compares it byte for byte, so no pair of keys, however
chosen, can make one key's value pass for another's (a fingerprint or a short
digest could be collided by anyone who chooses key names, ``cache_page`` URLs
for one). A key and value that do not fit together in a slot are not published.

Correctness is the generation table's: a board value is served only under the
token current in the table when the read starts, so it is the value of the last
acknowledged write, like an L1 hit in the writer's own process.

Only plain values are published (bytes, str, int, float, bool, None, and
"absent" after a delete), never pickles: a reader decodes them with
``bytes()`` / ``str()`` / ``struct``, so nothing in a shared file can run code.

Integrity: every slot carries a keyed BLAKE2b tag over everything a reader
takes from it (token, epoch, expiry, kind, key and value), under a key the
processes derive from their ``SECRET_KEY``. Whoever can write the file could
otherwise put any plain value under the current token of any key, and every
process would serve it: the same threat the integrity tags of
ShardedSQLiteCache's rows answer, and over such an L2 the board would have been
the way around them. A slot whose tag does not verify is not published (the
reader goes to the L2). Replaying a slot that verified is possible, but it
carries the token of its own write, which a later write of any key of the
slot has moved past.

The file is allocated before it is mapped (no page of it can be unbacked when
the disk fills) and its size is checked before it is touched (at most every
``CHECK_EVERY``): a truncated board is re-extended (its lost slots read as
empty) or, if that fails, left unused. It is mapped rather than read with
``pread``/``pwrite`` because a write to a file's pages through a system call
updates the file's times and takes its inode lock, which made every published
write several times dearer under many processes.

Slot layout (``value_bytes + 56`` bytes, 8-aligned): stamp u64 (0 while a writer
is mid-update), mark u64 (the table slot's token is the pair), epoch u64, L2
expiry f64 (wall clock, inf: none), kind u8, pad u8, key length u16, value
length u32, tag (16 bytes), key, value. Writers of a slot are serialised, by the generation
table's slot lock (tables the adapter stamps) or by the write transaction of
the one SQLite shard that holds every key of the slot (``coherence.stamper``);
readers take no lock and re-read the stamp after copying (a seqlock).

This module imports nothing from Django.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import mmap
import os
import struct
import time
import weakref
from typing import Any, Final

from djcachebench.coherence.registry import Registry, own_descriptor
from djcachebench.coherence.shared_file import (
    SharedFileError,
    allocate,
    open_shared_file,
    regrow,
)
from djcachebench.serializers import derive_tag_key

__all__ = ["ABSENT", "EXPIRY_ONLY", "NOT_PUBLISHED", "LocalStore", "ValueBoard", "board_key",
           "encode", "open_board"]

log = logging.getLogger("djcachebench.coherence")

_MAGIC: Final = b"DJCBVAL4"
_FORMAT: Final = 4
_HEADER: Final = 64
#: How long a passed size check of the board stands in a process (seconds).
CHECK_EVERY: Final = 0.002
_HEAD = struct.Struct("<8sIIQ")  # magic, format, slot size, slots
_U64 = struct.Struct("<Q")
# stamp, mark, epoch, expiry, kind, pad, key len, value len, tag
_SLOT_HEAD = struct.Struct("<QQQdBBHI16s")
# What the tag covers ahead of the key and value: the head without the tag.
_TAGGED = struct.Struct("<QQQdBBHI")
_TAG_SIZE: Final = 16
# Domain separation: the board's key is derived from SECRET_KEY, never SECRET_KEY
# itself, and never the key of ShardedSQLiteCache's rows.
_KEY_CONTEXT: Final = b"djcachebench.board.v1"
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")

# kinds
_BYTES, _STR, _INT, _FLOAT, _TRUE, _FALSE, _NONE, _ABSENT, _EXPIRY_ONLY = range(1, 10)


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


#: What :meth:`ValueBoard.fetch` returns for a key published as deleted.
ABSENT: Final = _Absent()
#: What :meth:`ValueBoard.fetch` returns when it has nothing for that token and key.
NOT_PUBLISHED: Final = object()
#: Publish this to say only when the key's latest value expires: for values the
#: board cannot carry, over an L2 that does not report expiries on read
#: (memcached), so that readers of the L2 may still keep what they read.
EXPIRY_ONLY: Final = object()


def encode(value: Any) -> tuple[int, bytes] | None:
    """(kind, payload) for a value the board can carry, else None."""
    kind = type(value)
    if kind is bytes:
        return _BYTES, value
    if kind is str:
        return _STR, value.encode("utf-8", "surrogatepass")
    if kind is int and -(2**63) <= value < 2**63:
        return _INT, _I64.pack(value)
    if kind is bool:
        return (_TRUE if value else _FALSE), b""
    if kind is float:
        return _FLOAT, _F64.pack(value)
    if value is None:
        return _NONE, b""
    if value is ABSENT:
        return _ABSENT, b""
    if value is EXPIRY_ONLY:
        return _EXPIRY_ONLY, b""
    return None


def board_key(secret: bytes) -> bytes:
    """The 32-byte key of the board's tags, derived from ``secret`` (SECRET_KEY)."""
    return derive_tag_key(secret, _KEY_CONTEXT)


def _tag(keyed: Any, head: bytes, name: bytes, payload: bytes) -> bytes:
    """The slot's tag; ``keyed`` is a BLAKE2b already keyed, copied rather than
    keyed again at every call (a quarter of the cost on a short slot)."""
    h = keyed.copy()
    h.update(head)
    h.update(name)
    h.update(payload)
    return h.digest()


def _decode(kind: int, payload: bytes) -> Any:
    if kind == _BYTES:
        return payload
    if kind == _STR:
        return payload.decode("utf-8", "surrogatepass")
    if kind == _INT:
        return _I64.unpack(payload)[0]
    if kind == _FLOAT:
        return _F64.unpack(payload)[0]
    return {_TRUE: True, _FALSE: False, _NONE: None, _ABSENT: ABSENT,
            _EXPIRY_ONLY: EXPIRY_ONLY}[kind]


class ValueBoard:
    """One slot per generation-table slot, in a file shared by every process.

    Created like the table (allocated, built under a temporary name, published
    with ``link()``, 0o600). A file that is not a board of this format and slot
    count is replaced: the board is only a shortcut, and a reader of the old
    file still checks tokens and keys, so the swap can only cost misses.
    """

    __slots__ = ("__weakref__", "_check_at", "_closer", "_fd", "_key", "_local", "_mm", "_size",
                 "_store", "forged", "max_value", "path", "slot_size", "slots", "usable")

    def __init__(self, path: str, slots: int, value_bytes: int = 512, *, key: bytes,
                 store: bytes | None = b"") -> None:
        """``key``: the tags' key (:func:`board_key`); processes that share the
        board with another key read each other's slots as not published.
        ``store``: the identity of the store whose values this object publishes
        and takes (8 bytes): it is stored ahead of each final key and compared
        with it, so a table shared by several stores never serves one store's
        value to a reader of another. A :class:`LocalStore` (or ``None``): a
        store of this process alone (LocMemCache), named afresh in each
        process, a forked child included."""
        slot_size = (value_bytes + _SLOT_HEAD.size + 7) // 8 * 8
        size = _HEADER + slots * slot_size
        header = _HEAD.pack(_MAGIC, _FORMAT, slot_size, slots)
        fd = open_shared_file(path, size, header)
        try:
            if not self._fits(fd, slots):
                os.close(fd)
                fd = self._replace(path, size, header)
            file_slot_size = _HEAD.unpack(os.pread(fd, _HEAD.size, 0))[2]
            self._size = _HEADER + slots * file_slot_size
            allocate(fd, self._size)
            self._mm = mmap.mmap(fd, self._size, mmap.MAP_SHARED,
                                 mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
        self._fd = fd
        self._closer = own_descriptor(self, fd)
        self._local: LocalStore | None = None
        if store is None or isinstance(store, LocalStore):
            self._local = LocalStore(store or b"")
            _PER_PROCESS.add(self)
            store = _in_this_process(self._local)
        self._store = store
        self._key = hashlib.blake2b(key=key, digest_size=_TAG_SIZE)
        # Slots whose tag did not verify, seen by this process (logged once).
        self.forged = 0
        self._check_at = 0.0
        self.usable = True
        self.path = path
        self.slots = slots
        self.slot_size = file_slot_size
        self.max_value = file_slot_size - _SLOT_HEAD.size

    @staticmethod
    def _fits(fd: int, slots: int) -> bool:
        head = os.pread(fd, _HEAD.size, 0)
        if len(head) < _HEAD.size:
            return False
        magic, fmt, slot_size, file_slots = _HEAD.unpack(head)
        return (magic == _MAGIC and fmt == _FORMAT and file_slots == slots
                and slot_size >= _SLOT_HEAD.size
                and os.fstat(fd).st_size >= _HEADER + slots * slot_size)

    @staticmethod
    def _replace(path: str, size: int, header: bytes) -> int:
        log.warning("%s is not a value board of this format; replacing it", path)
        tmp = f"{path}.{os.getpid()}.new"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        fd = open_shared_file(tmp, size, header)
        os.replace(tmp, path)
        return fd

    def _whole(self) -> bool:
        """Is the mapped file still whole (re-extending it if it was truncated)?"""
        now = time.monotonic()
        if now < self._check_at:
            return self.usable
        self._check_at = now + CHECK_EVERY
        try:
            if regrow(self._fd, self._size):
                log.warning("%s was truncated; re-extended it", self.path)
            self.usable = True
        except OSError as exc:
            if self.usable:
                log.error("value board %s unusable: %s", self.path, exc)
            self.usable = False
        return self.usable

    def write(self, index: int, token: tuple[int, int], epoch: int, expires: float, key: bytes,
              kind: int, payload: bytes) -> bool:
        """Publish into slot ``index`` under ``token`` (the table slot's stamp and
        mark once the write is done); the caller is the slot's only writer now
        (see the module doc). False if it does not fit or the board cannot be used."""
        key = self._store + key
        if len(key) + len(payload) > self.max_value or not self._whole():
            return False
        mm = self._mm
        at = _HEADER + index * self.slot_size
        head = _TAGGED.pack(token[0], token[1], epoch, expires, kind, 0, len(key), len(payload))
        tag = _tag(self._key, head, key, payload)
        _U64.pack_into(mm, at, 0)  # busy: readers that see 0 or a changed stamp back off
        _SLOT_HEAD.pack_into(mm, at, 0, token[1], epoch, expires, kind, 0, len(key),
                             len(payload), tag)
        start = at + _SLOT_HEAD.size
        mm[start:start + len(key)] = key
        mm[start + len(key):start + len(key) + len(payload)] = payload
        _U64.pack_into(mm, at, token[0])
        return True

    def fetch(self, index: int, token: tuple[int, int], epoch: int,
              key: bytes) -> tuple[Any, float]:
        """(value, L2 expiry) published in slot ``index`` under exactly this token
        and epoch for exactly this final key (value ``ABSENT`` for a published
        delete, ``EXPIRY_ONLY`` when only the expiry was published);
        ``(NOT_PUBLISHED, 0.0)`` if there is none."""
        key = self._store + key
        if not self._whole():
            return NOT_PUBLISHED, 0.0
        mm = self._mm
        at = _HEADER + index * self.slot_size
        (stamp, mark, b_epoch, expires, kind, pad, key_len, length,
         tag) = _SLOT_HEAD.unpack_from(mm, at)
        if ((stamp, mark) != token or b_epoch != epoch or not kind or not stamp
                or key_len != len(key)):
            return NOT_PUBLISHED, 0.0
        start = at + _SLOT_HEAD.size
        if key_len + length > self.max_value or mm[start:start + key_len] != key:
            return NOT_PUBLISHED, 0.0
        payload = mm[start + key_len:start + key_len + length]
        if _U64.unpack_from(mm, at)[0] != stamp:  # a writer came by while we copied
            return NOT_PUBLISHED, 0.0
        head = _TAGGED.pack(stamp, mark, b_epoch, expires, kind, pad, key_len, length)
        if not hmac.compare_digest(tag, _tag(self._key, head, key, payload)):
            # Written by a process with another SECRET_KEY, or by someone else.
            if not self.forged:
                log.warning("value board %s: a slot's tag does not verify (written under "
                            "another SECRET_KEY, or altered); such slots are read as "
                            "not published", self.path)
            self.forged += 1
            return NOT_PUBLISHED, 0.0
        try:
            return _decode(kind, payload), expires
        except (KeyError, UnicodeDecodeError, struct.error):
            return NOT_PUBLISHED, 0.0

    def expiry(self, index: int, token: tuple[int, int], epoch: int,
               key: bytes) -> float | None:
        """The L2 expiry published with the key's latest value under this token, if any."""
        value, expires = self.fetch(index, token, epoch, key)
        if value is NOT_PUBLISHED or value is ABSENT:
            return None
        return expires

    def close(self) -> None:
        if self._fd >= 0:
            self._mm.close()
            self._closer()
            self._fd = -1


class LocalStore(bytes):
    """The name of a store of this process alone (LocMemCache's ``LOCATION``):
    a board binds its values to the name *and* to the process, so neither two
    such stores of one process (two LocMemCaches sharing a ``GENERATION_PATH``
    would otherwise serve each other's values) nor a forked child, whose copy
    of the store diverges, take each other's."""


#: This process's name for the stores of its own, and the boards that carry
#: them: a forked child gets a new name, and its boards with it.
_PROCESS_STORE = [os.urandom(8)]
_PER_PROCESS: weakref.WeakSet[ValueBoard] = weakref.WeakSet()


def _in_this_process(local: LocalStore) -> bytes:
    return hashlib.blake2b(bytes(local), key=_PROCESS_STORE[0], digest_size=8).digest()


def _renamed_after_fork() -> None:
    _PROCESS_STORE[0] = os.urandom(8)
    for board in _PER_PROCESS:
        if board._local is not None:
            board._store = _in_this_process(board._local)


os.register_at_fork(after_in_child=_renamed_after_fork)

_open: Registry[tuple[str, bytes, bytes | None, bool], ValueBoard] = Registry()


def open_board(path: str, slots: int, value_bytes: int, key: bytes,
               store: bytes | None = b"") -> ValueBoard | None:
    """The process's one board for ``path``, tag key and store, while anything
    uses it (``coherence/registry.py``), or None (logged) if it cannot be had:
    the board is a shortcut, never a reason to fail a cache."""
    real = (os.path.realpath(path), key, store, isinstance(store, LocalStore))
    with _open.lock:
        board = _open.find(real)
        if board is None:
            try:
                board = _open.add(real, ValueBoard(path, slots, value_bytes, key=key,
                                                   store=store))
            except (OSError, SharedFileError, ValueError, struct.error) as exc:
                log.warning("value board %s unavailable: %s; readers go to the L2", path, exc)
                return None
        return board
