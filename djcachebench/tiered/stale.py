"""``SERVE_STALE``: L1 copies served past their expiry while the L2's circuit
breaker is open (``tiered/breaker.py``).

Only copies whose token is still current are served: the callers check it
before they get here (``get``) or after (``_lookup``), as for any entry. A write
of the key, refused or not, stamps it, so no copy a write meant to replace is
ever served.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable, Hashable
from typing import Any

from djcachebench.tiered.breaker import Breaker
from djcachebench.tiered.state import ABSENCE, ABSENT_HIT, MISS, PICKLED, TieredStats

__all__ = ["StaleCopies"]


class StaleCopies:
    """The stale answers of one TieredCache instance (``stale_for``: SERVE_STALE)."""

    def __init__(self, records_get: Callable[[Hashable], Any],
                 l1_get: Callable[[Hashable], Any], breaker: Breaker, stats: TieredStats,
                 stale_for: float) -> None:
        self._records_get = records_get
        self._l1_get = l1_get
        self._breaker = breaker
        self._stats = stats
        self._stale_for = stale_for

    def value(self, record: tuple, l1key: tuple) -> Any:
        """An L1 record past its expiry but within ``SERVE_STALE`` of it, its token
        current: its value (``ABSENT_HIT`` for a known absence) while the breaker
        is open, else ``MISS``."""
        if not self._breaker.is_open():
            return MISS
        kind = record[3]
        if kind == PICKLED:
            try:
                value = pickle.loads(record[2])
            except Exception:  # pickles but does not unpickle: not served
                return MISS
        else:
            value = ABSENT_HIT if kind == ABSENCE else record[2]
        self._stats.stale_served += 1
        return value

    def item(self, l1key: tuple) -> tuple | None:
        """``L1Map.get``, except that while the breaker is open an entry past its
        expiry by less than ``SERVE_STALE`` is returned (counted) instead of
        dropped; the caller checks its token as for any entry."""
        record = self._records_get(l1key)
        if (record is not None and record[0] <= time.monotonic() < record[0] + self._stale_for
                and self._breaker.is_open()):
            self._stats.stale_served += 1
            return record[2:]
        return self._l1_get(l1key)  # type: ignore[no-any-return]
