"""The host-wide counters file: a row per live process, and the totals of the departed.

Layout (native 64-bit words; the file never leaves its host)::

    word 0      magic ``DJCBSTAT``
    word 1      format version (low 32 bits) | counters << 32
    word 2      slots
    word 3      a random number drawn when the file is made (its identity)
    words 4-7   reserved
    bytes 64..  the counters' names, ASCII, newline-separated, zero-padded
                to ``NAMES_BYTES``
    retired     one word per counter: what departed processes counted
    slots       per slot: pid, process start time, reserved, then one word
                per counter: what the slot's process counted so far

Why a slot per process and not shared sums: Python has no atomic add on a
mapping. A slot has one writer, its process, which writes its absolute totals
(never increments) without a lock: an aligned word is written whole, so a
reader sees each counter at one of its values, and never below an earlier one.
Readers sum the retired row and every slot.

Why a record lock on the header: a slot whose process is gone (no such pid,
or a pid reused by a process started at another time) is folded into the
retired row and freed by the next process that claims a slot; a process that
exits folds its own. Folding writes two places, so claims, folds and readers'
sums take the header's lock (a bounded wait): a reader never sees a slot both
folded and still there (a sum that later goes down), nor neither.

Why the record lock is taken under a lock of this process as well, and a
descriptor of the file closed only while no thread of the process holds it:
record locks belong to the process, not to a descriptor or a thread
(``_SECTION``).

Why the file is opened anew by each flush and each read instead of kept
mapped: a process then never holds a mapping of a file that was cut or
replaced between two flushes (the size is checked before the mapping is
made, and the file at the path is the one written), and holds no descriptor
for it. A file whose header is not one this module writes is "stats
unavailable" (``StatsFileError``), never a failed cache call; one cut to
nothing and given its length back (all zeros) gets its header again.

This module imports nothing from Django.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import struct
import time
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from djcachebench.coherence.shared_file import (
    SharedFileError,
    allocate,
    fork_safe_lock,
    lock_range,
    open_existing_shared_file,
    open_shared_file,
    regrow,
    unlock_range,
)

__all__ = ["FORMAT", "MAGIC", "SLOTS", "HostTotals", "StatsFile", "StatsFileError",
           "process_identity", "read_totals"]

log = logging.getLogger("djcachebench.stats")

MAGIC = int.from_bytes(b"DJCBSTAT", "little")
FORMAT = 1
#: Processes with a slot of their own; more than that add to the retired row
#: under the lock at each flush instead.
SLOTS = 256
NAMES_BYTES = 1024
MAX_COUNTERS = 64
_HEADER_WORDS = 8
_RETIRED_AT = _HEADER_WORDS + NAMES_BYTES // 8  # in words
_OWNER_WORDS = 3  # pid, start time, reserved
#: How long a claim, a fold or a reader waits for the header's lock (seconds).
LOCK_WAIT = 0.05
_LOCK_LEN = _HEADER_WORDS * 8


class StatsFileError(OSError):
    """The counters file cannot be had or is not one this module writes."""


class HostTotals(NamedTuple):
    """What a reader found: every counter summed over the host, and how many
    processes have a slot now (live or not yet folded)."""

    counters: dict[str, int]
    processes: int


def file_words(counters: int, slots: int) -> int:
    return _RETIRED_AT + counters + slots * (_OWNER_WORDS + counters)


def header_bytes(names: Sequence[str], slots: int) -> bytes:
    # Word 3: drawn at random when the file is made, so that a file made again
    # at the path on a reused inode is still told from the one it replaced.
    head = struct.pack(f"@{_HEADER_WORDS}Q", MAGIC, FORMAT | len(names) << 32, slots,
                       int.from_bytes(os.urandom(8), "little") | 1,
                       *[0] * (_HEADER_WORDS - 4))
    text = "\n".join(names).encode("ascii")
    if len(text) > NAMES_BYTES or len(names) > MAX_COUNTERS:
        raise ValueError("too many counters, or names too long")
    return head + text.ljust(NAMES_BYTES, b"\0")


_start_cache: tuple[int, int] | None = None


def _start_time(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks since boot, from
    ``/proc``): None if there is no such process; 0 where ``/proc`` is not
    there (the pid alone then names the process)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except FileNotFoundError:
        return None if os.path.isdir("/proc/self") else _kill_zero(pid)
    except OSError:
        return 0
    # The command name (field 2) may hold spaces and parentheses: fields
    # after the last ")" are space-separated; starttime is field 22.
    try:
        return int(text[text.rindex(b")") + 2:].split()[19])
    except (ValueError, IndexError):
        return 0


def _kill_zero(pid: int) -> int | None:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except OSError:
        pass  # another user's process: alive
    return 0


def process_identity() -> tuple[int, int]:
    """(pid, start time) of this process: what its slot is claimed under. A
    pid alone is not enough: a process started later may get a dead one's pid."""
    global _start_cache
    pid = os.getpid()
    if _start_cache is None or _start_cache[0] != pid:
        _start_cache = (pid, _start_time(pid) or 0)
    return _start_cache


def _alive(pid: int, start: int) -> bool:
    found = _start_time(pid)
    return found is not None and (found == start or found == 0 or start == 0)


class StatsFile:
    """One opened and mapped counters file (a flush or a read; then closed)."""

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path
        st = os.fstat(fd)
        head = os.pread(fd, 32, 0)
        if head.count(0) == len(head):
            raise _Blank
        if len(head) < 32 or st.st_size < _RETIRED_AT * 8:
            raise StatsFileError(errno.EINVAL, f"{path} is {st.st_size} bytes long: not a "
                                 f"counters file")
        magic, version, slots, nonce = struct.unpack("@4Q", head)
        self.file_id = (st.st_dev, st.st_ino, nonce)
        counters = version >> 32
        if (magic != MAGIC or version & 0xFFFFFFFF != FORMAT or not 0 < counters <= MAX_COUNTERS
                or not 0 < slots <= 1 << 16):
            raise StatsFileError(errno.EINVAL, f"{path} has a header this version does not "
                                 f"write (format {version & 0xFFFFFFFF})")
        text = os.pread(fd, NAMES_BYTES, _HEADER_WORDS * 8).rstrip(b"\0")
        try:
            names = text.decode("ascii").split("\n")
        except UnicodeDecodeError:
            names = []
        if len(names) != counters:
            raise StatsFileError(errno.EINVAL, f"{path} has damaged counter names")
        self.names = names
        self.slots = slots
        self.width = _OWNER_WORDS + counters
        need = file_words(counters, slots) * 8
        # The size is checked before the whole file is mapped: a page past the
        # end of a file kills the process that touches it (SIGBUS). A file cut
        # short gets its length back; the rows cut read as zeros (their counts
        # are lost, and their processes take new rows).
        if st.st_size < need:
            with _locked(fd):
                if regrow(fd, need):
                    log.warning("%s was cut short; gave it its length back", path)
        self._mm = mmap.mmap(fd, need, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.words = memoryview(self._mm).cast("Q")
        self.retired_at = _RETIRED_AT
        self.slots_at = _RETIRED_AT + counters

    # -- opening -------------------------------------------------------------

    @classmethod
    def open(cls, path: str, names: Sequence[str], create: bool = True) -> StatsFile:
        """The counters file at ``path`` (made with ``names`` if missing and
        ``create``; its parent directory must exist). ``StatsFileError`` when
        it cannot be had or is damaged; ``FileNotFoundError`` when it is
        missing and not to be made."""
        size = file_words(len(names), SLOTS) * 8
        try:
            if create:
                fd = open_shared_file(path, size, header_bytes(names, SLOTS), make_dirs=False)
            else:
                fd = open_existing_shared_file(path)
        except FileNotFoundError:
            raise
        except (SharedFileError, OSError) as exc:
            raise StatsFileError(exc.errno or errno.EIO, f"{path}: {exc}") from exc
        try:
            try:
                return cls(fd, path)
            except _Blank:
                if not create:
                    raise
                # Cut to nothing (and perhaps given its length back): no counts
                # are left to lose, so it gets its header again.
                with _locked(fd):
                    allocate(fd, size)
                    if os.pread(fd, 32, 0).count(0) == 32:
                        os.pwrite(fd, header_bytes(names, SLOTS), 0)
                log.warning("%s was cut to nothing; wrote its header again", path)
                return cls(fd, path)
        except _Blank:
            _close(fd)
            if not create:
                raise  # a reader: no counts in it (read_totals)
            raise StatsFileError(errno.EINVAL, f"{path} has a blank header") from None
        except (OSError, ValueError) as exc:
            _close(fd)
            if isinstance(exc, StatsFileError):
                raise
            raise StatsFileError(getattr(exc, "errno", None) or errno.EIO,
                                 f"{path}: {exc}") from exc

    def close(self) -> None:
        words = getattr(self, "words", None)
        if words is not None:
            words.release()
        _close(self.fd, self._mm)

    def __enter__(self) -> StatsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- slots ---------------------------------------------------------------

    def _slot_at(self, slot: int) -> int:
        return self.slots_at + slot * self.width

    def owns(self, slot: int, owner: tuple[int, int]) -> bool:
        at = self._slot_at(slot)
        return slot < self.slots and (self.words[at], self.words[at + 1]) == owner

    def claim(self, owner: tuple[int, int]) -> int | None:
        """A free slot for ``owner`` (dead processes' slots folded first), or
        None when every slot is taken by a live process or the lock stayed
        held."""
        with self.locked() as held:
            if not held:
                return None
            self._fold_dead(owner)
            words = self.words
            for slot in range(self.slots):
                at = self._slot_at(slot)
                if words[at] == 0:
                    for i in range(at + _OWNER_WORDS, at + self.width):
                        words[i] = 0
                    words[at + 1] = owner[1]
                    words[at] = owner[0]
                    return slot
        return None

    def _fold_dead(self, owner: tuple[int, int]) -> None:
        words = self.words
        for slot in range(self.slots):
            at = self._slot_at(slot)
            pid = words[at]
            if pid and (pid, words[at + 1]) != owner and not _alive(pid, words[at + 1]):
                self._fold(at)

    def _fold(self, at: int) -> None:
        """Add a slot's counts to the retired row and free it (lock held)."""
        words = self.words
        for i in range(self.width - _OWNER_WORDS):
            words[self.retired_at + i] += words[at + _OWNER_WORDS + i]
            words[at + _OWNER_WORDS + i] = 0
        words[at] = words[at + 1] = 0

    def write(self, slot: int, columns: Sequence[int], values: Sequence[int]) -> None:
        """This process's totals into its slot: one aligned word each."""
        words = self.words
        at = self._slot_at(slot) + _OWNER_WORDS
        for col, value in zip(columns, values, strict=True):
            if col >= 0 and words[at + col] != value:
                words[at + col] = value

    def add_retired(self, columns: Sequence[int], deltas: Sequence[int]) -> bool:
        """For a process without a slot: add its new counts to the retired row."""
        with self.locked() as held:
            if not held:
                return False
            words = self.words
            for col, delta in zip(columns, deltas, strict=True):
                if col >= 0 and delta:
                    words[self.retired_at + col] += delta
        return True

    def release(self, slot: int, owner: tuple[int, int]) -> bool:
        """Fold this process's slot into the retired row (it is exiting, or
        stops using the cache)."""
        with self.locked() as held:
            if held and self.owns(slot, owner):
                self._fold(self._slot_at(slot))
                return True
        return False

    def totals(self) -> HostTotals:
        """Every counter summed: the retired row and every slot, under the lock
        (without it, if a stopped process holds it: a fold under way may then
        show up twice or not at all in this one reading)."""
        with self.locked():
            words = self.words
            n = len(self.names)
            sums = list(words[self.retired_at:self.retired_at + n])
            processes = 0
            for slot in range(self.slots):
                at = self._slot_at(slot)
                if not words[at]:
                    continue  # free: its counts were folded, or it never had any
                processes += 1
                for i in range(n):
                    sums[i] += words[at + _OWNER_WORDS + i]
        return HostTotals(dict(zip(self.names, sums, strict=True)), processes)

    @contextlib.contextmanager
    def locked(self) -> Iterator[bool]:
        with _locked(self.fd) as held:
            yield held


class _Blank(Exception):
    """A header of zeros: a file cut to nothing, or not written yet."""


#: Held by the thread of this process that holds (or is taking) the header's
#: record lock of a counters file. Record locks belong to the process: two
#: threads would both "hold" one at once, the first to unlock would release it
#: under the other, and closing ANY descriptor of the file (each flush and each
#: read opens its own) drops it as well. A thread reading the totals
#: (``host_stats()``) while another's flush claimed or folded a slot let
#: another process claim or fold in the same file at the same time: one slot
#: claimed by two processes, a fold counted twice, a sum that goes down. So
#: the record lock is taken only under this lock, and a descriptor of a
#: counters file is closed only while no thread of the process holds it
#: (:func:`_close`).
_SECTION = fork_safe_lock()
#: Descriptors (and mappings: each keeps a descriptor of its own) whose close
#: waits for the thread in ``_SECTION`` to let go (:func:`_close`).
_parked: list[tuple[int, mmap.mmap | None]] = []


@contextlib.contextmanager
def _locked(fd: int) -> Iterator[bool]:
    deadline = time.monotonic() + LOCK_WAIT
    if not _SECTION.acquire(timeout=LOCK_WAIT):
        yield False  # as for a record lock held by a stopped process
        return
    try:
        held = lock_range(fd, _LOCK_LEN, 0, deadline)
        try:
            yield held
        finally:
            if held:
                with contextlib.suppress(OSError):
                    unlock_range(fd, _LOCK_LEN, 0)
    finally:
        _SECTION.release()
        _drain()


def _close(fd: int, mm: mmap.mmap | None = None) -> None:
    """Close a descriptor of a counters file (and ``mm``, a mapping made
    through it) now if no thread of this process holds a header's record lock,
    else as soon as the holder lets go (see ``_SECTION``)."""
    _parked.append((fd, mm))
    _drain()


def _drain() -> None:
    # Whoever parks or lets go drains after it: no parked descriptor is left
    # behind once no thread is in the section.
    while _parked and _SECTION.acquire(blocking=False):
        try:
            while _parked:
                fd, mm = _parked.pop()
                if mm is not None:
                    with contextlib.suppress(BufferError):
                        mm.close()
                with contextlib.suppress(OSError):
                    os.close(fd)
        finally:
            _SECTION.release()


def read_totals(path: str) -> HostTotals | None:
    """The host's totals in the counters file at ``path``; None if there is
    none yet (no process has flushed, or it was cut to nothing: the next flush
    makes it again). ``StatsFileError`` if it is damaged or cannot be opened."""
    try:
        with StatsFile.open(path, (), create=False) as f:
            return f.totals()
    except (FileNotFoundError, _Blank):
        return None
