"""The value board: the latest small value of each generation slot, in shared memory.

Why: with invalidation alone, every write sends every *other* process back to
the L2 for that key. In the reference workload (8 processes, 10% writes) that
is a third of all reads, each an L2 round trip. A writer already holds the new
value and has proved, with the compare-and-stamp of ``GenerationTable.chained``,
that no other write of the key came in between; it publishes the value here,
next to the token it stamped. A reader whose L1 entry went stale takes the
value from the board instead of the L2 when the board holds exactly the slot's
current token (and epoch, and the key's fingerprint).

Correctness is the generation table's: a board value is served only under the
token that is current in the table when the read starts, so it is the value
of the last acknowledged write, like an L1 hit in the writer's own process.

Only plain values are published (bytes, str, int, float, bool, None, and
"absent" after a delete), never pickles: a reader decodes them with
``bytes()`` / ``str()`` / ``struct``, so nothing in a shared file can run code.
Values longer than the slot are not published (readers go to the L2).

Slot layout (``value_bytes + 32`` bytes, 8-aligned): token u64 (0 while a
writer is mid-update), epoch u64, L2 expiry f64 (wall clock, inf: none),
fingerprint u32, kind u8, pad u8, length u16, payload. Writers are serialised
by the generation table's slot lock; readers take no lock and re-check the
token after copying (a seqlock).

This module imports nothing from Django.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import tempfile
from typing import Any, Final

__all__ = ["ABSENT", "NOT_PUBLISHED", "ValueBoard", "encode"]

_MAGIC: Final = b"DJCBVAL1"
_HEADER: Final = 64
_HEAD = struct.Struct("<8sIIQ")  # magic, format, slot size, slots
_U64 = struct.Struct("<Q")
_SLOT_HEAD = struct.Struct("<QQdIBBH")  # token, epoch, expiry, fp, kind, pad, length
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")

# kinds
_BYTES, _STR, _INT, _FLOAT, _TRUE, _FALSE, _NONE, _ABSENT = range(1, 9)


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


#: What :meth:`ValueBoard.fetch` returns for a key published as deleted.
ABSENT: Final = _Absent()
#: What :meth:`ValueBoard.fetch` returns when it has nothing for that token.
NOT_PUBLISHED: Final = object()


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
    return None


def _decode(kind: int, payload: bytes) -> Any:
    if kind == _BYTES:
        return payload
    if kind == _STR:
        return payload.decode("utf-8", "surrogatepass")
    if kind == _INT:
        return _I64.unpack(payload)[0]
    if kind == _FLOAT:
        return _F64.unpack(payload)[0]
    return {_TRUE: True, _FALSE: False, _NONE: None, _ABSENT: ABSENT}[kind]


class ValueBoard:
    """One slot per generation-table slot, in a file shared by every process.

    Created like the table (temporary file published with ``link()``, 0o600);
    an existing board's header wins over ``value_bytes``.
    """

    __slots__ = ("_mm", "max_value", "path", "slot_size", "slots")

    def __init__(self, path: str, slots: int, value_bytes: int = 512) -> None:
        slot_size = (value_bytes + _SLOT_HEAD.size + 7) // 8 * 8
        fd = self._open_or_create(path, slots, slot_size)
        try:
            size = os.fstat(fd).st_size
            if size < _HEADER:
                raise ValueError(f"{path} is too small to be a value board")
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        magic, fmt, file_slot_size, file_slots = _HEAD.unpack_from(mm, 0)
        if (magic != _MAGIC or fmt != 1 or file_slots != slots or file_slot_size < _SLOT_HEAD.size
                or size < _HEADER + file_slots * file_slot_size):
            mm.close()
            raise ValueError(f"{path} is not a value board for {slots} slots")
        self._mm = mm
        self.path = path
        self.slots = slots
        self.slot_size = file_slot_size
        self.max_value = file_slot_size - _SLOT_HEAD.size

    @staticmethod
    def _open_or_create(path: str, slots: int, slot_size: int) -> int:
        with contextlib.suppress(FileNotFoundError):
            return os.open(path, os.O_RDWR | os.O_CLOEXEC)
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".board-", dir=directory)
        try:
            os.ftruncate(fd, _HEADER + slots * slot_size)
            os.pwrite(fd, _HEAD.pack(_MAGIC, 1, slot_size, slots), 0)
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
        finally:
            os.close(fd)
            os.unlink(tmp)
        return os.open(path, os.O_RDWR | os.O_CLOEXEC)

    def write(self, index: int, token: int, epoch: int, expires: float, fp: int, kind: int,
              payload: bytes) -> None:
        """Publish into slot ``index``; the caller holds the table's lock on it
        (``GenerationTable.publish``)."""
        mm = self._mm
        at = _HEADER + index * self.slot_size
        _U64.pack_into(mm, at, 0)  # busy: readers that see 0 or a changed token back off
        _SLOT_HEAD.pack_into(mm, at, 0, epoch, expires, fp, kind, 0, len(payload))
        end = at + _SLOT_HEAD.size
        mm[end:end + len(payload)] = payload
        _U64.pack_into(mm, at, token)

    def fetch(self, index: int, token: int, epoch: int, fp: int) -> tuple[Any, float]:
        """(value, L2 expiry) published in slot ``index`` under exactly this
        token, epoch and key fingerprint (value ``ABSENT`` for a published
        delete); ``(NOT_PUBLISHED, 0.0)`` if there is none."""
        mm = self._mm
        at = _HEADER + index * self.slot_size
        b_token, b_epoch, expires, b_fp, kind, _, length = _SLOT_HEAD.unpack_from(mm, at)
        if b_token != token or b_epoch != epoch or b_fp != fp or not kind:
            return NOT_PUBLISHED, 0.0
        start = at + _SLOT_HEAD.size
        payload = mm[start:start + length]
        if _U64.unpack_from(mm, at)[0] != token:  # a writer came by while we copied
            return NOT_PUBLISHED, 0.0
        if kind == _BYTES:
            return payload, expires
        try:
            return _decode(kind, payload), expires
        except (KeyError, UnicodeDecodeError, struct.error):
            return NOT_PUBLISHED, 0.0

    def close(self) -> None:
        self._mm.close()
