"""How a generation table gets its memory: the file at a path, mapped shared, or
anonymous memory for a table that has no file.

Why apart from ``table_file.py``: opening, settling and mapping a file is the
same few steps for the first mapping and for every file a process moves to
later (a replaced or deleted file, a pending table that finds one), each with
the descriptor closed again on any failure and, for a move, the header words
the process relies on carried over; the checks and repairs that decide *when*
to move are ``TableFile``'s.

This module imports nothing from Django.
"""

from __future__ import annotations

import mmap
import os
from typing import NamedTuple

from djcachebench.coherence.layout import (
    EPOCH_AT,
    FORMAT,
    HEAD,
    MAGIC,
    SLOT,
    STAMPER_AT,
    U64,
    WATCHED_AT,
    file_size,
    header_bytes,
    settle,
)
from djcachebench.coherence.shared_file import open_shared_file
from djcachebench.coherence.tokens import tokens

__all__ = ["MappedFile", "map_again", "map_table_file", "private_mapping"]


class MappedFile(NamedTuple):
    """An opened table file and its shared mapping."""

    fd: int
    mm: mmap.mmap
    file_id: tuple[int, int]  # (st_dev, st_ino): which file at the path was mapped
    slots: int


def _mapped(fd: int, slots: int) -> MappedFile:
    mm = mmap.mmap(fd, file_size(slots), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    st = os.fstat(fd)
    return MappedFile(fd, mm, (st.st_dev, st.st_ino), slots)


def map_table_file(path: str, slots: int) -> tuple[MappedFile, bool]:
    """Open the table file at ``path`` (created if missing, mode 0o600, parent
    directories 0o700), settle it and map it. ``slots`` only matters if the
    file is created; the flag says whether its header had to be rewritten
    (``layout.settle``)."""
    fd = open_shared_file(path, file_size(slots), header_bytes(slots))
    try:
        file_slots, rebuilt = settle(fd, path, slots)
        return _mapped(fd, file_slots), rebuilt
    except BaseException:
        os.close(fd)
        raise


def map_again(path: str, slots: int, old: mmap.mmap, claims: set[int]) -> MappedFile:
    """Open and map the table file at ``path`` now (creating it if it is
    gone), for a process that moves to it from the mapping ``old``; or
    ``OSError``/``ValueError``. Never recreates a directory someone removed
    (a deleted LOCATION must stay deleted, and fail softly, rather than come
    back empty).

    Before the new file is used, the header words (``WATCHED_AT``,
    ``STAMPER_AT``) that this process (``claims``, ``TableFile.claim``) or the
    file it leaves had set are set in it too: another process may rely on them
    and not have noticed the move yet.

    A file with another slot count is refused: this process stamps no key
    there; but what it writes must still end every entry read under the
    file the others use, so each refusal (one per check, and each write
    makes one after its L2 write) gives that file a new epoch.
    """
    fd = open_shared_file(path, file_size(slots), header_bytes(slots), make_dirs=False)
    try:
        found, _ = settle(fd, path, slots)
        if found != slots:
            os.pwrite(fd, U64.pack(tokens.next()), EPOCH_AT)
            raise ValueError(f"the file has {found} slots, this process {slots}")
        moved = _mapped(fd, found)
    except BaseException:
        os.close(fd)
        raise
    for word in (WATCHED_AT, STAMPER_AT):
        claimed = word in claims or U64.unpack_from(old, word)[0]
        if claimed and not U64.unpack_from(moved.mm, word)[0]:
            U64.pack_into(moved.mm, word, 1)
    return moved


def private_mapping(slots: int) -> mmap.mmap:
    """Anonymous, ``MAP_PRIVATE`` memory laid out as a table of ``slots`` (header
    written, epoch 0): a forked child gets a copy-on-write copy, and anonymous
    memory cannot be truncated."""
    mm = mmap.mmap(-1, file_size(slots), flags=mmap.MAP_PRIVATE)
    HEAD.pack_into(mm, 0, MAGIC, FORMAT, SLOT, slots)
    return mm
