"""Write-through: a write proved to be the key's latest keeps its value.

Two ways to prove that a write was the key's latest, so that the writer may keep
its value in L1 and publish it on the value board:

* over an L2 that stamps from inside its own write transactions
  (ShardedSQLiteCache, ``coherence/stamper.py``), the write announces itself
  (``EngineStamper.expect``) and the engine tells back the token its
  transaction and commit made: no lock, no second stamp (:meth:`WriteThrough.announced`);
* over any other L2, a compare-and-stamp under the slot's lock
  (``GenerationTable.chained``, :meth:`WriteThrough.begin` and :meth:`WriteThrough.done`).

Why apart from ``writes.py``: that module is every mutation of the Django API
and the L1 entries it ends; this one is what keeping a written value takes
(which writes may keep one, the proof, the board publish, the L1 copy).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from djcachebench.coherence import GenerationTable, Token
from djcachebench.coherence.board import ABSENT, EXPIRY_ONLY, encode
from djcachebench.tiered.state import locate_for_l1, would_warn
from djcachebench.tiered.wiring import Wiring

__all__ = ["WriteThrough"]


class WriteThrough:
    """Which writes keep their value, and keeping it once the write is proved.

    The ``Writer`` builds one from the instance's ``Wiring``.
    """

    def __init__(self, wiring: Wiring) -> None:
        shared = wiring.shared
        self._l2 = wiring.l2
        self._index = wiring.index
        # While it bypasses (the L1 answers too few reads to pay), writes keep
        # nothing: plain L2 writes, stamped (admission.py).
        self._gate = shared.gate
        # Once the L1 is full, a write keeps the key only if the L1 holds it
        # already or its doorkeeper admits it (a key written or missed twice):
        # a tail key's write then costs a plain L2 write, and evicts nothing.
        self._door = shared.door
        self._stamper = wiring.stamper
        self._l1 = shared.l1
        self._table = shared.table
        self._board = shared.board
        self._stats = shared.stats
        self._stamps = shared.stamps  # the adapter stamps (the L2 does not stamp its own writes)
        # Stamps one write makes on its slot.
        self._max_stamps = int(shared.stamps) + int(shared.l2_stamps)
        self._write_through = wiring.write_through
        self._keep_written = wiring.keep_written  # the L2 gives back what was set
        self._differs = wiring.differs  # ... except these (L2Adapter.read_back_differs)
        # The L2 tells a value's expiry on read; else the write publishes it on the board.
        self._expiry_on_read = wiring.read_with_expiry is not None
        self._failure_probe = wiring.failure_probe
        self._l1_timeout = wiring.l1_timeout
        self._keep = wiring.filler.keep
        self._keep_absence = wiring.filler.keep_absence

    def kept_as(self, key: Any, version: Any) -> tuple | None:
        """The L1 index under which a write of ``key`` may keep its value
        (write-through), or None: not while the admission gate bypasses; once
        the L1 is full, only a key it holds or its doorkeeper admits
        (``tiered/admission.py``). The index is returned so that the write
        does not make it twice."""
        if self._gate.bypassing:
            return None
        l1 = self._l1
        l1key = self._index(key, version)
        if l1key in l1.records or self._door.lets_in(l1, l1key):
            return l1key
        return None

    def begin(self, key: Any, version: Any, value: Any, expires: float,
                       l1key: tuple) -> tuple | None:
        """Before a write of ``value`` (``ABSENT`` for a delete), to be kept at
        ``l1key``: what keeping the written value needs, or None.

        Write-through is a compare-and-stamp (``GenerationTable.chained``): the
        slot's token is read before the L2 write, and the value is kept only if
        every stamp since then was this write's own. Otherwise another write of
        the key completed in between and may be the L2's latest, so the writer
        refills from L2 like everyone else. It also needs an L2 that cannot
        hide a failed write (the failure probe) and that gives back what was
        set (``returns_what_was_set``).

        The value board's publish is prepared here: when the L2 stamps its own
        writes, the table runs it inside the L2's stamp of this very key, under
        the lock that stamp already holds (one locked section per write).
        """
        if not self._write_through:
            return None
        table = self._table
        located = locate_for_l1(self._l2, table, key, version)
        if located is None:
            return None
        final, off = located
        since = table.read_at(off)
        failures = self._failure_probe()  # type: ignore[misc]
        board = self._board
        encoded = None
        if board is not None:
            differs = self._differs
            kept = self._keep_written and not (differs is not None and differs(value))
            encoded = encode(value) if kept else None
            if encoded is None and value is not ABSENT and not self._expiry_on_read:
                encoded = encode(EXPIRY_ONLY)
        publish = None
        if encoded is not None:
            index = GenerationTable.slot_index(off)
            final_bytes = final.encode("utf-8", "surrogatepass")

            def publish(token: Token) -> bool:
                return board.write(index, token[2], token[1], expires,  # type: ignore[union-attr]
                                   final_bytes, *encoded)  # type: ignore[misc]

        pending = None
        if publish is not None and not self._stamps:
            pending = [final, since, self._max_stamps, publish, None]
        GenerationTable.begin_chain(pending)
        return l1key, final, since, failures, off, publish, pending

    def done(self, key: Any, version: Any, through: tuple, value: Any,
                            expires: float) -> None:
        """After a successful write with write-through prepared: stamp (when the
        adapter stamps), and keep ``value`` (``ABSENT`` for a delete) in this L1
        and on the value board if the compare-and-stamp holds."""
        l1key, final, since, failures, off, publish, pending = through
        self._l1.pop(l1key)
        table = self._table
        if self._failure_probe() != failures:  # type: ignore[misc]
            GenerationTable.end_chain()
            if self._stamps:
                table.stamp(final)
            return
        published = False
        if self._stamps:
            token = table.stamp_through(off, since, self._max_stamps, publish, final)
            GenerationTable.end_chain()
            published = token is not None and publish is not None
        else:  # the L2 stamped on its own (and published, under that stamp's lock)
            token = table.chained(GenerationTable.end_chain(), since, self._max_stamps)
            if pending is not None and pending[4] is not None:
                published = True
            elif token is not None and publish is not None:
                published = table.publish(token, lambda: publish(token))
        if token is None:
            return
        if published:
            self._stats.published += 1
        differs = self._differs
        if not self._keep_written or (differs is not None and differs(value)):
            return
        final_bytes = final.encode("utf-8", "surrogatepass")
        if value is ABSENT:
            self._keep_absence(l1key, token, final_bytes)
        else:
            self._keep(l1key, token, final_bytes, value,
                       min(self._l1_timeout, expires - time.time()))

    def announced(self, write: Callable[..., Any], key: Any, version: Any, value: Any,
                   expires: float, args: tuple, l1key: tuple, pickles: bool = False) -> Any:
        """``write`` (the L2's ``set``, ``add`` or ``delete``), announced to its
        engine stamper: the engine marks the write inside its transaction, stamps
        it after the commit and publishes ``value`` on the board (``ABSENT`` for a
        delete); the token it tells back is proof that the write was the key's
        latest, so the value is kept in this L1 under it, replacing the entry in
        one step. A write that did not commit (failed, refused ``add``) tells no
        token and keeps nothing: the entry is dropped.

        The entry is not dropped before the write: until the engine's stamp,
        which lands before the L2 call returns, it is as current as any other
        process's copy; after it, it can no longer be served (a token check),
        and it is replaced or dropped here before this call returns. ``pickles``:
        ``write`` returns the pickle it stored (``tiered_set``), kept for a
        mutable value."""
        l2 = self._l2
        final = l2.make_key(key, version=version)
        stamper = self._stamper
        if would_warn(final) or time.monotonic() < stamper.table.keep_after:  # type: ignore[union-attr]
            # Nothing kept nor published in the moment after this process mapped
            # its table file: a writer that has not looked since the file it maps
            # was replaced may still write without stamping this one
            # (coherence/stamper.py); its write would then be newer than what
            # this one kept, with no stamp to end it. The engine still marks and
            # stamps this write as any other.
            try:
                return write(key, *args, version=version)
            finally:
                self._l1.pop(l1key)
        publish = None
        differs = self._differs
        keep_written = self._keep_written and not (differs is not None and differs(value))
        if keep_written and self._board is not None:
            encoded = encode(value)
            if encoded is not None:
                publish = (self._board, *encoded)
        expect = stamper.expect(final, expires, publish)  # type: ignore[union-attr]
        try:
            result = write(key, *args, version=version)
        except BaseException:
            stamper.done()  # type: ignore[union-attr]
            self._l1.pop(l1key)
            raise
        stamper.done()  # type: ignore[union-attr]
        token = expect.token()
        if token is None:
            self._l1.pop(l1key)
            return result
        if expect.published:
            self._stats.published += 1
        if not keep_written:
            self._l1.pop(l1key)
        elif value is ABSENT:
            self._keep_absence(l1key, token, final.encode("utf-8", "surrogatepass"))
        else:
            self._keep(l1key, token, final.encode("utf-8", "surrogatepass"), value,
                       min(self._l1_timeout, expires - time.time()),
                       result if pickles else None)
        return result
