"""A worker process's callers ("lanes"): the process itself, its threads, or its asyncio tasks.

Why callers inside a process: a Django site under gunicorn's ``gthread``
workers calls the cache from several threads of one process, and under an
ASGI server from many requests awaiting on one event loop; either way they
share the process's connections, its L1 and its interpreter lock, which
``--procs`` alone never shows.

* One lane, sync (the default): the process's own thread runs its ops.
* ``threads`` N: N threads, each with its own op list (its stream,
  ``Random(seed + stream)``), tally and history, and its own backend instance
  (``caches[alias]`` in the thread, as Django gives each thread: pylibmc's
  client, for one, must not be shared between threads). Every thread waits on
  the parent's start event itself, the one that releases every process, so
  all callers of the run start together.
* ``tasks`` N: N tasks on one event loop awaiting the ``a*`` methods
  (calls.arun_calls). The loop starts once the parent's start is seen; the
  tasks, created first, wait on one gate opened after all of them exist.
  Each task runs in its own asgiref ``ThreadSensitiveContext``, as Django's
  ``ASGIHandler`` runs each request: a backend without native async methods
  hops (``sync_to_async``) to a thread of its task's own, instead of every
  task queueing on the one thread shared outside any context. The tasks share
  the process's backend instance, as the requests of an ASGI process do
  (Django's ``caches`` is context-local, and they inherit the context).

Every lane runs its warm-up, then all lanes of the process meet (a barrier,
or a count on the loop) and ``between`` runs once -- the cache's own
counters are read there, between everybody's warm-up and measured ops --
and then the measured ops.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from djcachebench.bench.calls import Tally, arun_calls, run_calls
from djcachebench.bench.freshness import History
from djcachebench.bench.verify import Observer
from djcachebench.bench.workload import Op, Scenario


@dataclass
class LaneRun:
    """One lane's ops and, once it ran, its figures."""

    stream: int
    warmup: Sequence[Op]
    measured: Sequence[Op]
    observer: Observer
    history: History = field(default_factory=History)
    tally: Tally | None = None
    start_ns: int = 0  # time.monotonic_ns() at its first measured op
    end_ns: int = 0  # ... after its last one


def plan_lanes(
    scenario: Scenario, process: int, ops_of: Callable[[int], list[Op]]
) -> list[LaneRun]:
    """The lanes of worker ``process``, each with its stream's op list split into
    warm-up and measured ops (``ops_of(stream)``: workload.generate_ops)."""
    lanes = []
    for lane in range(scenario.lanes):
        stream = process * scenario.lanes + lane
        warmup, _ = scenario.stream_counts(stream)
        ops = ops_of(stream)
        lanes.append(LaneRun(stream, ops[:warmup], ops[warmup:], Observer(scenario)))
    return lanes


def run_lanes(
    cache: Any,
    thread_cache: Callable[[], Any],
    lanes: Sequence[LaneRun],
    asynchronous: bool,
    start_wait: Callable[[], None],
    done: Any,
    between: Callable[[], None],
    timeout: float,
) -> None:
    """Run every lane's warm-up, ``between()`` once, then every lane's measured ops.

    ``thread_cache()`` gives a thread its backend instance (threads only).
    ``start_wait`` blocks until the run's start (raises when it never comes);
    ``done[stream]`` is each lane's progress counter. Raises the first error a
    lane raised outside its calls (calls that raise are counted, calls.Tally).
    """
    if asynchronous:
        loop = asyncio.new_event_loop()
        try:
            start_wait()
            loop.run_until_complete(_tasks(cache, lanes, done, between))
        finally:
            loop.close()
    elif len(lanes) == 1:
        start_wait()
        _lane(cache, lanes[0], done, between)
    else:
        _threads(thread_cache, lanes, start_wait, done, between, timeout)


def _lane(
    cache: Any, lane: LaneRun, done: Any, meet: Callable[[], None]
) -> None:
    run_calls(cache, lane.warmup, Tally(None, lane.history, lane.observer), done, lane.stream, 0)
    meet()
    lane.tally = Tally(lane.observer, lane.history)
    lane.start_ns = time.monotonic_ns()
    run_calls(cache, lane.measured, lane.tally, done, lane.stream, len(lane.warmup))
    lane.end_ns = time.monotonic_ns()


def _threads(
    thread_cache: Callable[[], Any],
    lanes: Sequence[LaneRun],
    start_wait: Callable[[], None],
    done: Any,
    between: Callable[[], None],
    timeout: float,
) -> None:
    barrier = threading.Barrier(len(lanes), action=between, timeout=timeout)
    errors: list[BaseException] = []

    def body(lane: LaneRun) -> None:
        try:
            cache = thread_cache()
            start_wait()
            _lane(cache, lane, done, barrier.wait)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()  # the others must not wait for a lane that is gone

    threads = [
        threading.Thread(target=body, args=(lane,), name=f"djcb-lane-{lane.stream}", daemon=True)
        for lane in lanes
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        # The first cause, not the BrokenBarrierError it left the others with.
        raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)),
                   errors[0])


async def _tasks(
    cache: Any, lanes: Sequence[LaneRun], done: Any, between: Callable[[], None]
) -> None:
    from asgiref.sync import ThreadSensitiveContext

    gate = asyncio.Event()
    warmed = asyncio.Event()
    waiting = [len(lanes)]

    async def lane_task(lane: LaneRun) -> None:
        async with ThreadSensitiveContext():
            await gate.wait()
            warm = Tally(None, lane.history, lane.observer)
            await arun_calls(cache, lane.warmup, warm, done, lane.stream, 0)
            waiting[0] -= 1
            if not waiting[0]:
                between()
                warmed.set()
            await warmed.wait()
            lane.tally = Tally(lane.observer, lane.history)
            lane.start_ns = time.monotonic_ns()
            await arun_calls(cache, lane.measured, lane.tally, done, lane.stream,
                             len(lane.warmup))
            lane.end_ns = time.monotonic_ns()

    tasks = [asyncio.create_task(lane_task(lane)) for lane in lanes]
    gate.set()  # every task exists: they start on the loop's next turn, in order
    await asyncio.gather(*tasks)
