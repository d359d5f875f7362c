"""When the L1 does not pay for itself, stop filling it.

Why: an L1 miss costs more than a plain read of the L2 (the slot's token is
read first, the final key made and checked, the value kept, another entry
evicted), and a write that keeps its value costs more than a plain write. When
the keys read are spread over many more keys than the L1 holds (uniform access
to 100,000 keys with a 10,000-entry L1 answers at most ~10% of reads), those
costs are paid on nearly every operation and saved on few: the tiered cache runs
well below its L2 alone. A production cache must never cost more than it saves.

So each process watches the share of its reads that its L1 answered, per window
of :data:`WINDOW` reads that reached the L2 (or, while bypassing, that the L1
answered). Below :data:`BYPASS_BELOW` the
next window *bypasses*: a miss reads the L2 as a plain read and keeps nothing
(except one in :data:`SAMPLE`, so that keys that turn hot still get in and the
share can recover; and such a sampled miss is kept only when the doorkeeper
below has seen the key before, even while the L1 has room, since in a spread
phase a key read once is rarely read again), and writes go to the L2 without
write-through. Entries
already in the L1 are still served (and checked) as before: the gate only
decides what is *added*, never whether something may be served, so coherence is
untouched.

Second, once the L1 is full, a key is admitted only when it misses again
(:class:`Doorkeeper`). Why: with skewed popularity over many more keys than the
L1 holds (Zipf over a million keys, a 10,000-entry L1), most misses are keys of
the long tail that will not be read again before they are evicted. Filling the
L1 with each of them costs a fill on nearly every miss and evicts the head of
the distribution to make room. Remembering the keys that missed lately and
admitting only those that miss again keeps the tail out: fewer fills, and a
larger share of reads answered (simulated and measured in docs/benchmarks.md,
The L1 at many keys). Writes of keys the L1 does not hold go through the same
filter (``tiered/write_through.py``). While the L1 has room, every miss is admitted
(there is nothing to evict), and a key whose L1 entry was invalidated or
expired is admitted on its next miss (it has proved it is read again).

This module imports nothing from Django.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Final

from djcachebench.l1 import L1Map

__all__ = ["BYPASS_BELOW", "SAMPLE", "WINDOW", "Doorkeeper", "Gate"]

#: Reads that reached the L2 per decision.
WINDOW: Final = 2048
#: Bypass while the L1 answered less than this share of the reads of a window.
BYPASS_BELOW: Final = 0.25
#: While bypassing, one miss in this many may still fill the L1 (on the key's second sampling).
SAMPLE: Final = 8


class Gate:
    """Per process and configuration: does the L1 take new entries now?

    ``admit()`` is called once per read that missed the L1; ``answered`` is the
    running count of reads the L1 answered (hits, known absences, values from
    the value board), read at the end of each window. Plain ``+=`` counters:
    approximate under threads, which only shifts a decision by a few reads.
    """

    __slots__ = ("_answered_at", "_misses", "_sample", "bypassed", "bypassing", "windows")

    def __init__(self) -> None:
        self._misses = 0
        self._answered_at = 0
        self._sample = 0
        self.bypassing = False
        self.bypassed = 0  # misses that kept nothing because the gate was closed
        self.windows = 0  # windows spent bypassing

    def admit(self, answered: int) -> bool:
        """Should this miss fill the L1? ``answered``: the L1's answers so far."""
        self._misses += 1
        # A window ends after WINDOW misses or, while bypassing, as soon as the
        # L1 has answered WINDOW reads (keys turned hot: misses became rare).
        if self._misses >= WINDOW or (self.bypassing and answered - self._answered_at >= WINDOW):
            hits = answered - self._answered_at
            self._answered_at = answered
            self.bypassing = hits < BYPASS_BELOW * (hits + self._misses)
            self.windows += self.bypassing
            self._misses = 0
        if not self.bypassing:
            return True
        self._sample += 1
        if self._sample >= SAMPLE:
            self._sample = 0
            return True
        self.bypassed += 1
        return False


class Doorkeeper:
    """Per process and configuration: has this key missed the L1 lately?

    A Bloom filter of the keys that missed (one byte a cell, two cells a key,
    16 cells for each entry the L1 holds), cleared after twice the L1's entries
    have been added, so that "lately" means roughly one L1's turnover. A
    filter, not a table of fingerprints that a key overwrites: two hot keys
    whose fingerprints shared a cell would each erase the other's and neither
    would ever be admitted. A false positive (about 5% at the fill where it is
    cleared) admits a key one miss early; the filter decides what the L1 keeps,
    never what it may serve. Python's salted ``hash()`` is fine here: the filter
    lives in one process and no one outside it can aim at a cell. No lock: a
    store lost under threads only delays an admission.
    """

    __slots__ = ("_added", "_cells", "_limit", "_mask", "kept_out")

    def __init__(self, l1_entries: int) -> None:
        size = 64
        while size < 16 * l1_entries:
            size *= 2
        self._cells = bytearray(size)
        self._mask = size - 1
        self._limit = max(2 * l1_entries, 1)
        self._added = 0
        self.kept_out = 0  # misses not admitted

    def admit(self, key: Hashable) -> bool:
        """Has the key missed since the filter was last cleared? If not, note it."""
        h = hash(key)
        mask = self._mask
        cells = self._cells
        first, second = h & mask, (h >> 24) & mask
        if cells[first] and cells[second]:
            return True
        self._note(first, second)
        self.kept_out += 1
        return False

    def lets_in(self, l1: L1Map, key: Hashable) -> bool:
        """May ``l1`` take ``key``, which it does not hold? Always while it has room
        (nothing to evict); once full, when the key missed lately (:meth:`admit`)."""
        return l1.has_room() or self.admit(key)

    def seen(self, key: Hashable) -> None:
        """``key`` was in the L1 and is read again: admit its next miss."""
        h = hash(key)
        self._note(h & self._mask, (h >> 24) & self._mask)

    def _note(self, first: int, second: int) -> None:
        self._added += 1
        if self._added > self._limit:
            self._added = 1
            self._cells = bytearray(len(self._cells))
        cells = self._cells
        cells[first] = cells[second] = 1
