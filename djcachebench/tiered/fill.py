"""What TieredCache keeps in its L1 from a read or a write: values with their
deadline, and known absences (the read side's fills, which the ``Writer``'s
write-through shares).

Apart from ``backends/tiered.py``, which holds the hit path and the Django API:
these run on misses and writes only, and need nothing of the instance but the
L1 map, the value board, the counters and ``L1_TIMEOUT``.
"""

from __future__ import annotations

import pickle
import sys
import time
from typing import Any

from djcachebench.coherence import GenerationTable, Token
from djcachebench.coherence.board import ValueBoard
from djcachebench.l1 import L1Map
from djcachebench.tiered.state import ABSENCE, OBJECT, PICKLED, TieredStats, immutable_size

__all__ = ["Filler"]

_OBJECT, _PICKLED, _ABSENCE = OBJECT, PICKLED, ABSENCE
_monotonic = time.monotonic
_getsizeof = sys.getsizeof


class Filler:
    """The L1 fills of one TieredCache configuration in a process."""

    def __init__(self, l1: L1Map, board: ValueBoard | None, stats: TieredStats,
                 l1_timeout: float) -> None:
        self._l1 = l1
        self._board = board
        self._stats = stats
        self._l1_timeout = l1_timeout

    def fill(self, l1key: tuple, reading: tuple[Token, bytes], value: Any,
              expires: float | None, pickled: bytes | None = None) -> None:
        """Keep a value read from L2 (never one from a failed read: callers only
        get here with a value the L2 returned) until the expiry that came with
        it; a value whose expiry the read did not tell is not kept. ``pickled``:
        the pickle the L2 loaded it from, if it said (see ``keep``)."""
        token, final = reading
        life = self._l1_timeout
        if expires is None and self._board is not None:
            # Published by the write that made ``token``, proved the latest then.
            expires = self._board.expiry(GenerationTable.slot_index(token[0]), token[2],
                                         token[1], final)
        if expires is None:
            # Under every COHERENCE: kept for L1_TIMEOUT, a value set with a
            # shorter timeout would be served after it expired (COHERENCE
            # "none" over memcached, say).
            self._stats.no_expiry += 1
            return
        life = min(life, expires - time.time())
        self.keep(l1key, token, final, value, life, pickled)

    def keep(self, l1key: tuple, token: Token, final: bytes, value: Any, life: float,
              pickled: bytes | None = None) -> None:
        """Put a value in L1 for ``life`` seconds (from now) under ``token``,
        replacing the entry at ``l1key``; a value that cannot be kept drops it.
        ``pickled``: a pickle of ``value`` the L2 made or verified (``tiered_get``,
        ``tiered_set``), kept for a mutable value instead of pickling it again."""
        if life <= 0:
            self._l1.pop(l1key)
            return
        # The deadline first: pickling or sizing a large value (a big dict) can
        # take long, and a deadline taken after it would outlive the L2's expiry
        # by that much.
        deadline = _monotonic() + life
        size = immutable_size(value)
        if size >= 0:
            item = (value, _OBJECT, *token, final)
        else:
            # Mutable: keep it pickled, so mutating what get() returned cannot
            # change what the next get() returns.
            if pickled is None:
                try:
                    pickled = pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
                except Exception:  # the L2 stored it some other way; just do not keep it
                    self._l1.pop(l1key)
                    return
            item, size = (pickled, _PICKLED, *token, final), _getsizeof(pickled)
        self._l1.put(l1key, item, size + _getsizeof(l1key[0]), deadline)

    def keep_absence(self, l1key: tuple, token: Token, final: bytes) -> None:
        """Remember that the key is absent, until its slot is stamped.

        Safe for the same reason as a value: the token was taken before the L2
        read, and no key appears in the L2 without a write, which stamps. Its
        life is L1_TIMEOUT (an absence has no L2 expiry).
        """
        self._l1.put(l1key, (None, _ABSENCE, *token, final), _getsizeof(l1key[0]) + 64,
                     _monotonic() + self._l1_timeout)
