"""Threads and asyncio tasks inside a worker process (bench/lanes.py): every call
counted once, all lanes released together, one latency per call, and the ``a*``
path awaited on the event loop (no thread hop for a TieredCache L1 hit)."""

from __future__ import annotations

import asyncio
import io
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from djcachebench.bench.lanes import LaneRun, plan_lanes, run_lanes
from djcachebench.bench.progress import Progress
from djcachebench.bench.runner import RunOptions, run_targets
from djcachebench.bench.targets import load_targets, select_targets
from djcachebench.bench.workload import (
    ACTIONS,
    REFERENCE,
    Scenario,
    ScenarioError,
    generate_ops,
)
from tests.tiered.helpers import locmem_tiered

#: Long enough never to trip on a loaded CI host; a lane that never arrives fails.
MEET_TIMEOUT = 30.0


def _scenario(**changes: Any) -> Scenario:
    base = REFERENCE.with_overrides(procs=2, ops=60, warmup=7)
    return base.with_overrides(**changes)


def _lanes(scenario: Scenario, process: int = 1) -> list[LaneRun]:
    return plan_lanes(scenario, process, lambda s: generate_ops(scenario, 0, s))


def _expected(lanes: list[LaneRun]) -> Counter[str]:
    return Counter(ACTIONS[code] for lane in lanes for code, _, _ in [*lane.warmup,
                                                                        *lane.measured])


class Calls:
    """What the fake caches saw: calls by action, the threads they ran on, and
    whether anything ran before the start."""

    def __init__(self, lanes: int) -> None:
        self.lock = threading.Lock()
        self.by_action: Counter[str] = Counter()
        self.threads: set[int] = set()
        self.started = threading.Event()
        self.before_start = 0
        self.meet = threading.Barrier(lanes, timeout=MEET_TIMEOUT)
        self.between_at: int | None = None

    def record(self, action: str) -> None:
        with self.lock:
            if not self.started.is_set():
                self.before_start += 1
            self.by_action[action] += 1
            self.threads.add(threading.get_ident())

    def total(self) -> int:
        return sum(self.by_action.values())


class ThreadCache:
    """A sync cache per thread (as Django gives); its first call waits for every
    lane's first call, which only returns if the lanes run at the same time."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self.first = True
        self.data: dict[Any, Any] = {}

    def _call(self, action: str) -> None:
        if self.first:
            self.first = False
            self.calls.meet.wait()
        self.calls.record(action)

    def get(self, key: Any) -> Any:
        self._call("get")
        return self.data.get(key)

    def set(self, key: Any, value: Any) -> None:
        self._call("set")
        self.data[key] = value

    def delete(self, key: Any) -> bool:
        self._call("delete")
        return self.data.pop(key, None) is not None

    def incr(self, key: Any) -> int:
        self._call("incr")
        raise ValueError(key)


def _run_threads(scenario: Scenario) -> tuple[list[LaneRun], Calls, list[int]]:
    lanes = _lanes(scenario)
    calls = Calls(len(lanes))
    waiting = threading.Semaphore(0)
    start = threading.Event()

    def start_wait() -> None:
        waiting.release()
        assert start.wait(MEET_TIMEOUT)

    def between() -> None:
        calls.between_at = calls.total()

    done = [0] * scenario.streams
    runner = threading.Thread(target=run_lanes, args=(
        None, lambda: ThreadCache(calls), lanes, False, start_wait, done, between,
        MEET_TIMEOUT))
    runner.start()
    for _ in lanes:  # every lane is waiting for the start, and nothing ran yet
        assert waiting.acquire(timeout=MEET_TIMEOUT)
    assert calls.total() == 0
    calls.started.set()
    start.set()
    runner.join(MEET_TIMEOUT)
    assert not runner.is_alive()
    return lanes, calls, done


def test_thread_lanes_count_every_call_once_and_start_together() -> None:
    scenario = _scenario(threads=4)
    lanes, calls, done = _run_threads(scenario)
    assert len(lanes) == 4 and len(calls.threads) == 4  # four threads called, at once
    assert calls.before_start == 0
    assert calls.by_action == _expected(lanes)
    # incr raised ValueError and set 1, as a Django counter does: both in one call's time.
    measured = Counter(ACTIONS[code] for lane in lanes for code, _, _ in lane.measured)
    for lane in lanes:
        assert lane.tally is not None and sum(lane.tally.errors) == 0
    for i, action in enumerate(ACTIONS):
        samples = [t for lane in lanes for t in lane.tally.lat[i]]  # type: ignore[union-attr]
        assert len(samples) == measured[action]  # one latency per measured call
        assert all(t >= 0 for t in samples)
    # The process's ops are shared by its threads, none lost nor added.
    assert sum(len(lane.measured) for lane in lanes) == scenario.ops
    assert sum(len(lane.warmup) for lane in lanes) == scenario.warmup
    assert [done[lane.stream] for lane in lanes] == [len(lane.warmup) + len(lane.measured)
                                                     for lane in lanes]
    # The cache's counters are read once every lane's warm-up is done, before any
    # measured op: exactly the warm-up calls (incr's set included) had been made.
    warm_calls = sum(1 + (code == 3) for lane in lanes for code, _, _ in lane.warmup)
    assert calls.between_at == warm_calls


class LoopCache:
    """An async cache whose every ``a*`` method runs on the loop and notes its
    thread; the first call of each task waits until every task made one."""

    def __init__(self, calls: Calls, tasks: int) -> None:
        self.calls = calls
        self.tasks = tasks
        self.arrived = 0
        self.all_in: asyncio.Event | None = None
        self.seen_first: set[asyncio.Task[Any] | None] = set()
        self.data: dict[Any, Any] = {}

    async def _call(self, action: str) -> None:
        task = asyncio.current_task()
        if task not in self.seen_first:
            self.seen_first.add(task)
            if self.all_in is None:
                self.all_in = asyncio.Event()
            self.arrived += 1
            if self.arrived == self.tasks:
                self.all_in.set()
            await asyncio.wait_for(self.all_in.wait(), MEET_TIMEOUT)
        self.calls.record(action)

    async def aget(self, key: Any) -> Any:
        await self._call("get")
        return self.data.get(key)

    async def aset(self, key: Any, value: Any) -> None:
        await self._call("set")
        self.data[key] = value

    async def adelete(self, key: Any) -> bool:
        await self._call("delete")
        return self.data.pop(key, None) is not None

    async def aincr(self, key: Any) -> int:
        await self._call("incr")
        raise ValueError(key)


def test_task_lanes_count_every_call_once_on_one_loop_and_start_together() -> None:
    scenario = _scenario(tasks=10, warmup=20)  # every task has a warm-up call
    lanes = _lanes(scenario, process=0)
    calls = Calls(1)
    cache = LoopCache(calls, len(lanes))
    loop_thread: list[int] = []

    def start_wait() -> None:
        loop_thread.append(threading.get_ident())
        calls.started.set()

    done = [0] * scenario.streams
    run_lanes(cache, lambda: pytest.fail("tasks share the process's cache"), lanes, True,
              start_wait, done, lambda: None, MEET_TIMEOUT)
    assert len(cache.seen_first) == 10  # ten tasks, each waited for all ten
    assert calls.threads == set(loop_thread)  # every a* call awaited on the loop's thread
    assert calls.before_start == 0
    assert calls.by_action == _expected(lanes)
    measured = Counter(ACTIONS[code] for lane in lanes for code, _, _ in lane.measured)
    for i, action in enumerate(ACTIONS):
        samples = [t for lane in lanes for t in lane.tally.lat[i]]  # type: ignore[union-attr]
        assert len(samples) == measured[action]
    assert sum(len(lane.measured) for lane in lanes) == scenario.ops
    assert [lane.stream for lane in lanes] == list(range(10))


def test_streams_split_the_process_ops_and_keep_one_lane_as_before() -> None:
    plain = _scenario()
    assert plain.streams == 2 and plain.stream_counts(1) == (7, 60)
    assert generate_ops(plain, 0, 1) == generate_ops(REFERENCE.with_overrides(
        procs=2, ops=60, warmup=7), 0, 1)
    split = _scenario(tasks=7)
    assert split.streams == 14
    assert [split.stream_counts(s) for s in range(7)] == [(1, 9)] * 4 + [(1, 8)] * 3
    assert len(generate_ops(split, 0, 13)) == 9  # process 1, its last task
    # Each stream draws from its own generator: no two lanes repeat each other.
    assert generate_ops(split, 0, 0) != generate_ops(split, 0, 1)


@pytest.mark.parametrize("changes", [{"threads": 2, "tasks": 2}, {"threads": 0},
                                     {"tasks": -1}, {"tasks": 61}, {"threads": 5000}])
def test_impossible_lanes_are_refused(changes: dict[str, int]) -> None:
    with pytest.raises(ScenarioError):
        _scenario(**changes)


def test_tiered_aget_answers_an_l1_hit_on_the_loop_thread(tmp_path: Path) -> None:
    cache = locmem_tiered(tmp_path)
    cache.set("k", {"a": 1})
    assert cache.get("k") == {"a": 1}  # now in the L1
    lookups: list[int] = []
    looked_up = cache._lookup

    def lookup(key: Any, version: Any) -> Any:
        lookups.append(threading.get_ident())
        return looked_up(key, version)

    def no_hop(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an L1 hit went through the sync get (a sync_to_async hop)")

    cache._lookup = lookup  # type: ignore[method-assign]
    cache.get = no_hop  # type: ignore[method-assign]

    async def hit() -> tuple[Any, int]:
        return await cache.aget("k"), threading.get_ident()

    value, loop_thread = asyncio.run(hit())
    assert value == {"a": 1}
    assert lookups == [loop_thread]


def test_a_run_with_threads_and_one_with_tasks_merge_every_call() -> None:
    locmem = select_targets(load_targets(), ["locmem"])
    for changes in ({"threads": 3}, {"tasks": 5}):
        scenario = REFERENCE.with_overrides(procs=2, ops=300, warmup=20, **changes)
        results = run_targets(locmem, RunOptions(scenario=scenario),
                              Progress(live=False, stream=io.StringIO()))
        (backend,) = results.backends
        assert backend.failures == [] and backend.stale == []
        assert backend.ops == 2 * 300  # --ops per process, whatever its lanes
        assert sum(s.errors for s in backend.actions.values()) == 0
        assert results.run["threads"] == scenario.threads
        assert results.run["tasks"] == scenario.tasks
        if scenario.tasks:
            assert any("sync_to_async" in note for note in backend.notes)
