"""TieredCache answers as its L2 does: ``aincr`` is as atomic as ``incr`` (and keeps the
TTL), and a value that pickles but does not unpickle is a miss, as in the L2.

Each test pins one such answer against the L2's own.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from tests.tiered.helpers import sqlite_tiered


def test_aincr_is_as_atomic_as_incr(tmp_path: Path) -> None:
    """Defect 7: Django's default aincr reads, adds and sets: 50 tasks x 20 left
    the counter far below 1000, and the TTL was reset."""
    cache = sqlite_tiered(tmp_path)
    cache.set("n", 0, 300)

    async def bump() -> None:
        for _ in range(20):
            await cache.aincr("n")

    async def main() -> None:
        await asyncio.gather(*(bump() for _ in range(50)))

    asyncio.run(main())
    assert cache.get("n") == 1000
    assert cache.l2.get_with_expiry("n")[1] < time.time() + 301  # the TTL was kept
    asyncio.run(cache.adecr("n", 10))
    assert cache.get("n") == 990


def _unpicklable() -> None:
    raise RuntimeError("this value pickles but never unpickles")


class PicklesButDoesNotUnpickle:
    def __reduce__(self) -> tuple:
        return (_unpicklable, ())


def test_a_value_that_does_not_unpickle_is_a_miss_as_in_the_l2(tmp_path: Path) -> None:
    """Defect 10: through the tiered alias, the writing process raised on get of a
    value that pickles but does not unpickle, where the SQLite alias misses."""
    cache = sqlite_tiered(tmp_path)
    cache.set("bad", PicklesButDoesNotUnpickle())
    assert cache.l2.get("bad") is None
    assert cache.get("bad") is None
    assert cache.get_many(["bad"]) == {}
