"""Many processes on one cache directory: atomic, and durable once acknowledged.

Pinned (docs/architecture.md "One shard"): ``incr`` is one atomic SQL update, so
concurrent increments from several processes lose nothing; ``add`` is an
atomic insert-if-absent, so exactly one of several racing processes wins; a
``set`` that has returned survives the writer being SIGKILLed at any moment
(WAL + ``synchronous=NORMAL`` is durable against a process crash), and a
killed writer leaves every shard file passing ``PRAGMA integrity_check``.

The children are real processes started with ``spawn``: each configures
Django itself and uses ``caches["default"]`` (see ``sqlite_workers.py``).
Options use a long ``LOCK_TIMEOUT`` (PATIENT): these tests are about
correctness under contention, not about giving up, and the machine is slow
and shared. Every wait is bounded, so a deadlock fails instead of hanging.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache

from .helpers import PATIENT, SPAWN, integrity_check, join_all, shard_files, start
from .workers import acked_writer, add_race_worker, incr_worker

PROCESSES = 8

pytestmark = pytest.mark.slow


def test_concurrent_incr_from_processes_loses_no_update(
    cache_dir: Path, make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    times = 200
    cache = make_cache(PATIENT)
    cache.set("counter", 0)
    barrier = SPAWN.Barrier(PROCESSES)
    procs = [start(incr_worker, str(cache_dir), PATIENT, "counter", times, barrier)
             for _ in range(PROCESSES)]
    assert join_all(procs) == [0] * PROCESSES
    assert cache.get("counter") == PROCESSES * times
    assert cache.stats()["give_ups"] == 0


def test_concurrent_incr_beyond_64_bits_loses_no_update(
    cache_dir: Path, make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    """Past 2**63-1 incr is a read-modify-write under the shard's write lock: still atomic."""
    times = 50
    cache = make_cache(PATIENT)
    start_value = 2**63 - 1 - 100
    cache.set("big", start_value)
    barrier = SPAWN.Barrier(4)
    procs = [start(incr_worker, str(cache_dir), PATIENT, "big", times, barrier)
             for _ in range(4)]
    assert join_all(procs) == [0] * 4
    assert cache.get("big") == start_value + 4 * times


def test_exactly_one_process_wins_each_add_race(
    cache_dir: Path, make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    keys = [f"race-{i}" for i in range(25)]
    make_cache(PATIENT)
    barrier = SPAWN.Barrier(PROCESSES)
    pipes: list[Connection] = []
    procs = []
    for n in range(PROCESSES):
        recv, send = SPAWN.Pipe(duplex=False)
        procs.append(start(add_race_worker, str(cache_dir), PATIENT, f"p{n}", keys,
                           barrier, send))
        send.close()
        pipes.append(recv)
    won: dict[str, list[str]] = {key: [] for key in keys}
    for n, recv in enumerate(pipes):
        assert recv.poll(120), f"racer p{n} sent no result"
        for key in recv.recv():
            won[key].append(f"p{n}")
    assert join_all(procs) == [0] * PROCESSES
    assert {key: len(names) for key, names in won.items()} == {key: 1 for key in keys}
    # The stored value is the winner's, and a further add still loses.
    reader = make_cache(PATIENT)
    assert reader.get_many(keys) == {key: names[0] for key, names in won.items()}
    assert reader.add(keys[0], "late") is False


def _drain(recv: Connection, acked: dict[str, str], until: int | None,
           deadline: float) -> int:
    """Receive acknowledgements into ``acked``; stop after ``until`` messages or at EOF."""
    got = 0
    while until is None or got < until:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not recv.poll(remaining):
            break
        try:
            pairs = recv.recv()
        except EOFError:
            break
        acked.update(pairs)
        got += 1
    return got


def test_sigkilled_writers_lose_no_acknowledged_write(
    cache_dir: Path, make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    """Writers are killed with SIGKILL at random moments, mid-stream; every write they
    acknowledged (after ``set``/``set_many`` returned) reads back, and every shard
    passes ``PRAGMA integrity_check``."""
    options = {**PATIENT, "SHARDS": 4, "MAX_ENTRIES": None, "RAISE_ON_TIMEOUT": True}
    make_cache(options)
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    acked: dict[str, str] = {}
    for round_ in range(3):
        writers = []
        for w in range(3):
            recv, send = SPAWN.Pipe(duplex=False)
            proc = start(acked_writer, str(cache_dir), options, f"r{round_}w{w}", send)
            send.close()  # the child holds the only write end: EOF when it dies
            writers.append((proc, recv))
        for proc, recv in writers:
            deadline = time.monotonic() + 120
            wanted = rng.randrange(5, 80)
            got = _drain(recv, acked, wanted, deadline)
            assert got == wanted, f"writer acknowledged only {got} writes (seed {seed})"
            time.sleep(rng.uniform(0, 0.03))
            os.kill(proc.pid, signal.SIGKILL)
        for proc, recv in writers:
            assert join_all([proc], 60) == [-signal.SIGKILL]
            _drain(recv, acked, None, time.monotonic() + 30)  # acks sent before the kill
            recv.close()
    assert len(acked) >= 3 * 3 * 5
    for path in shard_files(cache_dir):
        assert integrity_check(path) == "ok", path
    reader = make_cache(options)
    found = reader.get_many(list(acked))
    lost = sorted(set(acked) - set(found))
    assert not lost, f"{len(lost)} acknowledged writes lost, e.g. {lost[:5]} (seed {seed})"
    assert found == acked
    assert reader.stats()["tampered"] == 0 and reader.stats()["corruptions"] == 0
    # The directory stays fully usable after the crashes.
    reader.set("after", "crash")
    assert reader.get("after") == "crash"
