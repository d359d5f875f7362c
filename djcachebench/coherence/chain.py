"""The compare-and-stamp record behind write-through on an adapter-stamped table.

Why a record per thread: a writer may keep the value it wrote in its L1 (and
publish it on the value board) only if no other write of the key completed
between the token it read before its L2 write and its own stamp. Stamps of a
slot are serialised (``GenerationTable`` takes the slot's locks), so a writer
can prove it by watching the slot's token go from what it read to each stamp
it made itself, with nobody else's in between. This module keeps that record:
:func:`begin` before the L2 write, every stamp of the thread reports itself
(:func:`record`), :func:`end` hands the record to :func:`check`.

Per thread, and across tables: the L2 may stamp the key itself during the write
(a backend that keeps its own table), so the record is keyed by table and slot.

This module imports nothing from Django.
"""

from __future__ import annotations

import os
import threading
from typing import Final

__all__ = ["Links", "begin", "break_link", "check_link", "end", "links", "pending", "record"]

#: (table ident, slot offset) -> [token before, token after, stamps made].
Links = dict[tuple[object, int], list[int]]

_chain = threading.local()
# A link that no check accepts (a stamp gave up its lock inside a chain).
_BROKEN: Final = (-1, -1, 1 << 30)


def _after_fork_in_child() -> None:
    # A forked child starts with no chain of its parent's threads.
    _chain.__dict__.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def begin(pending: list | None = None) -> None:
    """Record this thread's stamps (of any table) until :func:`end`.

    ``pending``: ``[final key, since, max_stamps, publish, None]``. When the L2
    itself stamps that key during the write (its own stamp, after its commit),
    the chain is checked there and ``publish(token)`` runs under that stamp's
    lock; a true result is recorded in the last field.
    """
    _chain.links = {}
    _chain.pending = pending


def end() -> Links:
    """Stop recording; returns what :func:`check_link` reads."""
    recorded = getattr(_chain, "links", None)
    _chain.links = None
    _chain.pending = None
    return recorded or {}


def links() -> Links | None:
    """This thread's record while one is open (between :func:`begin` and :func:`end`)."""
    return getattr(_chain, "links", None)


def pending() -> list | None:
    """The write announced to :func:`begin`, while the record is open."""
    return getattr(_chain, "pending", None)


def record(ident: object, off: int, prev: int, new: int) -> None:
    """A stamp of this thread replaced token ``prev`` by ``new`` in a slot."""
    recorded = getattr(_chain, "links", None)
    if recorded is None:
        return
    link = recorded.get((ident, off))
    if link is not None and link[1] == prev:
        link[1] = new
        link[2] += 1
    elif link is None:  # first stamp of this write
        recorded[(ident, off)] = [prev, new, 1]
    else:  # someone else's stamp came in between: the chain is broken for good
        recorded[(ident, off)] = list(_BROKEN)


def break_link(ident: object, off: int) -> None:
    """A stamp of this thread could not be made in order (it gave up its lock):
    no chain on the slot can be proved."""
    recorded = getattr(_chain, "links", None)
    if recorded is not None:
        recorded[(ident, off)] = list(_BROKEN)


def check_link(recorded: Links, ident: object, since_off: int, since_stamp: int,
               max_stamps: int) -> int | None:
    """The last stamp of an unbroken chain from ``since_stamp`` on the slot, made
    by this thread in at most ``max_stamps`` stamps (at least one); else None."""
    link = recorded.get((ident, since_off))
    if link is None or link[0] != since_stamp or link[2] > max_stamps:
        return None
    return link[1]
