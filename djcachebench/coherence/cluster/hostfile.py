"""The host's cross-host state, shared by its processes: heartbeat, identity, counts.

A small file next to the generation table (``<table>.cluster``), mapped by every
process of the host. Why a file of its own rather than words in the table: the
table's layout belongs to the table; this file is written only by the host's
elected subscriber (one writer, so plain stores suffice) and read by the guard
of every process.

What it holds (64-bit words):

* the host id: random, drawn once by whoever created the file, so that every
  process of the host tags its messages alike and ignores its own echoes;
* ``fresh_until``: a ``CLOCK_MONOTONIC`` time in ns (one clock for every process
  of a host). The subscriber moves it to ``t0 + stale_after`` when the server
  answers a ``PING`` it sent at ``t0`` *after* every message published before
  that ping (one connection delivers in order). An L1 hit is served only while
  it lies in the future (:meth:`HostFile.guard`);
* counts: messages and keys applied, epoch bumps, gaps, takeovers, time spent
  degraded, and a histogram of propagation delays (4 buckets per doubling of µs).

This module imports nothing from Django.
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import os
import struct
import time
from collections.abc import Callable
from typing import Final

from djcachebench.coherence.layout import U64
from djcachebench.coherence.registry import own_descriptor
from djcachebench.coherence.shared_file import SharedFileError, open_shared_file
from djcachebench.coherence.table_file import CHECK_EVERY
from djcachebench.coherence.tokens import tokens

__all__ = ["BUCKETS", "STALE_AFTER", "HostFile", "delay_percentile", "open_host_file"]

log = logging.getLogger("djcachebench.coherence")

#: How long a pong keeps the host fresh (counted from when its ping was sent).
#: Past it without a newer pong, no L1 hit is served on the host.
STALE_AFTER: Final = 0.1
MAGIC: Final = int.from_bytes(b"DJCBHOST", "little")
FORMAT: Final = 1
WORDS: Final = 256
SIZE: Final = WORDS * 8
#: Delay histogram: 4 buckets per doubling of microseconds (at most 25% wide),
#: up to ~2**56 µs (:func:`_bucket`).
PER_OCTAVE: Final = 4
BUCKETS: Final = 224

# Word indices.
(_MAGIC, _FORMAT, HOST_ID, FRESH_UNTIL, DEGRADED_SINCE, DEGRADED_NS, APPLIED_KEYS,
 MESSAGES, EPOCH_BUMPS, GAPS, TAKEOVERS, SUBSCRIBER_PID, DELAY_COUNT, DELAY_SUM_US,
 DELAY_MAX_US, CONNECTS) = range(16)
HIST: Final = 16
#: Messages of this host's own that reached its subscriber (the channel
#: patterns keep them out: see ``channels.py``).
ECHOES: Final = HIST + BUCKETS
#: Strict writes' messages this host's subscriber applied and acked.
ACKS: Final = ECHOES + 1
assert ACKS < WORDS

_HEAD = struct.Struct("<QQQ")


def _bucket(us: int) -> int:
    """The histogram bucket of a delay in µs: its octave (``floor(log2(us + 1))``)
    and which quarter of that octave, linearly."""
    n = us + 1
    octave = n.bit_length() - 1
    frac = ((n << 8) >> octave) - 256  # the mantissa's top 8 bits, 0..255
    return octave * PER_OCTAVE + frac * PER_OCTAVE // 256


def _upper_edge_us(i: int) -> float:
    octave, quarter = divmod(i, PER_OCTAVE)
    return (1 << octave) * (1 + (quarter + 1) / PER_OCTAVE) - 1


class HostFile:
    """One mapping of a host file. Only the elected subscriber writes the counts."""

    __slots__ = ("__weakref__", "_check_at", "_fd", "_stored_id", "host_id", "mm", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        header = _HEAD.pack(MAGIC, FORMAT, tokens.next() or 1) + bytes(SIZE - _HEAD.size)
        fd = open_shared_file(path, SIZE, header)
        try:
            if os.fstat(fd).st_size < SIZE:
                raise SharedFileError(0, f"{path} is shorter than a host file ({SIZE} bytes)")
            mm = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        magic, fmt, host_id = _HEAD.unpack_from(mm, 0)
        if magic != MAGIC or fmt != FORMAT:
            mm.close()
            os.close(fd)
            raise SharedFileError(0, f"{path} is not a host file of format {FORMAT}; remove it")
        # Kept open for the size checks (``whole``): the mapping of a file cut
        # to nothing raises SIGBUS when touched, which would kill every process
        # of the host if nothing looked again.
        self._fd = fd
        self._check_at = 0.0
        own_descriptor(self, fd)
        self.mm = mm
        self._stored_id = host_id
        self.host_id = _host_id(host_id, os.fstat(fd))

    def whole(self) -> bool:
        """Is the file still its full size? A cut one is given its bytes back
        (zeros: not fresh, counts lost) with its header, logged, and reads as
        not whole this once; True otherwise. One ``lseek``."""
        try:
            if os.lseek(self._fd, 0, os.SEEK_END) >= SIZE:
                return True
            os.ftruncate(self._fd, SIZE)
            os.pwrite(self._fd, _HEAD.pack(MAGIC, FORMAT, self._stored_id), 0)
        except OSError:
            return False
        log.warning("%s was cut short; given its bytes back (the heartbeat and counts "
                    "start again)", self.path)
        return False

    # --- words -----------------------------------------------------------------

    def get(self, word: int) -> int:
        return U64.unpack_from(self.mm, word * 8)[0]

    def put(self, word: int, value: int) -> None:
        # The subscriber's writes: never into a cut file. Its size is looked at
        # once per CHECK_EVERY, not at each of the several counts a message moves.
        now = time.monotonic()
        if now >= self._check_at:
            if not self.whole():
                return
            self._check_at = now + CHECK_EVERY
        U64.pack_into(self.mm, word * 8, value & 0xFFFF_FFFF_FFFF_FFFF)

    def add(self, word: int, n: int = 1) -> None:
        self.put(word, self.get(word) + n)

    # --- the heartbeat -----------------------------------------------------------

    def guard(self, stale_after: float = STALE_AFTER) -> Callable[[], bool]:
        """The table guard: true while the heartbeat is fresh. One ``lseek`` (the
        file's size: see :meth:`whole`), one 8-byte read and one clock read; the
        table calls it at most every ``CHECK_EVERY`` while it passes.

        A freshness more than ``stale_after`` (plus a check's interval) ahead
        is not one the subscriber set (it sets ``pong time + stale_after``):
        garbage written over the file would keep the host fresh for good,
        serving L1 hits while its subscriber is stopped."""
        mm, at = self.mm, FRESH_UNTIL * 8
        unpack, now = U64.unpack_from, time.monotonic_ns
        ahead = int((stale_after + CHECK_EVERY) * 1e9)
        whole = self.whole

        def fresh() -> bool:
            if not whole():
                return False
            t = now()
            return t < unpack(mm, at)[0] <= t + ahead

        return fresh

    def fresh(self, until_ns: int) -> None:
        """Extend freshness to ``until_ns``, accounting a degraded spell that ends now.

        A pong so late that ``until_ns`` has passed changes nothing: the host
        stays degraded, and the spell goes on from where it began. (Moving
        ``FRESH_UNTIL`` to that past time would count the spell again from there
        at each late pong, so a short run of late pongs would add up to many
        times its length of "degraded".)"""
        now = time.monotonic_ns()
        if until_ns <= now:
            return
        prev = self.get(FRESH_UNTIL)
        since = prev if prev else self.get(DEGRADED_SINCE)
        if since and since < now:
            self.add(DEGRADED_NS, now - since)
        self.put(DEGRADED_SINCE, 0)
        if until_ns > prev:
            self.put(FRESH_UNTIL, until_ns)

    def degrade(self) -> None:
        """Stop L1 hits on this host now (the subscriber lost its connection)."""
        now = time.monotonic_ns()
        prev = self.get(FRESH_UNTIL)
        if prev:
            self.put(DEGRADED_SINCE, min(prev, now))
        self.put(FRESH_UNTIL, 0)

    def record_delay(self, delay_ns: int) -> None:
        us = max(0, delay_ns // 1000)
        self.add(DELAY_COUNT)
        self.add(DELAY_SUM_US, us)
        if us > self.get(DELAY_MAX_US):
            self.put(DELAY_MAX_US, us)
        self.add(HIST + min(BUCKETS - 1, _bucket(us)))

    # --- reading it back -----------------------------------------------------------

    def delay_counts(self) -> list[int]:
        """The delay histogram's counts (merge hosts by adding them)."""
        return [self.get(HIST + i) for i in range(BUCKETS)]

    def delay_percentile(self, q: float) -> float | None:
        return delay_percentile(self.delay_counts(), q)

    def stats(self) -> dict[str, float | int | None]:
        now = time.monotonic_ns()
        degraded = self.get(DEGRADED_NS)
        fresh_until = self.get(FRESH_UNTIL)
        since = fresh_until if fresh_until else self.get(DEGRADED_SINCE)
        if fresh_until <= now and since and since < now:
            degraded += now - since  # the spell under way
        count = self.get(DELAY_COUNT)
        most = self.get(DELAY_MAX_US) / 1000.0 if count else None

        def at_most(q: float) -> float | None:
            edge = self.delay_percentile(q)  # a bucket's edge: never past the maximum seen
            return edge if edge is None or most is None else min(edge, most)

        return {
            "host_fresh": fresh_until > now,
            "invalidations_applied": self.get(APPLIED_KEYS),
            "messages_applied": self.get(MESSAGES),
            "epoch_bumps": self.get(EPOCH_BUMPS),
            "gaps": self.get(GAPS),
            "own_echoes": self.get(ECHOES),
            "strict_acks": self.get(ACKS),
            "takeovers": self.get(TAKEOVERS),
            "connects": self.get(CONNECTS),
            "subscriber_pid": self.get(SUBSCRIBER_PID),
            "degraded_seconds": degraded / 1e9,
            "delay_ms_mean": (self.get(DELAY_SUM_US) / count / 1000.0) if count else None,
            "delay_ms_p50_at_most": at_most(0.5),
            "delay_ms_p99_at_most": at_most(0.99),
            "delay_ms_max": most,
        }


def delay_percentile(counts: list[int], q: float) -> float | None:
    """Upper edge (ms) of the histogram bucket holding the q-th quantile, or None."""
    total = sum(counts)
    if not total:
        return None
    rank, seen = q * total, 0
    for i, n in enumerate(counts):
        seen += n
        if seen >= rank:
            return _upper_edge_us(i) / 1000.0
    return _upper_edge_us(len(counts) - 1) / 1000.0


def _boot_id() -> bytes:
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return f.read().strip()
    except OSError:
        return b""


def _host_id(stored: int, st: os.stat_result) -> int:
    """The host's id: the random number its file holds, with the file's own
    identity (device, inode) and the running kernel's boot id.

    Why not the stored number alone: a host file copied with its directory (a
    cloned VM or container image that has it baked in, a restored backup, a
    template host) would give two hosts one id; each would exclude the other's
    channel as its own, so neither would hear the other's writes, and strict
    writes would skip the twin as the writer itself. Every process
    of a host maps the same file, so they agree on the id; a copy is another
    inode, and another machine another boot. A reboot gives the host a new id,
    as a restart of its processes would give it a new subscription."""
    named = b"%d:%d:%d:" % (stored, st.st_dev, st.st_ino) + _boot_id()
    return int.from_bytes(hashlib.blake2b(named, digest_size=8, person=b"djcb-host").digest(),
                          "little") or 1


def open_host_file(table_path: str) -> HostFile:
    """The host file beside the table at ``table_path``."""
    return HostFile(table_path + ".cluster")
