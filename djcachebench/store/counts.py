"""A shared-memory table of per-shard entry counts and byte totals, and the
floors below which a failed write left a key's rows void.

Why: ``MAX_ENTRIES`` is counted across all shards (Django's culling tests
must pass with any shard count), so a write that may add a key needs the
total number of entries. Asking every shard file costs one query per shard on
every set; instead each shard's exact count lives in the shard itself (kept by
triggers, so it is transactional), and a copy of it lives in this mmap'd file,
never below the committed count: a write that adds copies it from inside its
transaction, removals are copied by culling after their commit
(``statements.SQL_COUNT_TRIGGERS``). The total is then a sum of N integers in
memory. The copy is an absolute value, not an increment, so a copy left too
high (a rolled-back write, a delete) lasts only until the next write that adds
to that shard, and culling recounts from the shards before it deletes anything.

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

Why the file's identity is checked too: a file deleted or replaced under
running processes (an operator's ``rm``, a temp-file cleaner) left them on the
old file while every process started since used a new one: two sets of
counts, and two sets of floors, so a failed write's floor in one was missed
by readers of the other, who served the value it meant to replace. Each size
check also compares the path's inode with the mapped one, and a process that
finds it changed moves to the file at the path (making it if it is gone),
carrying the floors over (the highest of both per slot) and the counts of the
shards the new file has none for; a process that raises floors confirms the
file at once, and also raises them in the file it left (readers that have not
moved yet read that one for at most ``CHECK_EVERY``).

Why floors (the region after the counts): a write can fail while reads still
work (a full disk, a shard whose lock a stopped process holds, an I/O error on
write). Django's ``set`` has no result and ``delete``'s False also means
"absent", so the caller goes on as if the write had happened, while every read
would go on serving the value it meant to replace or remove. Removing that row
needs the same write that just failed. So the failing process writes the time
of the failure into the floor of the key's slot (``crc32(key) % slots``, a
slot per key group, as a lock striped over keys), and every read and every
write that reads treats a row stored at or before its slot's floor as absent.
A later successful write stores a newer row, which is live again. The floors
live in shared memory (nothing to write to the full disk); raising one takes a
record lock on the region (bounded wait), so that two processes raising the
same slot cannot lower it. ``slots`` is a multiple of the shard count, so the
slots of shard ``i`` are ``i, i + shards, ...`` (a ``clear`` that failed on a
shard voids them all).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import struct
import threading
import time
import weakref
from collections.abc import Iterable, Iterator

from ..coherence.registry import Registry, own_descriptor
from ..coherence.shared_file import SharedFileError, allocate, regrow

_SLOT = struct.Struct("<qq")  # (entries, bytes)
_FLOOR = struct.Struct("<q")  # time.time_ns() of the last failed write of the slot's keys
#: About how many floor slots a cache has (a multiple of its shard count).
FLOOR_SLOTS = 65536
#: The latest floor a failed write raises: a row whose ``stored`` time was
#: altered past it (by hand: the engine writes the clock) is clipped to it, so
#: a floor and the write time just past it stay int64s.
LATEST_FLOOR = 1 << 62
#: How long raising floors waits for another process's raise (seconds): past
#: it the floors are raised anyway (a stopped process must not stop this one).
FLOOR_LOCK_WAIT = 0.05
#: How long a passed size check of the file stands in a process (seconds).
CHECK_EVERY = 0.002

log = logging.getLogger("djcachebench.sqlite")


class ShardCounts:
    """``entries`` and ``bytes`` per shard, shared by every process on the host."""

    def __init__(self, path: str, shards: int) -> None:
        self.shards = shards
        self.path = path
        # One more slot after the shards': the cull's outstanding debt (eviction.py).
        # Then the floors (module docstring): after what an older version maps.
        self.slots = shards * max(1, FLOOR_SLOTS // shards)
        self._floors_at = _SLOT.size * (shards + 1)
        # One more int64 after the floors: the highest of them, so that a batch
        # read checks each key's floor only for rows no newer than that. And a
        # last one: the shard count the file was laid out for. Files of some
        # other counts have the same length (4 and 6 shards, say), and put that
        # word at the same offset: the count tells them apart where the length
        # cannot.
        self._layout_at = self._floors_at + _FLOOR.size * (self.slots + 1)
        self._size = self._layout_at + _FLOOR.size
        self._floor_lock = threading.RLock()
        self._fd = -1
        self._closer: weakref.finalize | None = None
        self._check_at = 0.0
        self._file_id: tuple[int, int] | None = None
        self._moved_to_missing = False
        # Mappings of files this process moved away from, newest last: readers
        # of other threads may still hold their views; the newest is also where
        # raise_floors reaches readers that have not moved yet.
        self._retired: list[tuple[mmap.mmap, memoryview]] = []
        self._offsets = [i * _SLOT.size for i in range(shards)]
        self._debt_at = shards * _SLOT.size
        try:
            self._fd, self._map = self._map_path()
            self._closer = own_descriptor(self, self._fd)
        except (OSError, SharedFileError, ValueError) as exc:
            self._go_private(exc)
        self._view()

    def _map_path(self, moving: bool = False) -> tuple[int, mmap.mmap]:
        """Open (making it if it is gone), allocate and map the file at the path;
        records its identity. ``OSError``, ``SharedFileError`` or ``ValueError``.

        A file laid out for another shard count (its last word), whose slots and
        floors sit at other offsets, is a ``ValueError``. ``moving``: the file
        replaced the one this process had, and must also have this layout's
        length: carried over, this process's counts would land in another
        layout's floors. The manifest's check ends that process's or this one's
        use of the directory (layout.py)."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            if moving:
                size = os.fstat(fd).st_size
                if size not in (0, self._size):
                    raise ValueError(f"it is {size} bytes long, not the {self._size} of "
                                     f"a {self.shards}-shard cache's counts")
            allocate(fd, self._size)
            mapping = mmap.mmap(fd, self._size, mmap.MAP_SHARED,
                                mmap.PROT_READ | mmap.PROT_WRITE)
            laid_out = _FLOOR.unpack_from(mapping, self._layout_at)[0]
            if laid_out not in (0, self.shards):
                mapping.close()
                raise ValueError(f"it was laid out for {laid_out} shards, not {self.shards}")
            if not laid_out:  # new, or made by a version that did not say
                _FLOOR.pack_into(mapping, self._layout_at, self.shards)
            st = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        self._file_id = (st.st_dev, st.st_ino)
        return fd, mapping

    def _go_private(self, exc: Exception) -> None:
        """Counts in this process only, from now on (see the module docstring)."""
        log.error("shard counts %s unusable (%s); this process counts privately",
                  self.path, exc)
        self._close_fd()
        self._map = mmap.mmap(-1, self._size)

    def _view(self) -> None:
        # The floors as int64s: a read is an index (the read path takes one per
        # get), not a struct unpack.
        self._floors = memoryview(self._map)[self._floors_at:].cast("q")

    def _whole(self) -> mmap.mmap:
        """The mapping, once the file under it is known to be long enough and
        still the one at the path."""
        now = time.monotonic()
        if now < self._check_at or self._fd < 0:
            return self._map
        self._check_at = now + CHECK_EVERY
        if not self._same_file():
            self._move()
            if self._fd < 0:
                return self._map
        try:
            if regrow(self._fd, self._size):
                log.warning("%s was cut short; gave it its length back", self.path)
        except OSError as exc:  # SharedFileError too: no room to regrow it
            with self._floor_lock:
                self._retire()
                self._go_private(exc)
                self._view()
        return self._map

    def _same_file(self) -> bool:
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._file_id

    def _move(self) -> None:
        """The file was deleted or replaced under this process: use the one at
        the path from now on, with this process's floors (the higher of both
        per slot) and the counts the new file lacks. If no file can be had
        there (its directory was removed), or the one there is another
        layout's, stay on the mapping this process has: the processes that
        share it still share it."""
        with self._floor_lock:
            if self._fd < 0 or self._same_file():
                return
            old_id = self._file_id
            try:
                fd, mapping = self._map_path(moving=True)
            except (OSError, SharedFileError, ValueError) as exc:
                self._file_id = old_id
                if not self._moved_to_missing:
                    log.warning("%s was replaced by a file this process cannot use, or "
                                "is gone and cannot be made again (%s); this process "
                                "keeps the file it has", self.path, exc)
                    self._moved_to_missing = True
                return
            self._moved_to_missing = False
            floors = memoryview(mapping)[self._floors_at:].cast("q")
            with self._floors_locked(fd):
                self._carry(self._map, self._floors, mapping, floors)
            old_closer = self._closer
            self._retire()
            self._fd, self._map, self._floors = fd, mapping, floors
            self._closer = own_descriptor(self, fd)
            if old_closer is not None:
                old_closer()  # closes the old descriptor
        log.warning("%s was deleted or replaced under this process; now using the file "
                    "at that path (floors and counts carried over)", self.path)

    def _carry(self, old: mmap.mmap, old_floors: memoryview, new: mmap.mmap,
               new_floors: memoryview) -> None:
        for off in self._offsets:
            if _SLOT.unpack_from(new, off) == (0, 0):
                _SLOT.pack_into(new, off, *_SLOT.unpack_from(old, off))
        if not old_floors[self.slots]:
            return  # no floor was ever raised in the old file
        for slot in range(self.slots + 1):
            if new_floors[slot] < old_floors[slot]:
                new_floors[slot] = old_floors[slot]

    def _retire(self) -> None:
        """Keep the current mapping for readers that still hold it (two at most:
        a read does not span two moves, each at least ``CHECK_EVERY`` apart)."""
        self._retired.append((self._map, self._floors))
        while len(self._retired) > 2:
            mapping, view = self._retired.pop(0)
            view.release()
            with contextlib.suppress(BufferError):
                mapping.close()

    def debt(self) -> int:
        """Entries a cull decided to remove and has not removed yet."""
        return _SLOT.unpack_from(self._whole(), self._debt_at)[0]

    def set_debt(self, entries: int) -> None:
        """Under the cull lock (eviction.py), one writer of the slot at a time; or 0
        by ``clear()``, without it: a cull racing that is capped by the count."""
        _SLOT.pack_into(self._whole(), self._debt_at, entries, 0)

    def store(self, shard: int, entries: int, nbytes: int) -> None:
        # int(): sums over a row whose size another program altered to a REAL.
        _SLOT.pack_into(self._whole(), self._offsets[shard], int(entries), int(nbytes))

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

    def floor(self, crc: int) -> int:
        """The floor of the slot of a key whose ``zlib.crc32`` is ``crc``: its
        rows stored (``time.time_ns()``) at or before it are void."""
        if time.monotonic() >= self._check_at:
            self._whole()
        return self._floors[crc % self.slots]  # type: ignore[no-any-return]

    def void(self, crc: int, stored: int) -> bool:
        """Is a row stored at ``stored`` (``time.time_ns()``) of a key whose
        ``zlib.crc32`` is ``crc`` void? The read path's one call: the highest
        floor first (one word every read shares), the key's slot only for a
        row no newer than it, so a cache that never failed a write does not
        touch the slots (a random word of half a megabyte per read)."""
        if time.monotonic() >= self._check_at:
            self._whole()
        floors = self._floors
        return stored <= floors[self.slots] and stored <= floors[crc % self.slots]  # type: ignore[no-any-return]

    def highest_floor(self) -> int:
        """The highest floor of any slot: a row stored after it is void nowhere."""
        if time.monotonic() >= self._check_at:
            self._whole()
        return self._floors[self.slots]  # type: ignore[no-any-return]

    def raise_floors(self, slots: Iterable[int], at: int) -> None:
        """Void the rows stored at or before ``at`` of every key of ``slots``.

        Read, compare and write under the region's record lock: without it a
        process raising a slot to an earlier time could write over a later one.
        Then the file is confirmed (uncached): if it was replaced, this process
        moves to the new one, carrying what it just raised."""
        slots = [slot % self.slots for slot in slots]
        with self._floor_lock:
            self._whole()
            with self._floors_locked(self._fd):
                _raise(self._floors, slots, at, self.slots)
            if self._retired and self._fd >= 0:
                # Readers that have not noticed a move yet read the old file.
                _raise(self._retired[-1][1], slots, at, self.slots)
            if self._fd >= 0 and not self._same_file():
                self._move()

    @contextlib.contextmanager
    def _floors_locked(self, fd: int) -> Iterator[None]:
        length = _FLOOR.size * self.slots
        locked = False
        if fd >= 0:
            give_up = time.monotonic() + FLOOR_LOCK_WAIT
            while True:
                try:
                    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, length, self._floors_at)
                    locked = True
                    break
                except OSError:
                    if time.monotonic() >= give_up:
                        log.warning("floors of %s stayed locked; raised without the lock",
                                    self.path)
                        break
                    time.sleep(0.001)
        try:
            yield
        finally:
            if locked:
                with contextlib.suppress(OSError):
                    fcntl.lockf(fd, fcntl.LOCK_UN, length, self._floors_at)

    def close(self) -> None:
        for mapping, view in [*self._retired, (self._map, self._floors)]:
            view.release()
            mapping.close()
        self._retired.clear()
        self._close_fd()

    def _close_fd(self) -> None:
        if self._closer is not None:
            self._closer()
            self._closer = None
        self._fd = -1


def _raise(floors: memoryview, slots: list[int], at: int, highest: int) -> None:
    for slot in slots:
        if floors[slot] < at:
            floors[slot] = at
    if floors[highest] < at:
        floors[highest] = at


_open: Registry[tuple[str, int], ShardCounts] = Registry()  # a child keeps the mappings


def open_counts(path: str, shards: int) -> ShardCounts:
    """The process's one :class:`ShardCounts` for ``path`` and a shard count.

    Why shared: Django builds a cache instance per thread, and each would keep
    its own descriptor and mapping of the file for as long as the instance
    lived, a cycle freed only by a full collection. A process whose threads
    come and go (a thread per request) would run out of descriptors (one per
    thread), and every shard open would then fail.
    The file is shared memory anyway: one mapping per process serves them all,
    while anything uses it (``coherence/registry.py``).
    A private fallback (``_go_private``) is kept too: another instance's retry
    would only find the same fault.
    """
    ident = (os.path.realpath(path), shards)
    with _open.lock:
        counts = _open.find(ident)
        if counts is None:
            counts = _open.add(ident, ShardCounts(path, shards))
        return counts
