"""``aget_or_set`` cancelled while it waits: the task ends at once, and asgiref's
thread-sensitive thread is free again, instead of both waiting out the lease's bound.

An ASGI server cancels the view task of a client that went away. Through plain
``sync_to_async`` the cancellation waited until the sync ``get_or_set`` returned:
twice the lease when it waited for another process's computation, and meanwhile
every thread-sensitive call of the context (the ORM of an async view) queued
behind it. Each test here fails on the code before ``run_abandonable``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from djcachebench.stampede import LEASE_PREFIX
from tests.sqlite.helpers import new_cache
from tests.stampede.helpers import side_add
from tests.tiered.helpers import sqlite_tiered

LEASE = 3.0  # a waiter's bound is twice this
PROMPT = 1.5  # what "at once" means here, with room for a loaded machine


def _cache(tmp_path: Path, kind: str) -> Any:
    options = {"STAMPEDE_LEASE": LEASE}
    if kind == "sqlite":
        return new_cache(tmp_path / "disk", options)
    return sqlite_tiered(tmp_path, **options)


async def _cancel_while_waiting(cache: Any, key: str) -> tuple[float, float]:
    """Start an ``aget_or_set`` of ``key``, cancel it once it waits, and return how
    long the cancellation took and how long a thread-sensitive call made right
    after it took."""
    task = asyncio.ensure_future(cache.aget_or_set(key, lambda: "computed here", 60))
    await asyncio.sleep(0.3)
    assert not task.done()  # it waits (for the lease's holder)
    cancelled_at = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    cancel_took = time.monotonic() - cancelled_at
    started = time.monotonic()
    assert await sync_to_async(lambda: "free", thread_sensitive=True)() == "free"
    return cancel_took, time.monotonic() - started


@pytest.mark.parametrize("kind", ["sqlite", "tiered"])
def test_a_cancelled_waiter_for_another_process_lease_ends_at_once(
        tmp_path: Path, kind: str) -> None:
    cache = _cache(tmp_path, kind)
    # Another process holds the lease and computes.
    assert side_add(cache, LEASE_PREFIX, "k", "another process", 60)
    cancel_took, next_call_took = asyncio.run(_cancel_while_waiting(cache, "k"))
    assert cancel_took < PROMPT and next_call_took < PROMPT
    # Nothing was computed or stored by the cancelled caller.
    assert cache.get("k") is None


@pytest.mark.parametrize("kind", ["sqlite", "tiered"])
def test_a_cancelled_waiter_for_a_thread_of_its_process_ends_at_once(
        tmp_path: Path, kind: str) -> None:
    """The async caller waits on this process's flight (a thread computes the key):
    cancelling it ends it at once, and the computing thread's value still lands."""
    cache = _cache(tmp_path, kind)
    computing = threading.Event()
    finish = threading.Event()

    def compute() -> str:
        computing.set()
        finish.wait(30)
        return "computed by the thread"

    leader = threading.Thread(target=lambda: cache.get_or_set("k", compute, 60))
    leader.start()
    try:
        assert computing.wait(10)
        cancel_took, next_call_took = asyncio.run(_cancel_while_waiting(cache, "k"))
    finally:
        finish.set()
        leader.join(30)
    assert cancel_took < PROMPT and next_call_took < PROMPT
    assert cache.get("k") == "computed by the thread"


@pytest.mark.parametrize("kind", ["sqlite", "tiered"])
def test_an_async_caller_still_gets_the_value_another_process_computed(
        tmp_path: Path, kind: str) -> None:
    """Not cancelled, the async waiter returns the value the lease's holder stores."""
    cache = _cache(tmp_path, kind)
    assert side_add(cache, LEASE_PREFIX, "k", "another process", 60)

    async def run() -> Any:
        task = asyncio.ensure_future(cache.aget_or_set("k", lambda: "computed here", 60))
        await asyncio.sleep(0.3)
        await sync_to_async(cache.set, thread_sensitive=False)("k", "theirs", 60)
        return await asyncio.wait_for(task, 10)

    assert asyncio.run(run()) == "theirs"
