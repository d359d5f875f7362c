"""An async caller's cancellation carried into the sync call it awaits.

Why: asgiref's ``sync_to_async`` holds a cancelled task until the sync call
returns. For a call that waits (``get_or_set`` waiting for another caller's
computation, up to twice the stampede lease) that held both the task and the
thread-sensitive thread for the whole wait. :func:`run_abandonable` returns at
once on cancellation and tells the thread, whose waits (:func:`wait`,
:func:`pause`) then raise :class:`Abandoned` at their next check.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import sync_to_async

__all__ = ["Abandoned", "pause", "run_abandonable", "wait"]

#: How often a waiting thread whose async caller may cancel looks whether it did.
_ABANDON_CHECK_EVERY = 0.01

R = TypeVar("R")


class Abandoned(Exception):
    """The async caller of this ``get_or_set`` was cancelled: stop waiting."""


# The thread's "abandoned" event while it runs an aget_or_set (run_abandonable).
_async_call = threading.local()


async def run_abandonable(call: Callable[[], R]) -> R:
    """``call()`` in asgiref's thread-sensitive thread, as Django's ``sync_to_async``
    runs it, except that a cancellation of the awaiting task is not held until
    ``call`` returns: the task is cancelled at once, and ``call``'s waits in
    ``djcachebench.stampede.protected_get_or_set`` raise :class:`Abandoned` at
    their next check.

    Why not plain ``sync_to_async``: on cancellation asgiref waits for the
    thread to finish, so a cancelled ``aget_or_set`` waiting for another
    process's computation held its task and the thread for up to twice the
    lease."""
    abandoned = threading.Event()

    def run() -> R:
        _async_call.abandoned = abandoned
        try:
            return call()
        finally:
            _async_call.abandoned = None

    inner = asyncio.ensure_future(sync_to_async(run, thread_sensitive=True)())
    try:
        return await asyncio.shield(inner)
    except asyncio.CancelledError:
        abandoned.set()
        # Its outcome (Abandoned, or the value of a computation that was already
        # running) has no caller left; retrieving it keeps asyncio from logging it.
        inner.add_done_callback(_retrieve)
        raise


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def wait(event: threading.Event, timeout: float) -> bool:
    """``event.wait(timeout)``; in a thread of an async caller, checked for
    :class:`Abandoned` every ``_ABANDON_CHECK_EVERY``."""
    abandoned = getattr(_async_call, "abandoned", None)
    if abandoned is None:
        return event.wait(timeout)
    ends = time.monotonic() + timeout
    while True:
        if abandoned.is_set():
            raise Abandoned
        left = ends - time.monotonic()
        if event.wait(max(0.0, min(left, _ABANDON_CHECK_EVERY))):
            return True
        if left <= _ABANDON_CHECK_EVERY:
            return False


def pause(sleep: Callable[[float], None], seconds: float) -> None:
    """A waiter's pause between two reads: ``sleep(seconds)``, or, in a thread of
    an async caller, a wait that ends with :class:`Abandoned` if it is cancelled."""
    abandoned = getattr(_async_call, "abandoned", None)
    if abandoned is None:
        sleep(seconds)
    elif abandoned.wait(seconds):
        raise Abandoned
