"""This process's side of the host-wide counters: what it adds to the file, and when.

A cache's counters stay plain integers on its own objects (``store.stats.Stats``,
``tiered.state.TieredStats``): the hot path pays nothing more. Each such
object is attached (:func:`attach`) to the :class:`Publisher` of its counters
file, which at each flush adds what every attached object counted since the
last flush to this process's totals and writes them into the process's slot
(``file.py``).

When: at most every :data:`FLUSH_EVERY` seconds, from checks the caches make
on their own schedule already (a shard set's per-second file check, a tiered
cache's table check and its L2 reads and writes: :func:`tick`), and at exit
(``atexit``). So the file runs behind a process by at most a flush interval
while it serves, plus the time until its next call when it is idle; a
process killed with SIGKILL (or ending with ``os._exit``, as a forked
``multiprocessing`` child does) loses what it counted since its last flush.
No thread: a process with one forks into children without the warning (and
the risks) of forking a multi-threaded process.

Why an object's last counts are taken when it is freed (``departed``):
Django builds a cache instance per thread, and under ASGI per request, each
with its own counters; without it, the counts of an instance freed between
two flushes were lost.

Counters only go up: a counter that went down (``Stats.reset()``) adds what
it has counted since; a process whose slot was taken from it (folded by a
process that could not see it alive) keeps adding from where it was; one that
forked counts, in the child, only what the child does.

Nothing here raises into a cache call: a file that cannot be had or is
damaged makes "stats unavailable" (logged once per state change), and the
next flush tries again.

This module imports nothing from Django.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

from djcachebench.hoststats.file import StatsFile, StatsFileError, process_identity

__all__ = ["FLUSH_EVERY", "Publisher", "attach", "flush_all", "publisher", "tick"]

log = logging.getLogger("djcachebench.stats")

#: How often (seconds, at most) a process's counts are written to the file.
FLUSH_EVERY = 1.0
_monotonic = time.monotonic
_due = 0.0


class Tally:
    """One counting object attached to a publisher: which of its attributes
    feed which of the file's counters, and their values at the last flush."""

    __slots__ = ("attrs", "columns", "last", "publisher", "ref")

    def __init__(self, publisher: Publisher, source: Any, attrs: Sequence[str],
                 columns: Sequence[int]) -> None:
        self.publisher = publisher
        self.ref = weakref.ref(source)
        self.attrs = tuple(attrs)
        self.columns = tuple(columns)
        self.last = [getattr(source, a) for a in self.attrs]

    def take(self, source: Any) -> None:
        """Add what ``source`` counted since the last take to the process's
        totals (publisher lock held)."""
        totals = self.publisher.totals
        last = self.last
        for i, attr in enumerate(self.attrs):
            now = getattr(source, attr)
            before = last[i]
            totals[self.columns[i]] += now - before if now >= before else now
            last[i] = now

    def rebase(self) -> None:
        source = self.ref()
        if source is not None:
            self.last = [getattr(source, a) for a in self.attrs]


def departed(source: Any) -> None:
    """``source`` is being freed: keep what it counted since the last flush.
    Called from its ``__del__``; never raises."""
    tally = getattr(source, "_host", None)
    if tally is None:
        return
    try:
        with tally.publisher.lock:
            tally.take(source)
            tally.publisher.tallies.discard(tally)
    except Exception:
        pass


class Publisher:
    """This process's totals for one counters file, and its slot there."""

    def __init__(self, path: str, names: Sequence[str]) -> None:
        self.path = path
        self.names = tuple(names)
        # Re-entrant: a source freed by the garbage collector during a flush,
        # in the flushing thread, takes its counts under the same lock.
        self.lock = threading.RLock()
        self.tallies: set[Tally] = set()
        self.totals = [0] * len(names)
        # How much of ``totals`` the file holds outside this process's slot
        # (folded into its retired row): the slot holds the rest.
        self.base = [0] * len(names)
        self.written = [0] * len(names)  # what the slot held after the last flush
        self.slot: int | None = None
        self.file_id: tuple[int, int, int] | None = None
        self.failing: str | None = None

    def attach(self, source: Any, attrs: Sequence[str], names: Sequence[str]) -> None:
        """Count ``source``'s attributes ``attrs`` as the counters ``names``."""
        columns = [self.names.index(n) for n in names]
        with self.lock:
            if any(t.ref() is source for t in self.tallies):
                return
            tally = Tally(self, source, attrs, columns)
            self.tallies.add(tally)
        source._host = tally

    def after_fork(self) -> None:
        """In a forked child: count only what the child does, in a slot of its own."""
        self.lock = threading.RLock()
        for tally in list(self.tallies):
            tally.rebase()
        n = len(self.names)
        self.totals, self.base, self.written = [0] * n, [0] * n, [0] * n
        self.slot = None

    def flush(self, final: bool = False) -> None:
        """Take every attached object's new counts, and write the totals into
        the file; ``final``: then fold this process's slot into the retired
        row (it exits). Logs, never raises, when the file cannot be had."""
        with self.lock:
            for tally in list(self.tallies):
                source = tally.ref()
                if source is None:
                    self.tallies.discard(tally)
                else:
                    tally.take(source)
            try:
                with StatsFile.open(self.path, self.names) as f:
                    self._write(f, final)
            except FileNotFoundError:
                # The cache's directory is gone (removed on purpose, never made
                # again here): nothing to count into, nothing to report.
                return
            except (OSError, ValueError) as exc:  # StatsFileError too
                why = str(exc)
                if why != self.failing:
                    log.warning("host-wide stats unavailable for %s (%s); this process keeps "
                                "counting and tries again at its next flush", self.path, why)
                self.failing = why
                return
            if self.failing is not None:
                log.info("host-wide stats for %s available again", self.path)
                self.failing = None

    def _write(self, f: StatsFile, final: bool) -> None:
        owner = process_identity()
        columns = [f.names.index(n) if n in f.names else -1 for n in self.names]
        if f.file_id != self.file_id:
            # A new file (the first flush, or the file was deleted or replaced):
            # it holds nothing of this process's yet.
            self.file_id, self.slot = f.file_id, None
            self.base = [0] * len(self.names)
        elif self.slot is not None and not f.owns(self.slot, owner):
            # Taken from this process (folded by one that could not see it
            # alive, or zeroed by a cut): what it held is not written again.
            self.base = [b + w for b, w in zip(self.base, self.written, strict=True)]
            self.slot = None
        if self.slot is None:
            self.slot = f.claim(owner)
            self.written = [0] * len(self.names)
        values = [t - b for t, b in zip(self.totals, self.base, strict=True)]
        if self.slot is None:
            # No slot free (or the lock held): straight into the retired row.
            deltas = [v - w for v, w in zip(values, self.written, strict=True)]
            if f.add_retired(columns, deltas):
                self.base = list(self.totals)
                self.written = [0] * len(self.names)
            return
        f.write(self.slot, columns, values)
        self.written = values
        if final and f.release(self.slot, owner):
            self.base = list(self.totals)
            self.written = [0] * len(self.names)
            self.slot = None


_lock = threading.Lock()
_publishers: dict[str, Publisher] = {}


def publisher(path: str, names: Sequence[str]) -> Publisher:
    """The process's one publisher of the counters file at ``path``."""
    key = os.path.realpath(path)
    with _lock:
        found = _publishers.get(key)
        if found is None or found.names != tuple(names):
            found = _publishers[key] = Publisher(path, names)
        return found


def attach(path: str, names: Sequence[str], source: Any, attrs: Sequence[str] | None = None,
           as_names: Sequence[str] | None = None) -> None:
    """Count ``source``'s attributes ``attrs`` (default: ``names``) as the
    counters ``as_names`` (default: ``attrs``) of the file at ``path``, made
    with ``names`` if it is missing. Once per source and file: attaching one
    again (a table shared by two configurations) changes nothing."""
    attrs = tuple(attrs or names)
    publisher(path, names).attach(source, attrs, tuple(as_names or attrs))


def tick() -> None:
    """A flush, if one is due: called by the caches' own periodic checks."""
    if _monotonic() >= _due:
        flush_all()


def flush_all(final: bool = False) -> None:
    """Flush every publisher of this process now. A publisher nothing counts
    for any more is flushed a last time, its slot folded, and forgotten."""
    global _due
    _due = _monotonic() + FLUSH_EVERY
    with _lock:
        publishers = list(_publishers.items())
    for key, pub in publishers:
        idle = not pub.tallies
        try:
            pub.flush(final or idle)
        except Exception:  # never into a cache call
            log.exception("host-wide stats flush failed for %s", pub.path)
        if idle and not final:
            with _lock:
                if _publishers.get(key) is pub and not pub.tallies:
                    del _publishers[key]


def _after_fork_in_child() -> None:
    global _lock, _due
    _lock = threading.Lock()
    _due = 0.0
    for pub in _publishers.values():
        pub.after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(flush_all, True)

__all__ += ["StatsFileError", "departed"]
