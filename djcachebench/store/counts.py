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

Why the file is allocated and its size checked: a page of a shared mapping
past the end of its file kills the process that touches it with SIGBUS. The
file is allocated before it is mapped (no page unbacked when the disk fills),
and at most every ``CHECK_EVERY`` seconds its size is compared with the
mapping's: a file cut short from outside is given its length back (its lost
counts read as zero until the next write of each shard) before the mapping is
touched again. A file that cannot be had at all (a directory in its place, no
room, no permission) is replaced by a private mapping, logged: culling then
sees only this process's copies of the counts, and still recounts from the
shards before it deletes anything. As for the other shared files, a cut that
a process touches within ``CHECK_EVERY`` of it still kills that process.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import threading
import time

from ..coherence.shared_file import SharedFileError, allocate, regrow

_SLOT = struct.Struct("<qq")  # (entries, bytes)
#: How long a passed size check of the file stands in a process (seconds).
CHECK_EVERY = 0.002

log = logging.getLogger("djcachebench.sqlite")


class ShardCounts:
    """``entries`` and ``bytes`` per shard, shared by every process on the host."""

    def __init__(self, path: str, shards: int) -> None:
        self.shards = shards
        self.path = path
        # One more slot after the shards': the cull's outstanding debt (eviction.py).
        self._size = _SLOT.size * (shards + 1)
        self._fd = -1
        self._check_at = 0.0
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            allocate(self._fd, self._size)
            self._map = mmap.mmap(self._fd, self._size, mmap.MAP_SHARED,
                                  mmap.PROT_READ | mmap.PROT_WRITE)
        except (OSError, SharedFileError, ValueError) as exc:
            self._go_private(exc)
        self._offsets = [i * _SLOT.size for i in range(shards)]
        self._debt_at = shards * _SLOT.size

    def _go_private(self, exc: Exception) -> None:
        """Counts in this process only, from now on (see the module docstring)."""
        log.error("shard counts %s unusable (%s); this process counts privately",
                  self.path, exc)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._map = mmap.mmap(-1, self._size)

    def _whole(self) -> mmap.mmap:
        """The mapping, once the file under it is known to be long enough."""
        now = time.monotonic()
        if now < self._check_at or self._fd < 0:
            return self._map
        self._check_at = now + CHECK_EVERY
        try:
            if regrow(self._fd, self._size):
                log.warning("%s was cut short; gave it its length back", self.path)
        except OSError as exc:  # SharedFileError too: no room to regrow it
            old = self._map
            self._go_private(exc)
            old.close()
        return self._map

    def debt(self) -> int:
        """Entries a cull decided to remove and has not removed yet."""
        return _SLOT.unpack_from(self._whole(), self._debt_at)[0]

    def set_debt(self, entries: int) -> None:
        """Under the cull lock (eviction.py), one writer of the slot at a time; or 0
        by ``clear()``, without it: a cull racing that is capped by the count."""
        _SLOT.pack_into(self._whole(), self._debt_at, entries, 0)

    def store(self, shard: int, entries: int, nbytes: int) -> None:
        _SLOT.pack_into(self._whole(), self._offsets[shard], entries, nbytes)

    def load(self, shard: int) -> tuple[int, int]:
        return _SLOT.unpack_from(self._whole(), self._offsets[shard])

    def total(self) -> tuple[int, int]:
        entries = nbytes = 0
        unpack = _SLOT.unpack_from
        m = self._whole()
        for off in self._offsets:
            e, b = unpack(m, off)
            entries += e
            nbytes += b
        return entries, nbytes

    def close(self) -> None:
        self._map.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


_open: dict[tuple[str, int], ShardCounts] = {}
_open_lock = threading.Lock()


def open_counts(path: str, shards: int) -> ShardCounts:
    """The process's one :class:`ShardCounts` for ``path`` and a shard count.

    Why shared: Django builds a cache instance per thread, and each kept its own
    descriptor and mapping of the file for as long as the instance lived, a
    cycle freed only by a full collection. A process whose threads come and go
    (a thread per request) ran out of descriptors, and every shard open then
    failed (found by an independent attacker: 200 threads, 200 descriptors).
    The file is shared memory anyway: one mapping per process serves them all.
    A private fallback (``_go_private``) is kept too: another instance's retry
    would only find the same fault.
    """
    ident = (os.path.realpath(path), shards)
    with _open_lock:
        counts = _open.get(ident)
        if counts is None:
            counts = _open[ident] = ShardCounts(path, shards)
        return counts


def _after_fork_in_child() -> None:
    # The mappings stay valid in a child (MAP_SHARED); only the lock is fresh.
    global _open_lock
    _open_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
