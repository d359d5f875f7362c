"""What TieredCache keeps in its L1 from a read or a write: whether a miss fills
it (admission), the slot's token taken before the L2 read and the table's epoch
checked after it, then values with their deadline and known absences (the read
side's fills, which the ``Writer``'s write-through shares).

Apart from ``backends/tiered.py``, which holds the hit path and the Django API:
these run on misses and writes only, and need nothing of the instance but what
its configuration shares in the process (``state.Shared``), the L2's key making
and ``L1_TIMEOUT``.
"""

from __future__ import annotations

import pickle
import sys
import time
from typing import Any

from django.core.cache.backends.base import BaseCache

from djcachebench.coherence import EPOCH_OFFSET, TOKEN, U64, GenerationTable, Token
from djcachebench.coherence.board import ABSENT, EXPIRY_ONLY, NOT_PUBLISHED
from djcachebench.tiered.state import (
    ABSENCE,
    ABSENT_HIT,
    MISS,
    OBJECT,
    PICKLED,
    Shared,
    immutable_size,
    locate_for_l1,
)

__all__ = ["Filler"]

_OBJECT, _PICKLED, _ABSENCE = OBJECT, PICKLED, ABSENCE
_monotonic = time.monotonic
_getsizeof = sys.getsizeof
_u64 = U64.unpack_from
_token = TOKEN.unpack_from


class Filler:
    """The L1 fills of one TieredCache configuration in a process."""

    def __init__(self, shared: Shared, l2: BaseCache, l1_timeout: float) -> None:
        self._l2 = l2
        self._l1 = shared.l1
        self._table = shared.table
        self._board = shared.board
        self._stats = shared.stats
        self._gate = shared.gate
        self._door = shared.door
        self._l1_timeout = l1_timeout

    def admits(self, l1key: tuple) -> bool:
        """Should a read that missed the L1 fill it? (``tiered/admission.py``): while
        the gate is open, and once the L1 is full, on the key's second miss. While
        the gate bypasses, a sampled miss fills it on the key's second sampled miss
        only, room or not: in a spread phase a key read once is rarely read again,
        and each fill costs more than the plain read it replaces."""
        stats = self._stats
        gate = self._gate
        if not gate.admit(stats.l1_hits + stats.l1_misses):  # board answers are in them
            return False
        if gate.bypassing:
            return self._door.admit(l1key)
        return self._door.lets_in(self._l1, l1key)

    def reading(self, key: Any, version: Any,
                final: str | None = None) -> tuple[Token, bytes] | None:
        """The slot's token, taken BEFORE the L2 read, and the final key; None:
        keep out of L1 (``locate_for_l1``). The table's check on the way may
        move it to a new file: the caller then maps its ``buffer`` again."""
        if not self._l1.max_entries:
            return None
        located = locate_for_l1(self._l2, self._table, key, version, final)
        if located is None:
            return None
        final, off = located
        return self._table.read_at(off), final.encode("utf-8", "surrogatepass")

    def fill_epoch(self) -> int | None:
        """After an L2 read, before keeping what it read: the epoch a token must
        carry to be kept under, or None (keep nothing) if the table's file is no
        longer the one at its path (``confirm``: one ``stat``). A token taken by
        this thread while another moved the table to a new file came from the
        old mapping, which nobody stamps any more: its epoch is not this one."""
        table = self._table
        return _u64(table.buffer, EPOCH_OFFSET)[0] if table.confirm() else None

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

    def from_board(self, buffer: Any, l1key: tuple, offset: int, final: bytes) -> Any:
        """After an invalidation seen in ``buffer`` (the caller's mapping of the
        table): the key's new value (or ``ABSENT_HIT``) from the value board, kept
        in L1; ``MISS`` if the board cannot tell. The board answers only for the
        very final key asked for (compared in full)."""
        token = (offset, _u64(buffer, EPOCH_OFFSET)[0], _token(buffer, offset))
        got, expires = self._board.fetch(  # type: ignore[union-attr]
            GenerationTable.slot_index(offset), token[2], token[1], final)
        if got is NOT_PUBLISHED or got is EXPIRY_ONLY:
            return MISS
        if got is ABSENT:
            self._stats.board_hits += 1
            self._stats.l1_misses += 1
            self.keep_absence(l1key, token, final)
            return ABSENT_HIT
        life = min(self._l1_timeout, expires - time.time())
        if life <= 0:  # expired in the L2 by now: let the L2 say so
            return MISS
        self._stats.board_hits += 1
        self._stats.l1_hits += 1
        # Board values are plain immutable scalars: no copy, no size walk.
        self._l1.put(l1key, (got, _OBJECT, *token, final),
                     _getsizeof(got) + _getsizeof(l1key[0]), _monotonic() + life)
        return got
