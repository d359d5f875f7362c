"""No ``fork()`` while another thread of the process is inside SQLite.

Why: SQLite keeps process-wide mutexes (its memory allocator's, its VFS's),
and the sqlite3 module releases the GIL while SQLite runs. A thread that
forks while another is inside SQLite copies those mutexes locked into the
child, where nobody will ever unlock them: the child's first SQLite call
(opening its own connection) would block for good, so the children of a
process whose threads use the cache could hang.

So every call of the engine into SQLite passes this gate (:func:`enter` and
:func:`leave`, a counter under a lock: two uncontended lock operations per
call), and the ``before`` hook of ``os.register_at_fork`` closes it and waits
until no call is inside (at most :data:`FORK_WAIT`; a call that takes longer
lets the fork go on, as before). A call that arrives meanwhile is told the
store is busy (:func:`enter` raises :class:`ForkUnderWay`, an SQLite BUSY
error), so it waits as for a locked shard, within its own ``LOCK_TIMEOUT`` and
retries, and gives up softly past them: a fork waiting on a long call (a
``clear()`` of a large shard) would otherwise hold other threads' reads of
free shards for up to ``FORK_WAIT``, past their bound. Closing
connections (:func:`enter_waiting`) waits for the fork instead: it must
happen. The child starts with the gate open and empty.

Only this package's own SQLite calls are covered: another library using SQLite
in another thread of the forking process (Django's ORM on SQLite, say) can
still leave a child blocked; Python documents that forking a process with
threads may deadlock the child.
"""

from __future__ import annotations

import itertools
import logging
import os
import sqlite3
import threading
import time
from typing import Final

__all__ = ["FORK_WAIT", "ForkUnderWay", "enter", "enter_waiting", "leave", "try_enter"]

log = logging.getLogger("djcachebench.sqlite")

#: How long a fork waits for the calls inside SQLite to come out (seconds).
FORK_WAIT: Final = 2.0

# Calls in and calls out, each an ``itertools.count``: ``next()`` on one is a
# single C call under the GIL, so no lock is taken on the hot path.
_ins = itertools.count()
_outs = itertools.count()
_forking = False
_open = threading.Event()
_open.set()


def _value(counter: itertools.count) -> int:
    return int(counter.__reduce__()[1][0])


#: SQLite's primary result code for a busy database.
_SQLITE_BUSY: Final = 5


class ForkUnderWay(sqlite3.OperationalError):
    """The gate is closed for a fork: busy, like a locked shard (code SQLITE_BUSY)."""

    def __init__(self) -> None:
        super().__init__("a fork of this process is under way")
        self.sqlite_errorcode = _SQLITE_BUSY


def enter() -> None:
    """Before a call into SQLite; raises :class:`ForkUnderWay` while a fork is
    under way (the caller waits as for a lock, within its bound).

    Count first, then look: a fork sets its flag first, then reads the counts.
    Under the GIL one of the two sees the other: either the fork counts this
    call and waits for it, or this call sees the flag and backs out.
    """
    next(_ins)
    if _forking:
        next(_outs)  # backed out: not inside
        raise ForkUnderWay()


def try_enter() -> bool:
    """:func:`enter` for a finalizer: False (not entered) while a fork is under
    way, never waiting. A finalizer runs wherever the garbage collector does:
    in a thread already inside the gate, or in the forking thread itself (in
    another library's fork hook), and a wait there waits for itself."""
    next(_ins)
    if _forking:
        next(_outs)
        return False
    return True


def enter_waiting() -> None:
    """:func:`enter` for calls that must happen (closing connections): waits
    while a fork is under way instead of raising."""
    while True:
        next(_ins)
        if not _forking:
            return
        next(_outs)  # backed out: not inside
        _open.wait(FORK_WAIT)


def leave() -> None:
    """After the call came out of SQLite (also when it raised)."""
    next(_outs)


def _inside() -> int:
    # Outs before ins: every call inside is then in ``ins`` and not in ``outs``,
    # and every call counted out was counted in, so this never undercounts.
    outs = _value(_outs)
    return _value(_ins) - outs


def _before_fork() -> None:
    global _forking
    _open.clear()
    _forking = True
    deadline = time.monotonic() + FORK_WAIT
    while True:
        inside = _inside()
        if inside <= 0:
            return
        if time.monotonic() >= deadline:
            log.warning("forking while %d thread(s) are still inside SQLite after %.1f s: "
                        "the child may block on its first SQLite call", inside, FORK_WAIT)
            return
        time.sleep(0.0002)  # releases the GIL: the calls inside can come out


def _after_fork_in_parent() -> None:
    global _forking
    _forking = False
    _open.set()


def _after_fork_in_child() -> None:
    global _ins, _outs, _open, _forking
    _ins, _outs = itertools.count(), itertools.count()
    _open = threading.Event()
    _open.set()
    _forking = False


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)
