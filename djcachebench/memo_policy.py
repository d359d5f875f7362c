"""When a memo is worth keeping whole: the one rule both hot-path memos follow.

ShardedSQLiteCache keeps two memos on its read path: made keys
(``keys.py``) and rows whose integrity tag verified
(``store/codec.py``). Each pays only when reads repeat. Over a key set far
larger than the memo (a million sessions read at random) nearly every lookup
misses, and the memo then costs its lookup, its insert and the memory that
pushes the SQLite pages the next read needs out of the CPU's caches.

So each counts its lookups and hits in a :class:`Judge` and, every ``WINDOW``
lookups, asks it whether to stay whole. A memo that is not whole serves only the
keys whose ``hash`` falls in one bucket of ``SAMPLE``, at ``1/SAMPLE`` of its
capacity: by spatial sampling, the sample's hit rate estimates the whole
memo's, which is what says when to grow back. ``REGROW`` is above ``KEEP`` so
that a hit rate near the bar does not make the memo flap.

A memo that has just started, or just changed size, is not judged until it
has had as many lookups as it holds entries: it is filling, and its misses
then say nothing of the key set. Without that, a hot set larger than a window
never kept the whole memo: the window after each regrowth was all fills.
"""

from __future__ import annotations

__all__ = ["KEEP", "REGROW", "SAMPLE", "WINDOW", "Judge"]

WINDOW = 4096
SAMPLE = 16
KEEP = 0.25
REGROW = 0.4


class Judge:
    """The counters of one memo and its rule. The owner counts ``lookups`` and
    ``hits`` on its hot path and calls :meth:`judge` when ``lookups`` reaches
    ``WINDOW``; while ``whole`` is false it looks up only the keys whose
    ``hash`` is 0 modulo ``SAMPLE``, at ``1/SAMPLE`` of its capacity."""

    __slots__ = ("_capacity", "hits", "lookups", "scale", "settling", "whole")

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self.whole = True
        self.scale = 1  # entries count this many times against the capacity (SAMPLE: sampled)
        self.lookups = 0
        self.hits = 0
        self.settling = capacity  # lookups before the first judgement

    def judge(self) -> bool:
        """End a window; True if the memo must now be emptied (it shrinks to
        a sample, whose entries are all it keeps from now on)."""
        rate = self.hits / WINDOW
        self.lookups = self.hits = 0
        if self.settling > 0:
            self.settling -= WINDOW
            return False
        if self.whole and rate < KEEP:
            self.whole = False
            self.scale = SAMPLE
            self.settling = self._capacity // SAMPLE
            return True
        if not self.whole and rate >= REGROW:
            self.whole = True
            self.scale = 1
            self.settling = self._capacity
        return False
