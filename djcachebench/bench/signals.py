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


def terminate_as_interrupt(signum: int, frame: FrameType | None) -> None:
    """A SIGTERM handler: the same clean-up as Ctrl-C (``finally`` blocks stop servers)."""
    raise Terminated


def signal_of(exc: BaseException) -> int:
    """The signal an interrupt came from: SIGTERM for :class:`Terminated`, else SIGINT."""
    return int(signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)
