"""Stampede protection keeps Django's ``get_or_set`` promises at its bounds: what a
caller gets when its wait runs out, when the store keeps nothing, and during an
outage across processes (real caches; several processes are played by callers
with scopes of their own, as in tests/stampede/test_stampede.py).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.backends.tiered import TieredCache
from djcachebench.bench.servers import RedisServer
from djcachebench.stampede import FAILED_PREFIX, LEASE_PREFIX, protected_get_or_set, side_key
from tests.sqlite.helpers import shard_locked, shard_of, shard_path
from tests.stampede.helpers import side_get

MISSING = object()


def _run(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run each call in a thread of its own; their results (or exceptions), in order."""
    results: list[Any] = [None] * len(calls)

    def one(i: int) -> None:
        try:
            results[i] = calls[i]()
        except Exception as exc:  # the test reads it
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def test_a_sub_second_timeout_over_a_whole_second_store_is_not_waited_for(
        tmp_path: Path, redis_server: RedisServer) -> None:
    """Django's RedisCache keeps ``int(timeout)`` seconds: 0.5 s keeps nothing. The
    callers of four processes queued for leases that never left a value, one
    computation after another; as in Django they now compute side by side."""
    cache = TieredCache("", {"OPTIONS": {
        "L2": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
               "LOCATION": redis_server.location},
        "GENERATION_PATH": str(tmp_path / "g.mmap"), "STAMPEDE_LEASE": 10.0}})
    key = f"sub-second-{uuid.uuid4().hex}"
    meet = threading.Barrier(4, timeout=5)  # < the lease: taking turns breaks it

    def compute() -> str:
        meet.wait()
        return "v"

    got = _run([lambda i=i: protected_get_or_set(cache, key, compute, 0.5, None, 10.0,
                                                  MISSING, scope=("process", i))
                for i in range(4)])
    assert got == ["v"] * 4 and not meet.broken
    assert cache.readable_after_set(1.0) and not cache.readable_after_set(0.5)


def test_a_waiter_past_its_bound_reads_before_computing(tmp_path: Path) -> None:
    """The computing process outlives twice the lease; meanwhile another process
    takes the expired lease over and stores its value. A caller of the first
    process whose wait runs out returns that value, as Django's get_or_set (a
    read first) would: before, it computed again, slowly."""
    cache = ShardedSQLiteCache(str(tmp_path / "disk"), {})
    release_slow = threading.Event()
    computed: list[str] = []

    def slow() -> str:
        computed.append("slow")
        release_slow.wait(20)
        return "slow"

    def fast() -> str:
        computed.append("fast")
        return "fast"

    def in_first_process() -> Any:
        return protected_get_or_set(cache, "k", slow, 300, None, 1.0, MISSING, scope="first")

    def in_second_process() -> Any:
        time.sleep(1.3)  # the first's lease (1 s) has expired: this one takes over
        return protected_get_or_set(cache, "k", fast, 300, None, 1.0, MISSING, scope="second")

    def follower() -> Any:
        time.sleep(0.2)  # after the first process's leader: waits for it (bound: 2 s)
        started = time.monotonic()
        value = in_first_process()
        release_slow.set()
        return value, time.monotonic() - started

    leader, second, (followed, waited) = _run([in_first_process, in_second_process, follower])
    assert second == "fast" and followed == "fast"
    assert waited < 5.0
    assert computed == ["slow", "fast"]
    assert leader == "fast"  # add keeps the value stored first; the leader reads it back


def test_an_outage_never_makes_the_callers_of_several_processes_take_turns(
        tmp_path: Path) -> None:
    """Three processes of two callers each; every computation raises. After the
    second failed computation the four callers left compute side by side: each
    process's leader wakes its waiting caller before it computes itself. Before,
    that caller waited for its leader's computation, then made its own (the
    last callers of 4 processes x 3 threads waited 6 computations)."""
    cache = ShardedSQLiteCache(str(tmp_path / "disk"), {})
    count = iter(range(100))
    side_by_side = threading.Barrier(4, timeout=5)  # < the lease (10 s)

    def compute() -> str:
        if next(count) < 2:
            time.sleep(0.5)
        else:
            side_by_side.wait()
        raise RuntimeError("upstream down")

    calls = [lambda p=p: protected_get_or_set(cache, "k", compute, 60, None, 10.0, MISSING,
                                              scope=("process", p))
             for p in range(3) for _ in range(2)]
    got = _run(calls)
    assert all(isinstance(r, RuntimeError) for r in got), got
    assert not side_by_side.broken


def test_a_value_the_store_did_not_keep_counts_as_a_failed_computation(
        tmp_path: Path) -> None:
    """The leader's ``add`` of its value fails (its shard is locked past the
    retry policy): waiters in other processes have nothing to read. It is
    counted with the computations that raised, so that they stop queuing for
    the lease after two (before, nothing was counted)."""
    cache = ShardedSQLiteCache(str(tmp_path / "disk"), {"OPTIONS": {
        "LOCK_TIMEOUT": 0.05, "RETRIES": 0, "STAMPEDE_LEASE": 10.0}})
    def side_shard(prefix: str, key: str) -> int:
        name, version = side_key(cache, prefix, key)
        return cache._store.route(cache.make_key(name, version=version))

    key = next(k for k in (f"k{i}" for i in range(1000))
               if shard_of(cache, k) not in {side_shard(p, k)
                                             for p in (LEASE_PREFIX, FAILED_PREFIX)})
    with shard_locked(shard_path(cache, key), "write"):
        assert protected_get_or_set(cache, key, lambda: "v", 60, None, 10.0, MISSING) == "v"
    assert side_get(cache, FAILED_PREFIX, key) == 1
    assert side_get(cache, LEASE_PREFIX, key) is None
