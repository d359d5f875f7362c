"""When a memo is worth keeping whole: the one rule both hot-path memos follow.

ShardedSQLiteCache keeps two memos on its read path: made keys
(``backends/keys.py``) and rows whose integrity tag verified
(``store/codec.py``). Each pays only when reads repeat. Over a key set far
larger than the memo (a million sessions read at random) nearly every lookup
misses, and the memo then costs its lookup, its insert and the memory that
pushes the SQLite pages the next read needs out of the CPU's caches.

So each counts its lookups and hits and, every ``WINDOW`` lookups, asks
:func:`judged` whether to stay whole. A memo that is not whole serves only the
keys whose ``hash`` falls in one bucket of ``SAMPLE``, at ``1/SAMPLE`` of its
capacity: by spatial sampling, the sample's hit rate estimates the whole
memo's, which is what says when to grow back. ``REGROW`` is above ``KEEP`` so
that a hit rate near the bar does not make the memo flap.
"""

from __future__ import annotations

__all__ = ["KEEP", "REGROW", "SAMPLE", "WINDOW", "judged"]

WINDOW = 4096
SAMPLE = 16
KEEP = 0.25
REGROW = 0.4


def judged(whole: bool, hits: int) -> bool:
    """Whether the memo is whole for the next window, after one with ``hits``
    hits out of ``WINDOW`` lookups."""
    rate = hits / WINDOW
    if whole:
        return rate >= KEEP
    return rate >= REGROW
