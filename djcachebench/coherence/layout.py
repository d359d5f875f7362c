"""The generation table's file format, and how a damaged file is made whole.

Kept apart from the table's protocol: which bytes mean what (one owner for a
layout that the hot path of TieredCache reads inline, see ``TOKEN`` and
``EPOCH_OFFSET``), and the rules for a file whose header was overwritten or
that was truncated: its slot count comes from its size, its header is
rewritten with a fresh epoch and the watched word set, and a file without a
table's shape is refused, never overwritten.

This module imports nothing from Django.
"""

from __future__ import annotations

import logging
import os
import stat
import struct
import time
from typing import Final

from djcachebench.coherence.shared_file import (
    SharedFileError,
    allocate,
    ancestry_problem,
    lock_range,
    read_kept,
    unlock_range,
)
from djcachebench.coherence.tokens import tokens

log = logging.getLogger("djcachebench.coherence")

MAGIC: Final = b"DJCBGEN3"
FORMAT: Final = 3
HEADER: Final = 64  # magic(8) format(u32) slot_size(u32) slots(u64) epoch(u64) watched(u64)
#                     stamper(u64) breaker(u64) probe(u64)
EPOCH_AT: Final = 24
WATCHED_AT: Final = 32  # non-zero once any reader has relied on the table
#: Non-zero when a storage engine stamps the table from inside its write
#: transactions (``coherence.stamper``): nobody else may stamp it then.
STAMPER_AT: Final = 40
#: TieredCache's circuit breaker for the L2 whose table this is
#: (``tiered/breaker.py``): until when it is open, and until when a probe is
#: under way, in wall-clock nanoseconds (0: closed, no probe). Shared by every
#: process of the host; a header rebuilt zeroes neither (it writes 48 bytes).
BREAKER_AT: Final = 48
PROBE_AT: Final = 56
#: A slot: stamp(u64), written after a write committed; mark(u64), written
#: inside the write's transaction by an engine stamper (0 in tables that the
#: adapter stamps). A reader's token holds both; either changing ends it.
SLOT: Final = 16
MARK: Final = 8  # the mark's offset in its slot
HEAD = struct.Struct("<8sIIQ")
U64 = struct.Struct("<Q")
#: For a reader that inlines ``GenerationTable.is_current`` on its hot path:
#: ``token`` is current iff ``TOKEN.unpack_from(buffer, token[0]) == token[2]``
#: and ``U64.unpack_from(buffer, EPOCH_OFFSET)[0] == token[1]``.
TOKEN = struct.Struct("<QQ")
EPOCH_OFFSET: Final = EPOCH_AT


def file_size(slots: int) -> int:
    return HEADER + slots * SLOT


def header_bytes(slots: int) -> bytes:
    return HEAD.pack(MAGIC, FORMAT, SLOT, slots)


def header_slots(header: bytes, size: int) -> int | None:
    """The slot count of an intact header that agrees with the file's size, else None."""
    if len(header) < HEADER:
        return None
    magic, fmt, slot_size, slots = HEAD.unpack_from(header, 0)
    if magic != MAGIC or fmt != FORMAT or slot_size != SLOT or not slots:
        return None
    if size != file_size(slots):
        return None
    return int(slots)


def file_problem(path: str) -> str | None:
    """Why the file at ``path`` cannot serve as a generation table, or None (a
    table, or nothing there yet). For system checks: it never blocks or writes."""
    above = ancestry_problem(path)
    if above is not None:
        return f"cannot be trusted: {above}, so another user could replace it"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be inspected ({exc.strerror})"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return f"is owned by uid {st.st_uid} or writable by others (mode {st.st_mode & 0o777:o})"
    if st.st_size == 0:
        return None  # made whole by the first process that opens it
    try:
        # Never through a descriptor closed again: this process may hold record
        # locks on the table (its stamps, its repairs), and closing any
        # descriptor of the file drops them all (``read_kept``).
        head = read_kept(path, HEADER)
    except SharedFileError:
        return "is not a regular file"
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    size = st.st_size
    if header_slots(head, size) is None and not (size > HEADER and (size - HEADER) % SLOT == 0):
        return f"is not a djcachebench generation table ({size} bytes)"
    return None


def rewrite_header(fd: int, slots: int, why: str) -> None:
    """Size and allocate the file for ``slots`` and write a fresh header (new
    epoch, watched set: nobody can tell who relied on the old one); logged."""
    size = file_size(slots)
    if os.fstat(fd).st_size != size:
        os.ftruncate(fd, size)
    allocate(fd, size)
    os.pwrite(fd, header_bytes(slots) + U64.pack(tokens.next()) + U64.pack(1) + U64.pack(0),
              0)
    log.warning("%s", why)


def settle(fd: int, path: str, default_slots: int) -> tuple[int, bool]:
    """Validate an opened table file, rebuilding its header if needed.

    Returns ``(slots, rebuilt)``. The slot count comes from the header when it
    is intact and agrees with the file's size; otherwise from the size. Blocks
    are allocated before anything maps them.
    """
    if not lock_range(fd, HEADER, 0, time.monotonic() + 1.0):
        raise SharedFileError(0, f"{path}: the header stayed locked for 1 s")
    try:
        size = os.fstat(fd).st_size
        slots = header_slots(os.pread(fd, HEADER, 0), size)
        rebuilt = slots is None
        if slots is None:
            # A table whose header was overwritten (or left by an older
            # format) still has a table's size; an emptied one has none.
            # Anything else may be somebody's data: refuse, never overwrite.
            if size == 0:
                slots = default_slots
            elif size > HEADER and (size - HEADER) % SLOT == 0:
                slots = (size - HEADER) // SLOT
            else:
                raise ValueError(f"{path} is not a djcachebench generation table "
                                 f"({size} bytes)")
            rewrite_header(fd, slots, f"{path}: the header was not a valid generation "
                           f"table's (format {FORMAT}); rebuilt it")
        allocate(fd, file_size(slots))
        return slots, rebuilt
    finally:
        unlock_range(fd, HEADER, 0)
