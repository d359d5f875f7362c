"""Clean-up that a second Ctrl-C or SIGTERM cannot cut short.

The first SIGINT/SIGTERM turns into KeyboardInterrupt and the ``finally``
blocks stop servers and workers and remove temporary directories. A second
signal during that clean-up used to raise another KeyboardInterrupt inside
it: a redis-server's work directory, a samples directory or a defunct
memcached stayed behind. :func:`deferred_signals` holds SIGINT and SIGTERM
for the length of a clean-up and delivers the first one held once it is done,
through the handler that was in place, so the interruption still happens.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

#: The signals a user or a supervisor sends to stop the harness.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def deferred_signals() -> Iterator[None]:
    """Run the block with SIGINT/SIGTERM held; re-deliver the first one afterwards.

    Only the main thread can set handlers; elsewhere the block runs as it is.
    Nested uses hold the signals until the outermost one ends.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    previous = {sig: signal.signal(sig, hold) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if received:
            # The handler in place before decides: KeyboardInterrupt for
            # SIGINT and for the commands' SIGTERM, or the default action.
            signal.raise_signal(received[0])


class Terminated(KeyboardInterrupt):
    """SIGTERM, taken through Ctrl-C's clean-up path; told apart for the exit status
    (143 rather than 130), which is how a supervisor knows its own signal ended the run."""


#: Signals whose handler raised, not yet seen through (``raise_pending``).
_pending: list[int] = []


def terminate_as_interrupt(signum: int, frame: FrameType | None) -> None:
    """A SIGTERM handler: the same clean-up as Ctrl-C (``finally`` blocks stop servers)."""
    _pending.append(signum)
    raise Terminated


def interrupt_noted(signum: int, frame: FrameType | None) -> None:
    """A SIGINT handler: Python's own, remembered (see ``raise_pending``)."""
    _pending.append(signum)
    raise KeyboardInterrupt


def raise_pending() -> None:
    """Raise the interrupt a handler raised where it was lost.

    A handler's exception raised while a finalizer runs (multiprocessing's, or
    any ``__del__``) is printed as "ignored" and dropped: the run went on to its
    end as if no signal had come. The loops that wait on workers call this,
    so such a signal still ends the run within their period."""
    if _pending:
        signum = _pending.pop()
        _pending.clear()
        raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt


def seen_through() -> None:
    """The interrupt was taken: nothing pending any more."""
    _pending.clear()


def signal_of(exc: BaseException) -> int:
    """The signal an interrupt came from: SIGTERM for :class:`Terminated`, else SIGINT."""
    return int(signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)
