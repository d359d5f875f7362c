"""The stamper a storage engine calls from inside its write transactions.

Why: a TieredCache over an L2 it does not control stamps each write after it,
under a per-slot lock (``table.py``), so that a writer can prove its write was
the key's latest and keep it. That lock (a thread lock and two ``fcntl`` calls)
and its bookkeeping cost more than the rest of a ShardedSQLiteCache write, and
a holder descheduled while holding it makes every writer of the slot wait. An
engine that writes inside transactions already serialises the writes of a key:
this stamper uses that order instead, and takes no lock at all.

The protocol (``docs/architecture.md``, TieredCache, states guarantees and limits):

* **Mark, inside the transaction.** The engine calls :meth:`EngineStamper.changing`
  for every row a write changes, while it holds the shard's write lock (an SQLite
  trigger calls it). It stores a fresh token into the slot's *mark* word. Writes
  of one key are serialised by their shard's lock, so a later write of a key
  always marks after an earlier one has.
* **Stamp, after the commit.** :meth:`EngineStamper.committed` stores a fresh
  token into the slot's *stamp* word, with a plain store: no lock. A reader's
  token is the pair taken before it read the L2; since every write stores a
  never-seen stamp after its commit and before it returns, no entry read before
  a write's commit stays current after the write returns, whatever order the
  stores of racing writers land in.
* **The writer's own value.** A writer that announced itself (:meth:`expect`)
  learns the pair its write made: the mark stored in its transaction and the
  stamp stored after its commit. It may keep its value under that pair. The
  stamp alone would not do: a delayed writer may store its stamp *after* a later
  write's, and then hold a current-looking stamp with an older value. The mark
  cannot go back like that: the later write's transaction ran after the earlier
  one's, so its mark stays until the next write.
* **The value board.** Published inside the writer's transaction under the same
  pair. Every key of a slot lives in one shard when the slot count is a multiple
  of the shard count and both hash the same way (``aligned``): then the shard's
  write lock is also the board slot's, and no two writers ever interleave in it.

Writes of a table that is not watched (no TieredCache ever read it) are neither
marked nor stamped, as before (``GenerationTable.watch``).

This module imports nothing from Django.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

from djcachebench.coherence.layout import EPOCH_AT, HEADER, MARK, SLOT, STAMPER_AT, U64
from djcachebench.coherence.table import GenerationTable, Token
from djcachebench.coherence.tokens import tokens

__all__ = ["EngineStamper", "Expectation"]

log = logging.getLogger("djcachebench.coherence")

class _Txn(threading.local):
    """This thread's announced write and whether marks are suppressed (clear)."""

    expect: Expectation | None = None
    quiet = False


_txn = _Txn()
_pack = U64.pack_into
_crc32 = zlib.crc32


class Expectation:
    """One announced write of one thread: what the engine tells back.

    ``publish``: ``(board, kind, payload)`` to put on the value board inside the
    transaction, or None. ``token()`` is the token to keep the written value
    under, once the write committed; None if it did not (or its row was not
    the one changed).
    """

    __slots__ = ("epoch", "expires", "final", "off", "pair", "publish", "published", "stamped")

    def __init__(self, final: str, epoch: int, expires: float, publish: tuple | None) -> None:
        self.final = final
        self.epoch = epoch
        self.expires = expires
        self.publish = publish
        self.off = 0
        self.pair: tuple[int, int] | None = None  # (stamp, mark), chosen in the transaction
        self.stamped = False  # the stamp was stored after the commit
        self.published = False

    def token(self) -> Token | None:
        if not self.stamped or self.pair is None:
            return None
        return (self.off, self.epoch, self.pair)


class EngineStamper:
    """The listener a ShardedSQLiteCache engine tells of every change it makes.

    ``shards``: the engine's shard count, hashed as the table hashes keys
    (CRC-32 of the final key's UTF-8). Marks and stamps need nothing of it;
    board publishes need every key of a slot in one shard (``aligned``).
    """

    __slots__ = ("_watched", "aligned", "table")

    def __init__(self, table: GenerationTable, shards: int) -> None:
        self.table = table
        self.aligned = table.slots % shards == 0
        self._watched = False  # once True, for good: nobody un-watches a table
        self._claim()

    def _claim(self) -> None:
        """Say in the file that an engine stamps this table (see ``engine_stamped``)."""
        self.table.claim(STAMPER_AT)

    # -- the Listener protocol of the engine (djcachebench.store.protocol) --------

    def watched(self) -> bool:
        """After a commit: has a TieredCache ever read this table? The file is
        checked too (at most every ``CHECK_EVERY``).

        Neither answer is confirmed against the file at the path (no ``stat``
        per write): a reader that watches a file made after ours was replaced
        mapped it after this process's last check saw ours at the path, and
        keeps nothing it read or wrote before ``SETTLE_AFTER_MAPPING`` has
        passed since; this process's check stands for ``CHECK_EVERY`` from
        before that ``stat``, so every write it leaves unstamped committed
        before anything that reader keeps was read (docs/architecture.md)."""
        if self._watched:
            return self.table.check()
        self._watched = self.table.watched()
        return self._watched

    def changing(self, key: str | bytes) -> None:
        """Inside a write transaction, for each row it changes (an SQLite trigger
        calls this, with the key as stored). Never raises: a failed call would
        fail the write; what cannot be marked bumps the epoch instead."""
        table = self.table
        try:
            # Mark rows only if a TieredCache ever read this table (the file
            # checked, at most every CHECK_EVERY: a truncated mapping must not
            # be written). Inlined: SQLite calls this for every row of every write.
            if _txn.quiet:
                return
            if self._watched:
                if not table.check():
                    return
            elif table.watched():
                self._watched = True
            else:
                return
            if type(key) is str:
                final = key
                off = HEADER + _crc32(key.encode("utf-8", "surrogatepass")) % table.slots * SLOT
            else:
                final = bytes(key).decode("utf-8", "surrogatepass")
                off = HEADER + _crc32(key) % table.slots * SLOT
            mark = tokens.next()
            expect = _txn.expect
            if expect is not None and expect.pair is None and expect.final == final:
                expect.pair = (tokens.next(), mark)
                expect.off = off
                if expect.publish is not None and self.aligned:
                    board, kind, payload = expect.publish
                    expect.published = board.write(
                        GenerationTable.slot_index(off), expect.pair, expect.epoch,
                        expect.expires, final.encode("utf-8", "surrogatepass"), kind, payload)
            _pack(table.buffer, off + MARK, mark)
        except Exception:
            log.exception("%s: could not mark a write; bumping the epoch", table.path)
            with contextlib.suppress(Exception):
                table.stamp_all()

    def committed(self, keys: Iterable[str], expires_at: Any = None) -> None:
        """After a write committed: a fresh stamp for each key it changed (the
        announced write's own for its key). Lock-free plain stores."""
        table = self.table
        if not table.check():
            return
        buffer = table.buffer
        slots = table.slots
        expect = _txn.expect
        for key in keys:
            off = HEADER + _crc32(key.encode("utf-8", "surrogatepass")) % slots * SLOT
            if (expect is not None and expect.pair is not None and not expect.stamped
                    and expect.off == off and expect.final == key):
                _pack(buffer, off, expect.pair[0])
                expect.stamped = True
            else:
                _pack(buffer, off, tokens.next())
        # Not confirmed against the path (a ``stat`` per write): a file made
        # after ours was replaced settles before its readers keep anything
        # (``watched``).

    def stamp_many(self, keys: Iterable[str], expires_at: Any = None) -> None:
        """Stamp keys a call may have observed changed by another process (a
        delete that found nothing): fresh stamps, never an announced write's."""
        table = self.table
        if not table.check():
            return
        buffer = table.buffer
        for key in keys:
            _pack(buffer, table.locate(key), tokens.next())

    def stamp_all(self) -> None:
        self.table.stamp_all()

    # -- for the engine and the adapter ---------------------------------------------

    @staticmethod
    @contextlib.contextmanager
    def quiet() -> Iterator[None]:
        """Rows changed in here are not marked one by one: for ``clear()``, which
        bumps the epoch afterwards (one store instead of a call per row)."""
        _txn.quiet = True
        try:
            yield
        finally:
            _txn.quiet = False

    def expect(self, final: str, expires: float, publish: tuple | None) -> Expectation:
        """Announce this thread's next write of ``final`` (the L2's final key).
        The epoch is taken now, before the write: a ``clear()`` whose epoch bump
        lands after it ends what the write keeps, even if the write came later."""
        table = self.table
        expect = Expectation(final, U64.unpack_from(table.buffer, EPOCH_AT)[0], expires, publish)
        _txn.expect = expect
        return expect

    @staticmethod
    def done() -> None:
        """The announced write is over (or failed)."""
        _txn.expect = None
