"""A shared-memory table of per-shard entry counts and byte totals.

Why: ``MAX_ENTRIES`` is counted across all shards (Django's culling tests
must pass with any shard count), so a write that may add a key needs the
total number of entries. Asking every shard file costs one query per shard on
every set; instead each shard's exact count lives in the shard itself (kept by
triggers, so it is transactional), and after each write the writer copies its
shard's count into this mmap'd file. The total is then a sum of N integers in
memory. The copy is an absolute value, not an increment, so a process that
dies between commit and copy leaves it stale only until the next write to
that shard, and culling recounts from the shards before it deletes anything.
"""

from __future__ import annotations

import mmap
import os
import struct

_SLOT = struct.Struct("<qq")  # (entries, bytes)


class ShardCounts:
    """``entries`` and ``bytes`` per shard, shared by every process on the host."""

    def __init__(self, path: str, shards: int) -> None:
        self.shards = shards
        # One more slot after the shards': the cull's outstanding debt (eviction.py).
        size = _SLOT.size * (shards + 1)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._offsets = [i * _SLOT.size for i in range(shards)]
        self._debt_at = shards * _SLOT.size

    def debt(self) -> int:
        """Entries a cull decided to remove and has not removed yet."""
        return _SLOT.unpack_from(self._map, self._debt_at)[0]

    def set_debt(self, entries: int) -> None:
        """Only under the cull lock (eviction.py): one writer of the slot at a time."""
        _SLOT.pack_into(self._map, self._debt_at, entries, 0)

    def store(self, shard: int, entries: int, nbytes: int) -> None:
        _SLOT.pack_into(self._map, self._offsets[shard], entries, nbytes)

    def load(self, shard: int) -> tuple[int, int]:
        return _SLOT.unpack_from(self._map, self._offsets[shard])

    def total(self) -> tuple[int, int]:
        entries = nbytes = 0
        unpack = _SLOT.unpack_from
        m = self._map
        for off in self._offsets:
            e, b = unpack(m, off)
            entries += e
            nbytes += b
        return entries, nbytes

    def close(self) -> None:
        self._map.close()
