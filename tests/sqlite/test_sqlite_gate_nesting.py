"""No call through the fork gate inside another (store/forkgate.py, eviction.py).

A cull must not run the copy of a shard's lower counts as a call of its own
*inside* the removal's call: while a fork is under way the inner call is refused
at the gate (busy) while the outer one holds it, so the fork waits for a call
that waits for the fork, up to ``FORK_WAIT`` per fork, and the culling ``set``
gives up on a shard nobody has locked. The first test checks that calls never
nest two deep, the second that no write gives up.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.store import forkgate, reads


@pytest.fixture
def deepest(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], int]]:
    """Track, per thread, how many calls are inside the gate at once; yields a
    function returning the deepest nesting seen so far."""
    local = threading.local()
    seen = [0]
    real_enter, real_leave = forkgate.enter, forkgate.leave

    def enter() -> None:
        real_enter()
        local.depth = getattr(local, "depth", 0) + 1
        seen[0] = max(seen[0], local.depth)

    def leave() -> None:
        local.depth -= 1
        real_leave()

    monkeypatch.setattr(forkgate, "enter", enter)
    monkeypatch.setattr(forkgate, "leave", leave)
    monkeypatch.setattr(reads, "_enter", enter)
    monkeypatch.setattr(reads, "_leave", leave)
    yield lambda: seen[0]


WORKLOADS: dict[str, dict[str, Any]] = {
    "max_entries": {"MAX_ENTRIES": 40, "CULL_FREQUENCY": 3},
    "cull_frequency_0": {"MAX_ENTRIES": 40, "CULL_FREQUENCY": 0},
    "size_limit": {"MAX_ENTRIES": None, "SIZE_LIMIT": 40_000},
    "expired_rows": {"MAX_ENTRIES": 40, "CULL_FREQUENCY": 2},
}


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_no_call_into_the_store_is_made_inside_another(
    make_cache: Callable[..., ShardedSQLiteCache], deepest: Callable[[], int], workload: str
) -> None:
    cache = make_cache({"SHARDS": 2, **WORKLOADS[workload]})
    timeout = 0.001 if workload == "expired_rows" else None
    for i in range(300):
        cache.set(f"k{i}", "v" * 500, timeout=timeout if i % 2 else None)
        cache.add(f"a{i}", i)
        cache.get(f"k{i - 1}")
    cache.set_many({f"m{i}": i for i in range(50)})
    cache.get_many([f"m{i}" for i in range(50)])
    cache.delete_many([f"m{i}" for i in range(25)])
    cache.get_or_set("g", lambda: "computed")
    cache.set("n", 1)
    cache.incr("n")
    cache.touch("n", 60)
    cache.delete("n")
    cache.clear()
    assert cache.stats()["culled"] > 0 or workload == "expired_rows"
    assert deepest() == 1


def test_forks_while_another_thread_culls_leave_its_writes_alone(tmp_path: Path) -> None:
    """The case end to end: one thread culls at nearly every ``set``, the main
    thread forks; no write may give up (no other process holds any lock)."""
    cache = ShardedSQLiteCache(str(tmp_path / "cache"), {"OPTIONS": {
        "SHARDS": 1, "MAX_ENTRIES": 50}})
    stop = threading.Event()
    done: list[int] = []

    def writer() -> None:
        i = 0
        while not stop.is_set():
            cache.set(f"k{i}", "v" * 100)
            i += 1
        done.append(i)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for _ in range(30):
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
    finally:
        stop.set()
        thread.join(60)
    assert done and done[0] > 0
    assert cache.stats()["culled"] > 0
    assert cache.stats()["give_ups"] == 0
