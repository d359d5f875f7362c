"""Stampede protection of get_or_set: one computation however many callers, and a
bounded takeover when the computing process dies (real processes and threads)."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from djcachebench.stampede import LEASE_PREFIX, lease_seconds, protected_get_or_set
from tests.stampede import workers as stampede_workers
from tests.stampede.helpers import side_add, side_get
from tests.tiered.helpers import locmem_tiered, sqlite_tiered

SPAWN = multiprocessing.get_context("spawn")



def _lines(log: Path, word: str) -> int:
    return sum(1 for line in log.read_text().splitlines() if line.startswith(word))


def _crowd(tmp_path: Path, alias: str, procs: int, threads: int) -> tuple[list, Path]:
    log = tmp_path / "computations.log"
    log.touch()
    barrier = SPAWN.Barrier(procs)
    out = SPAWN.Queue()
    workers = [SPAWN.Process(target=stampede_workers.crowd,
                             args=(str(tmp_path / "disk"), alias, 10.0, str(log), 0.2,
                                   threads, barrier, out))
               for _ in range(procs)]
    for w in workers:
        w.start()
    try:
        results = [r for _ in workers for r in out.get(timeout=120)]
    finally:
        for w in workers:
            w.join(30)
            if w.is_alive():
                w.kill()
    return results, log


@pytest.mark.slow
@pytest.mark.parametrize("alias", ["tiered", "disk"])
def test_sixty_four_callers_one_computation(tmp_path: Path, alias: str) -> None:
    """16 processes x 4 threads ask for one cold key whose computation sleeps 0.2 s
    (so every caller arrives while it runs): the callable runs once, and every
    caller gets its value."""
    results, log = _crowd(tmp_path, alias, procs=16, threads=4)
    assert _lines(log, "start") == 1 and _lines(log, "done") == 1
    values = {value for value, _ in results}
    assert len(results) == 64 and len(values) == 1 and values.pop().startswith("computed by")


@pytest.mark.slow
@pytest.mark.parametrize("lease", [1.0, 0.4])
def test_a_killed_computation_is_taken_over_by_exactly_one_waiter(
    tmp_path: Path, lease: float
) -> None:
    """A lease of 0.5 s or less is stored as 1 s (whole seconds): the waiters'
    bound is twice the lease as stored, since with twice the lease as set they
    would all give up before the dead holder's lease expired and every one
    compute (the 0.4 case)."""
    log = tmp_path / "computations.log"
    log.touch()
    location = str(tmp_path / "disk")
    ready = SPAWN.Event()
    holder = SPAWN.Process(target=stampede_workers.lease_holder,
                           args=(location, lease, str(log), ready))
    holder.start()
    assert ready.wait(60), "the lease holder did not start computing"
    procs, threads = 4, 4
    barrier = SPAWN.Barrier(procs)
    out = SPAWN.Queue()
    waiters = [SPAWN.Process(target=stampede_workers.crowd,
                             args=(location, "tiered", lease, str(log), 0.2, threads,
                                   barrier, out))
               for _ in range(procs)]
    for w in waiters:
        w.start()
    time.sleep(0.3)
    os.kill(holder.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    holder.join(10)
    try:
        results = [r for _ in waiters for r in out.get(timeout=120)]
    finally:
        for w in waiters:
            w.join(30)
            if w.is_alive():
                w.kill()
    assert _lines(log, "start") == 2, log.read_text()  # the killed one, one takeover
    assert _lines(log, "done") == 1
    assert len({value for value, _ in results}) == 1
    took = time.monotonic() - killed_at
    # Bounded, not fast: the waiters give up after twice the lease; the slack is
    # for a loaded machine (spawned processes, one computation of 0.2 s).
    assert took < 2 * lease_seconds(lease) + 60, took


def test_a_plain_default_is_djangos_get_or_set(tmp_path: Path) -> None:
    cache = locmem_tiered(tmp_path)
    assert cache.get_or_set("k", "v") == "v"
    assert cache.get_or_set("k", "other") == "v"
    assert cache.get_or_set("none", None) is None
    assert side_get(cache, LEASE_PREFIX, "k") is None


def test_the_lease_is_released_after_a_computation(tmp_path: Path) -> None:
    cache = sqlite_tiered(tmp_path)
    assert cache.get_or_set("k", lambda: "computed") == "computed"
    assert side_get(cache, LEASE_PREFIX, "k") is None
    with pytest.raises(RuntimeError):
        cache.get_or_set("fails", _boom)
    assert side_get(cache, LEASE_PREFIX, "fails") is None, "a failed computation frees the lease"
    assert cache.get_or_set("fails", lambda: "second try") == "second try"


def _boom() -> Any:
    raise RuntimeError("the view failed")


def test_a_waiter_never_waits_past_twice_the_lease(tmp_path: Path) -> None:
    """A lease held by someone who never finishes: the waiter computes itself."""
    cache = sqlite_tiered(tmp_path)
    side_add(cache, LEASE_PREFIX, "k", "someone else", 300)
    started = time.monotonic()
    value = protected_get_or_set(cache, "k", lambda: "mine", 300, None, 0.2, object())
    assert value == "mine"
    # Twice the lease as stored (whole seconds): 2 s for 0.2.
    assert time.monotonic() - started < 2 * lease_seconds(0.2) + 1.0


def test_a_sub_second_lease_is_waited_for_as_it_is_stored(tmp_path: Path) -> None:
    """A lease of 0.4 s is stored for 1 s (whole seconds): two callers that do
    not share a flight (two processes, say) find it held by a holder that died,
    and must wait for it to expire, then one computes and the other gets its
    value. Waiting twice the lease as set (0.8 s), both would give up before the
    dead lease expired and both compute."""
    import threading

    cache = sqlite_tiered(tmp_path)
    side_add(cache, LEASE_PREFIX, "k", "a holder that died", lease_seconds(0.4))
    runs: list[int] = []
    got: list[Any] = []

    def compute() -> str:
        runs.append(1)
        time.sleep(0.3)
        return "computed"

    def caller(scope: str) -> None:
        got.append(protected_get_or_set(cache, "k", compute, 300, None, 0.4, object(),
                                        scope=scope))

    callers = [threading.Thread(target=caller, args=(f"process-{i}",)) for i in range(2)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(30)
    assert got == ["computed", "computed"]
    assert len(runs) == 1


def test_stampede_lease_none_turns_it_off(tmp_path: Path) -> None:
    cache = locmem_tiered(tmp_path, STAMPEDE_LEASE=None)
    side_add(cache, LEASE_PREFIX, "k", "someone else", 300)
    started = time.monotonic()
    assert cache.get_or_set("k", lambda: "mine") == "mine"
    assert time.monotonic() - started < 0.1


class _FinishesBetweenReads:
    """A real cache whose other caller finishes (stores the value, drops its lease)
    right after this caller read the value as missing and before it reads the lease:
    the interleaving that made two processes compute under 64 callers."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache
        self.finished = False

    def get(self, key: Any, default: Any = None, version: Any = None) -> Any:
        if key.startswith(LEASE_PREFIX) and not self.finished:
            self.finished = True
            self.cache.set("k", "theirs", 300)
            self.cache.delete(LEASE_PREFIX + "k", version=version)  # the lease's own version
        return self.cache.get(key, default, version=version)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cache, name)


def test_a_lease_won_after_the_value_was_stored_does_not_compute_again(tmp_path: Path) -> None:
    cache = sqlite_tiered(tmp_path)
    side_add(cache, LEASE_PREFIX, "k", "someone else", 300)
    computed: list[str] = []

    def mine() -> str:
        computed.append("mine")
        return "mine"

    value = protected_get_or_set(_FinishesBetweenReads(cache), "k", mine, 300, None, 10.0,
                                 object(), sleep=lambda _: None)
    assert value == "theirs" and computed == []
    assert side_get(cache, LEASE_PREFIX, "k") is None, "the lease won for nothing is dropped"


def _sqlite(location: Path, lease: float) -> Any:
    from djcachebench.backends.sqlite import ShardedSQLiteCache

    return ShardedSQLiteCache(str(location), {"OPTIONS": {"STAMPEDE_LEASE": lease}})


def _threads(count: int, target: Any) -> list[Any]:
    """Run ``target(i)`` in ``count`` threads released together; their results (or
    the exception each raised), in thread order."""
    results: list[Any] = [None] * count
    go = threading.Barrier(count)

    def one(i: int) -> None:
        go.wait(30)
        try:
            results[i] = target(i)
        except Exception as exc:  # the test compares what each caller got
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def test_the_threads_of_a_process_wait_on_one_callers_reads(tmp_path: Path) -> None:
    """16 threads, each with its own cache instance (as Django gives each thread),
    miss one key whose computation sleeps 0.3 s (so all of them miss while it
    runs): one computes and the others wait on its reads, not each polling the
    store every few milliseconds; the reads are counted."""
    caches = [_sqlite(tmp_path / "disk", 10.0) for _ in range(16)]
    calls: list[int] = []

    def compute() -> str:
        calls.append(1)
        time.sleep(0.3)
        return "computed"

    results = _threads(16, lambda i: caches[i].get_or_set("k", compute, 300))
    assert results == ["computed"] * 16 and len(calls) == 1
    reads = sum(c.stats()["hits"] + c.stats()["misses"] for c in caches)
    # The computing caller: its miss, the cross-process failure count before
    # the lease, the read after winning the lease, the read of what it stored,
    # the lease check on release; every other: its miss and one read once woken.
    assert reads <= 5 + 15 * 2, reads


def test_a_call_from_inside_its_own_computation_does_not_wait_for_itself(
        tmp_path: Path) -> None:
    """A computation that asks for its own key (directly or through a helper) waited,
    before the change, until its own lease expired: 10 s here."""
    cache = sqlite_tiered(tmp_path, STAMPEDE_LEASE=10.0)

    def outer() -> str:
        return "outer+" + cache.get_or_set("k", lambda: "inner", 300)

    started = time.monotonic()
    assert cache.get_or_set("k", outer, 300) == "inner"  # add keeps the first value stored
    assert time.monotonic() - started < 5.0
    assert side_get(cache, LEASE_PREFIX, "k") is None


def test_when_the_computing_thread_fails_one_waiting_thread_computes(tmp_path: Path) -> None:
    """The computation raises for the caller that ran it (as Django's get_or_set
    would); the callers that waited for it start over, and one of them computes."""
    caches = [_sqlite(tmp_path / "disk", 10.0) for _ in range(8)]
    calls: list[int] = []

    def compute() -> str:
        calls.append(1)
        time.sleep(0.2)
        if len(calls) == 1:
            raise RuntimeError("the view failed")
        return "second try"

    results = _threads(8, lambda i: caches[i].get_or_set("k", compute, 300))
    failed = [r for r in results if isinstance(r, RuntimeError)]
    assert len(failed) == 1 and results.count("second try") == 7, results
    assert len(calls) == 2


def test_a_lease_the_cache_could_not_take_is_not_waited_for(tmp_path: Path) -> None:
    """ShardedSQLiteCache's ``add`` answers False when its shard cannot be reached
    (its failure counted); the caller must not take that for a lease somebody
    holds and wait twice the lease before computing. The shard of the lease key
    is made a directory: the caller computes at once."""
    import zlib

    from djcachebench.backends.sqlite import ShardedSQLiteCache
    from djcachebench.stampede import side_key

    location = str(tmp_path / "sqlite")
    options = {"SHARDS": 4, "STAMPEDE_LEASE": 3, "LOCK_TIMEOUT": 0.05, "RETRIES": 0}
    cache = ShardedSQLiteCache(location, {"OPTIONS": options})
    lease_key, side = side_key(cache, LEASE_PREFIX, "page", None)
    final = cache.make_key(lease_key, version=side)
    shard = os.path.join(location, f"shard-{zlib.crc32(final.encode()) % 4:03d}.sqlite3")
    cache.close_connections()
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(shard + suffix):
            os.unlink(shard + suffix)
    os.mkdir(shard)
    cache = ShardedSQLiteCache(location, {"OPTIONS": options})
    calls: list[int] = []
    started = time.monotonic()
    assert cache.get_or_set("page", lambda: calls.append(1) or "computed") == "computed"
    assert calls == [1]
    assert time.monotonic() - started < 1.5  # not the 6 s of two leases


@pytest.mark.parametrize("make", ["sqlite", "tiered"])
def test_callers_compute_side_by_side_when_nothing_can_be_stored(
        tmp_path: Path, make: str) -> None:
    """With a timeout of 0 (Django: store nothing) the callers of one process must
    not compute one after another, the k-th waiting k computations. Nothing
    stored is nothing to wait for: each computes at once, side by side, as with
    Django's get_or_set. The barrier lets no computation finish until all four
    run."""
    cache = _protected(tmp_path, make)
    # Shorter than the followers' bound (twice the lease, 20 s), after which
    # they compute anyway: so taking turns breaks it.
    meet = threading.Barrier(4, timeout=15)

    def compute() -> str:
        meet.wait()
        return "v"

    got: list[Any] = []
    threads = [threading.Thread(target=lambda: got.append(cache.get_or_set("k", compute, 0)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got == ["v"] * 4 and not meet.broken


def _outage(call: Callable[[int, Callable[[], str]], Any],
            last_two_wait: float) -> tuple[list[Any], bool, int]:
    """Four callers (``call(i, compute)``) of a key whose every computation raises;
    the first two take 0.5 s each, the last two must run side by side (a
    barrier of ``last_two_wait`` seconds). Returns what the callers got, whether
    the barrier broke, and how many computations ran."""
    calls = itertools.count()
    last_two = threading.Barrier(2, timeout=last_two_wait)

    def compute() -> str:
        n = next(calls)
        if n < 2:
            time.sleep(0.5)  # the other callers wait for it meanwhile
        else:
            last_two.wait()
        raise RuntimeError("upstream down")

    got: list[Any] = []

    def one(i: int) -> None:
        try:
            got.append(call(i, compute))
        except RuntimeError as exc:
            got.append(str(exc))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return got, last_two.broken, next(calls)


@pytest.mark.parametrize("make", ["sqlite", "tiered"])
def test_when_computations_keep_failing_the_waiters_stop_taking_turns(
        tmp_path: Path, make: str) -> None:
    """The same when every computation raises (an upstream outage): the callers
    took turns leading, each failing after the one before. Now, after a second
    failed computation, the rest compute side by side."""
    cache = _protected(tmp_path, make)
    # < the followers' bound, 20 s
    got, broken, _ = _outage(lambda i, compute: cache.get_or_set("k", compute, 60), 15)
    assert got == ["upstream down"] * 4 and not broken


@pytest.mark.parametrize("make", ["sqlite", "tiered"])
def test_when_computations_keep_failing_other_processes_stop_taking_turns(
        tmp_path: Path, make: str) -> None:
    """Across processes (each caller its own scope, as four processes sharing the
    store are): the waiting processes took turns at the lease, each computing
    and failing after the one before, the k-th waiting k computations. After a
    second failed computation within a lease the rest compute side by side.
    Fails on the code before: the last two meet only when the lease held by
    the first of them expires (10 s)."""
    cache = _protected(tmp_path, make)

    def as_a_process(i: int, compute: Callable[[], str]) -> Any:
        return protected_get_or_set(cache, "k", compute, 60, None, 10.0, object(),
                                    scope=("process", i))

    got, broken, computations = _outage(as_a_process, 5)  # < the lease, 10 s
    assert got == ["upstream down"] * 4 and not broken
    assert computations == 4


def _protected(tmp_path: Path, make: str) -> Any:
    if make == "sqlite":
        return _sqlite(tmp_path / "store", 10.0)
    return sqlite_tiered(tmp_path, STAMPEDE_LEASE=10.0)


@pytest.mark.parametrize("make", ["sqlite", "tiered"])
def test_a_valid_key_near_the_length_limit_gets_no_warning_and_keeps_its_lease(
        tmp_path: Path, make: str) -> None:
    """A 240-character key (valid) must not make side keys past 250 characters
    (three CacheKeyWarnings per get_or_set, and a lease memcached would refuse):
    such side keys name a digest of the key."""
    import warnings

    from django.core.cache.backends.base import CacheKeyWarning

    from djcachebench.stampede import side_key

    cache = _protected(tmp_path, make)
    key = "k" * 240
    lease_key, side = side_key(cache, LEASE_PREFIX, key)
    assert len(cache.make_key(lease_key, version=side)) <= 250
    assert side_key(cache, LEASE_PREFIX, "j" * 240)[0] != lease_key
    seen: list[Any] = []

    def compute() -> str:
        seen.append(side_get(cache, LEASE_PREFIX, key))  # the lease is held meanwhile
        return "computed"

    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheKeyWarning)
        assert cache.get_or_set(key, compute, 60) == "computed"
        assert cache.get_or_set(key, compute, 60) == "computed"
    assert len(seen) == 1 and seen[0] is not None
