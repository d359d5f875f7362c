"""Write tokens: never repeated in a process, ~2**-64 to collide between processes.

A token is a per-process random 64-bit start stepped by a fixed odd constant
modulo 2**64: a process repeats none before 2**64 draws, and two processes'
sequences meet with probability ~2**-64 per pair of draws. A forked child draws
a new start. Consecutive tokens differ in both 32-bit halves (the step does), so
a torn read of a slot never reassembles the token before or after it.

0 is what a slot that was never stamped (or was lost to truncation) holds; a
sequence reaches 0 once in 2**64 draws, at a random place.

Why a step and not a hash of a counter: a token is drawn several times per
write, and this one is drawn in C (``map`` over ``itertools.count``), with no
Python frame.

This module imports nothing from Django.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from typing import Final

_MASK64: Final = (1 << 64) - 1
#: Odd (so the sequence visits every 64-bit value once), with both halves far
#: from 0 (so both halves of consecutive tokens differ): the golden ratio's.
_STEP: Final = 0x9E3779B97F4A7C15


class _TokenSource:
    """Fresh tokens for this process; re-seeded in a forked child.

    ``next()`` on an ``itertools.count`` is atomic under the GIL, so threads of
    one process never draw the same number (``self.n += 1`` could).
    """

    def __init__(self) -> None:
        self.next = self._sequence()

    @staticmethod
    def _sequence() -> Callable[[], int]:
        start = int.from_bytes(os.urandom(8), "little")
        return map(_MASK64.__and__, itertools.count(start, _STEP)).__next__

    def reseed(self) -> None:
        self.next = self._sequence()


tokens = _TokenSource()


os.register_at_fork(after_in_child=tokens.reseed)
