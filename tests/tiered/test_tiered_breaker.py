"""The circuit breaker in front of a TieredCache's L2 (``tiered/breaker.py``).

A *stopped* redis (SIGSTOP: it accepts nothing and answers nothing) and a
ShardedSQLiteCache whose shard another process holds locked are the real
outages pinned here: after ``BREAKER_THRESHOLD`` failed calls, calls that would
reach the L2 fail at once in every process of the host; what the L1 holds is
still served (past its expiry with ``SERVE_STALE``); a write is never
acknowledged and leaves no L1 copy of the value it meant to replace; the
breaker closes by itself once the L2 answers a probe. No timing is asserted:
"at once" is shown by what the call raised (``L2Unavailable``, the breaker's,
not the socket timeout's) and by the counters.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.checks import Warning as CheckWarning
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from djcachebench.backends.tiered import TieredCache
from djcachebench.bench.servers import RedisServer
from djcachebench.checks_tiered import W_NO_TIMEOUT, check_tiered_caches
from djcachebench.tiered.breaker import L2Unavailable, is_outage
from tests.sqlite.helpers import shard_locked
from tests.tiered import breaker_workers
from tests.tiered.helpers import SQLITE, locmem_tiered

SPAWN = multiprocessing.get_context("spawn")
REDIS = "django.core.cache.backends.redis.RedisCache"
POLL_FOR = 60.0  # seconds: generous, for a small shared machine


@pytest.fixture
def redis_to_stop() -> Iterator[RedisServer]:
    """A redis-server of this test's own: the test stops and continues it."""
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        os.kill(server.pid, signal.SIGCONT)  # type: ignore[arg-type]
        server.stop()


def redis_options(server: RedisServer, tmp_path: Path, **options: Any) -> dict[str, Any]:
    return {
        "L2": {"BACKEND": REDIS, "LOCATION": server.location,
               "OPTIONS": {"socket_timeout": 0.3, "socket_connect_timeout": 0.3}},
        "GENERATION_PATH": str(tmp_path / "generations.mmap"),
        "BREAKER_THRESHOLD": 3, **options,
    }


def in_another_process(target: Any, *args: Any) -> Any:
    out = SPAWN.Queue()
    proc = SPAWN.Process(target=target, args=(*args, out))
    proc.start()
    try:
        return out.get(timeout=120)
    finally:
        proc.join(60)
        if proc.is_alive():
            proc.kill()


def open_breaker(cache: TieredCache, absent: str = "absent") -> list[str]:
    """Read an absent key until the breaker refuses: what each read raised."""
    raised: list[str] = []
    while not raised or raised[-1] != "L2Unavailable":
        with pytest.raises(Exception) as info:
            cache.get(f"{absent}-{len(raised)}")
        raised.append(type(info.value).__name__)
        assert len(raised) <= 10, raised
    return raised


def test_a_stopped_redis_fails_at_once_in_every_process_and_the_l1_still_serves(
    redis_to_stop: RedisServer, tmp_path: Path,
) -> None:
    """Without the breaker every read of the absent key waited the socket timeout
    and raised redis's TimeoutError; the process that did not meet the outage
    itself refuses its first call too (the state is the host's)."""
    options = redis_options(redis_to_stop, tmp_path, BREAKER_COOLDOWN=3600)
    cache = TieredCache("", {"OPTIONS": options})
    held = {f"held-{i}": f"value-{i}" for i in range(20)}
    for key, value in held.items():
        cache.set(key, value)
        assert cache.get(key) == value

    os.kill(redis_to_stop.pid, signal.SIGSTOP)  # type: ignore[arg-type]

    raised = open_breaker(cache)
    assert raised[:-1] == ["TimeoutError"] * 3  # the threshold's failures, then at once
    assert all(cache.get(key) == value for key, value in held.items())
    stats = cache.stats()
    assert stats["breaker_opened"] == 1 and stats["fast_failures"] >= 1

    with pytest.raises(L2Unavailable):
        cache.set("held-0", "never acknowledged")
    with pytest.raises(L2Unavailable):  # its old value is not served either
        cache.get("held-0")
    assert cache.get("held-1") == "value-1"

    raised_there, stats_there = in_another_process(breaker_workers.first_miss, options,
                                                   "absent-elsewhere")
    assert raised_there == "L2Unavailable"
    assert stats_there["breaker_opened"] == 0 and stats_there["fast_failures"] == 1


def test_the_breaker_closes_once_the_l2_answers_a_probe(
    redis_to_stop: RedisServer, tmp_path: Path,
) -> None:
    options = redis_options(redis_to_stop, tmp_path, BREAKER_COOLDOWN=0.5)
    cache = TieredCache("", {"OPTIONS": options})
    os.kill(redis_to_stop.pid, signal.SIGSTOP)  # type: ignore[arg-type]
    open_breaker(cache)
    os.kill(redis_to_stop.pid, signal.SIGCONT)  # type: ignore[arg-type]

    deadline = time.monotonic() + POLL_FOR
    while True:
        try:
            cache.set("after", "the outage")
            break
        except L2Unavailable:
            assert time.monotonic() < deadline, "the breaker never let a probe through"
            time.sleep(0.05)
    assert in_another_process(breaker_workers.read, options, "after") == "the outage"
    assert cache.get("absent-again") is None  # closed: the L2 is asked again


def test_serve_stale_serves_an_expired_l1_copy_only_while_the_breaker_is_open(
    redis_to_stop: RedisServer, tmp_path: Path,
) -> None:
    options = redis_options(redis_to_stop, tmp_path, BREAKER_COOLDOWN=3600,
                            SERVE_STALE=3600, L1_TIMEOUT=0.2)
    cache = TieredCache("", {"OPTIONS": options})
    cache.set("page", "kept")
    assert cache.get("page") == "kept"
    time.sleep(0.3)  # past the copy's L1 expiry
    os.kill(redis_to_stop.pid, signal.SIGSTOP)  # type: ignore[arg-type]
    open_breaker(cache)

    assert cache.get("page") == "kept"
    assert cache.get_many(["page"]) == {"page": "kept"}
    assert cache.stats()["stale_served"] == 2


def test_without_serve_stale_an_expired_copy_is_not_served(
    redis_to_stop: RedisServer, tmp_path: Path,
) -> None:
    options = redis_options(redis_to_stop, tmp_path, BREAKER_COOLDOWN=3600, L1_TIMEOUT=0.2)
    cache = TieredCache("", {"OPTIONS": options})
    cache.set("page", "kept")
    assert cache.get("page") == "kept"
    time.sleep(0.3)
    os.kill(redis_to_stop.pid, signal.SIGSTOP)  # type: ignore[arg-type]
    open_breaker(cache)
    with pytest.raises(L2Unavailable):
        cache.get("page")


def test_over_a_locked_sqlite_shard_refusals_answer_as_the_l2_answers_failures(
    tmp_path: Path,
) -> None:
    """ShardedSQLiteCache turns a shard it cannot lock into a miss and False
    (its failure count says so); the refused calls answer the same, and a
    refused write leaves no L1 copy of the value it meant to replace."""
    location = tmp_path / "sqlite"
    cache = TieredCache("", {"OPTIONS": {
        "L2": {"BACKEND": SQLITE, "LOCATION": str(location),
               "OPTIONS": {"SHARDS": 1, "LOCK_TIMEOUT": 0.05, "RETRIES": 0}},
        "BREAKER_THRESHOLD": 2, "BREAKER_COOLDOWN": 3600}})
    cache.set("held", "value")
    assert cache.get("held") == "value"
    with shard_locked(str(location / "shard-000.sqlite3"), "write"):
        assert cache.add("one", 1) is False  # the L2's own failures, counted
        assert cache.add("two", 2) is False
        assert cache.stats()["breaker_opened"] == 1
        fast = cache.stats()["fast_failures"]
        assert cache.add("three", 3) is False
        assert cache.set("held", "never acknowledged") is None
        assert cache.get("held") is None  # refused: the old copy is gone
        assert cache.delete("held") is False
        assert cache.set_many({"a": 1, "b": 2}) == ["a", "b"]
        assert cache.stats()["fast_failures"] >= fast + 5


def test_options_are_checked() -> None:
    with pytest.raises(ImproperlyConfigured, match="SERVE_STALE"):
        TieredCache("", {"OPTIONS": {"L2": {"BACKEND": SQLITE, "LOCATION": "/tmp/x"},
                                     "BREAKER_THRESHOLD": None, "SERVE_STALE": 5}})
    for name, value in (("BREAKER_THRESHOLD", 0), ("BREAKER_COOLDOWN", 0),
                        ("SERVE_STALE", -1), ("BREAKER_THRESHOLD", 1.5)):
        with pytest.raises(ImproperlyConfigured, match=name):
            TieredCache("", {"OPTIONS": {"L2": {"BACKEND": SQLITE, "LOCATION": "/tmp/x"},
                                         name: value}})


def test_a_working_l2_never_opens_the_breaker(tmp_path: Path) -> None:
    """Errors that are the call's (a bad incr, a key Django refuses) are answers."""
    cache = locmem_tiered(tmp_path, BREAKER_THRESHOLD=1)
    for _ in range(5):
        with pytest.raises(ValueError):
            cache.incr("missing")
    cache.set("k", 1)
    assert cache.incr("k") == 2
    assert cache.stats()["breaker_opened"] == 0


def test_what_counts_as_an_outage() -> None:
    import redis

    assert is_outage(redis.exceptions.ConnectionError()) and is_outage(TimeoutError())
    assert is_outage(redis.exceptions.TimeoutError()) and is_outage(L2Unavailable())
    assert not is_outage(ValueError()) and not is_outage(redis.exceptions.ResponseError())


@pytest.mark.parametrize("backend, options, warned", [
    (REDIS, {}, True),
    (REDIS, {"socket_timeout": 0.5}, False),
    ("django_redis.cache.RedisCache", {}, True),
    ("django_redis.cache.RedisCache", {"SOCKET_TIMEOUT": 0.5}, False),
    ("django_redis.cache.RedisCache", {"CONNECTION_POOL_KWARGS": {"socket_timeout": 1}}, False),
    ("django.core.cache.backends.memcached.PyLibMCCache", {}, True),
    ("django.core.cache.backends.memcached.PyLibMCCache",
     {"behaviors": {"receive_timeout": 500_000, "send_timeout": 500_000}}, False),
    ("django.core.cache.backends.memcached.PyMemcacheCache", {"timeout": 0.5}, False),
    (SQLITE, {}, False),
])
def test_a_redis_or_memcached_l2_without_a_socket_timeout_is_warned_about(
    tmp_path: Path, backend: str, options: dict[str, Any], warned: bool,
) -> None:
    location = "redis://127.0.0.1:1/0" if "redis" in backend else (
        "127.0.0.1:1" if "memcached" in backend else str(tmp_path / "c"))
    caches = {"default": {"BACKEND": "djcachebench.backends.tiered.TieredCache", "OPTIONS": {
        "L2": {"BACKEND": backend, "LOCATION": location, "OPTIONS": options},
        "GENERATION_PATH": str(tmp_path / "g.mmap")}}}
    with override_settings(CACHES=caches):
        found = [m for m in check_tiered_caches() if m.id == W_NO_TIMEOUT]
    assert bool(found) == warned
    assert all(isinstance(m, CheckWarning) for m in found)


def test_the_outage_benchmark_runs(tmp_path: Path) -> None:
    """CI's short run of bench/breaker_outage.py: the command works (no timing)."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "bench" / "breaker_outage.py"
    out = tmp_path / "outage.json"
    run = subprocess.run([sys.executable, str(script), "--l2", "sqlite", "--seconds", "0.2",
                          "--keys", "5", "--out", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    import json

    (row,) = json.loads(out.read_text())
    assert row["held_wrong"] == 0 and row["read_elsewhere"] and row["breaker_opened"] == 1
