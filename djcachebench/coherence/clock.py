"""Telling a step of the wall clock from its ordinary drift.

Why: L1 deadlines are on the monotonic clock, but most L2s expire values on
the wall clock (SQLite rows, LocMem, files, the value board's expiry): after a
forward step the L2 says a value expired while an L1 copy lives on; after a
backward one a copy taken from the board outlives it. ``TableFile.check``
asks at every check whether the wall clock
stepped since the last one, and makes every L1 entry on the host stale if so.

This module imports nothing from Django.
"""

from __future__ import annotations

import time
from typing import Final

__all__ = ["CLOCK_STEP", "WallClockWatch"]

#: A change of the wall clock against the monotonic one, between two checks,
#: larger than this (seconds, plus 0.1% of the time between the checks, which
#: NTP's slewing stays well under) is a step: see :meth:`WallClockWatch.stepped`.
CLOCK_STEP: Final = 0.02
_monotonic = time.monotonic


class WallClockWatch:
    """The offset of the wall clock from the monotonic one at the last look."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        # (monotonic time, wall - monotonic) at the last look; None before the first.
        self._last: tuple[float, float] | None = None

    def stepped(self) -> bool:
        """Did the wall clock jump since the last call?

        A step is a change of ``time() - monotonic()`` between two calls;
        reads preempted in between (more than a millisecond apart) give no
        verdict. The first call only takes the measure.
        """
        before = _monotonic()
        wall = time.time()
        after = _monotonic()
        if after - before > 0.001:
            return False
        now = (before + after) / 2
        last, self._last = self._last, (now, wall - now)
        if last is None:
            return False
        return abs(wall - now - last[1]) > CLOCK_STEP + 0.001 * (now - last[0])
