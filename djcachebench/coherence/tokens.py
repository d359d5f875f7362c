"""Write tokens: never repeated in a process, ~2**-64 to collide between processes.

A token is a per-process random 64-bit start, counted up and passed through a
bijective mixer (SplitMix64's finaliser), so a process never repeats one; a
forked child draws a new start. 0 is never drawn: it is what a slot that was
never stamped (or was lost to truncation and re-extended) holds.

This module imports nothing from Django.
"""

from __future__ import annotations

import itertools
import os
from typing import Final

_MASK64: Final = (1 << 64) - 1


def _mix(z: int) -> int:
    """SplitMix64's finaliser: a bijection on 64-bit integers."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


class _TokenSource:
    """Fresh tokens for this process; re-seeded in a forked child.

    ``next()`` on an ``itertools.count`` is atomic under the GIL, so threads of
    one process never draw the same number (``self.n += 1`` could).
    """

    def __init__(self) -> None:
        self._count = itertools.count()
        self.reseed()

    def reseed(self) -> None:
        self._count = itertools.count(int.from_bytes(os.urandom(8), "little"))

    def next(self) -> int:
        while True:
            token = _mix(next(self._count) & _MASK64)
            if token:  # 0 is what a never-stamped (or re-extended) slot holds
                return token


tokens = _TokenSource()


os.register_at_fork(after_in_child=tokens.reseed)
