"""Shared helpers of the ShardedSQLiteCache tests (``tests/sqlite/``).

Test modules import what they use from here; the fixtures (``cache_dir``,
``make_cache``, ``cache``) are in ``tests/sqlite/conftest.py``.

Nothing here asserts behaviour; it only builds caches (or the error building
one raises), finds where a key is stored and runs child processes within a
time bound, so that a broken backend makes a test fail instead of hanging the
suite.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import pytest
from django.core.cache import CacheHandler
from django.core.exceptions import ImproperlyConfigured

from djcachebench.backends.sqlite import BACKEND_PATH, ShardedSQLiteCache

# Every child process gets at most this long (seconds) before it is killed and
# the test fails: generous, because the machine is small and shared.
CHILD_DEADLINE = 120.0

# Options for tests about correctness under contention, not about timeouts:
# a lock wait long enough that a busy, noisy machine never causes a give-up.
PATIENT = {"LOCK_TIMEOUT": 10.0, "RETRIES": 2, "RETRY_BACKOFF": 0.05}

SPAWN = multiprocessing.get_context("spawn")


def new_cache(location: Path | str, options: dict[str, Any] | None = None,
              **params: Any) -> ShardedSQLiteCache:
    """A backend built the way Django's ``CacheHandler`` builds it: ``(LOCATION, params)``."""
    return ShardedSQLiteCache(str(location), {"OPTIONS": options or {}, **params})


def caches_entry(location: Path | str, options: dict[str, Any] | None = None,
                 **params: Any) -> dict[str, Any]:
    """The ``CACHES`` entry of a ShardedSQLiteCache (for ``settings.CACHES``)."""
    return {"BACKEND": BACKEND_PATH, "LOCATION": str(location), "OPTIONS": options or {},
            **params}


# -- where a key lives ------------------------------------------------------------


def shard_of(cache: ShardedSQLiteCache, key: str) -> int:
    """Index of the shard that stores the Django key ``key``."""
    return cache._store.route(cache.make_key(key))


def shard_path(cache: ShardedSQLiteCache, key: str) -> str:
    """Path of the SQLite file that stores the Django key ``key``."""
    return cache._store.shards[shard_of(cache, key)].path


def keys_in_shard(cache: ShardedSQLiteCache, index: int, count: int,
                  prefix: str = "k") -> list[str]:
    """``count`` Django keys that all route to shard ``index``."""
    found: list[str] = []
    n = 0
    while len(found) < count:
        key = f"{prefix}{n}"
        if shard_of(cache, key) == index:
            found.append(key)
        n += 1
    return found


def keys_elsewhere(cache: ShardedSQLiteCache, index: int, count: int,
                   prefix: str = "o") -> list[str]:
    """``count`` Django keys that route to any shard but ``index``."""
    found: list[str] = []
    n = 0
    while len(found) < count:
        key = f"{prefix}{n}"
        if shard_of(cache, key) != index:
            found.append(key)
        n += 1
    return found


def shard_files(location: Path | str) -> list[Path]:
    """The live shard databases of a cache directory (not quarantined copies)."""
    return sorted(Path(location).glob("shard-*.sqlite3"))


def integrity_check(path: Path | str) -> str:
    """``PRAGMA integrity_check`` of one SQLite file, through a plain connection."""
    conn = sqlite3.connect(str(path), timeout=30)
    try:
        return ";".join(row[0] for row in conn.execute("PRAGMA integrity_check"))
    finally:
        conn.close()


@contextlib.contextmanager
def raw_shard(path: Path | str) -> Iterator[sqlite3.Connection]:
    """A plain sqlite3 connection to a shard file, committed and closed on exit."""
    conn = sqlite3.connect(str(path), timeout=30, isolation_level=None)
    try:
        yield conn
    finally:
        conn.close()


# -- child processes ----------------------------------------------------------------


def start(target: Callable[..., Any], *args: Any) -> BaseProcess:
    """Start ``target(*args)`` in a fresh interpreter (spawn: no inherited state)."""
    proc = SPAWN.Process(target=target, args=args, daemon=True)
    proc.start()
    return proc


@contextlib.contextmanager
def shard_locked(path: str, how: str) -> Iterator[None]:
    """Hold shard file ``path`` locked from another process for the duration of
    the block (``how``: ``sqlite_workers.hold_shard_lock``)."""
    from .workers import hold_shard_lock

    ready, release = SPAWN.Event(), SPAWN.Event()
    holder = start(hold_shard_lock, path, how, ready, release)
    try:
        if not ready.wait(60):
            raise RuntimeError("the lock holder did not start")
        yield
    finally:
        release.set()
        if join_all([holder], 60) != [0]:
            raise RuntimeError("the lock holder failed or hung")


def join_all(procs: Sequence[BaseProcess], deadline: float = CHILD_DEADLINE) -> list[int | None]:
    """Wait for every process (at most ``deadline`` s in all); kill stragglers.

    Returns the exit codes; a process that had to be killed reports ``None``
    so the caller's assertion names the hang instead of the suite hanging.
    """
    import time

    end = time.monotonic() + deadline
    codes: list[int | None] = []
    for proc in procs:
        proc.join(max(0.0, end - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(10)
            codes.append(None)
        else:
            codes.append(proc.exitcode)
    return codes


def kill_writers(target: Callable[..., Any], location: Path, options: dict[str, Any],
                 seed: int, rounds: int = 4, writers: int = 3) -> None:
    """``rounds`` times, start ``writers`` processes running ``target(location,
    options, prefix, acks)`` (prefix ``r<round>w<writer>``) and SIGKILL each a
    random 0.05-0.4 s after its first acknowledged write. Asserts that each
    wrote and died of the signal (the message names ``seed``)."""
    import os
    import random
    import signal
    import time

    rng = random.Random(seed)
    for round_ in range(rounds):
        procs = []
        for w in range(writers):
            recv, send = SPAWN.Pipe(duplex=False)
            procs.append((start(target, str(location), options, f"r{round_}w{w}", send), recv))
            send.close()
        for proc, recv in procs:
            assert recv.poll(60), f"writer made no write (seed {seed})"
            deadline = time.monotonic() + rng.uniform(0.05, 0.4)
            while time.monotonic() < deadline and recv.poll(0.01):
                recv.recv()
            os.kill(proc.pid, signal.SIGKILL)
        assert join_all([p for p, _ in procs], 60) == [-signal.SIGKILL] * writers, seed



class TouchOnUnpickle:
    """A pickle payload that creates ``marker`` if anything ever unpickles it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))

# -- a custom serializer, reached by dotted path ---------------------------------


class JsonSerializer:
    """A ``SERIALIZER`` given as a dotted path: JSON text, for plain data only."""

    def dumps(self, value: Any) -> bytes:
        return json.dumps(value, sort_keys=True).encode()

    def loads(self, data: bytes) -> Any:
        return json.loads(data)


class NotASerializer:
    """A class without ``dumps``/``loads``: rejected as a ``SERIALIZER``."""


class RefusingSerializer:
    """A serializer that cannot be built (a setting of its own missing, say)."""

    def __init__(self) -> None:
        raise ValueError("its own setting is missing")


class TextSerializer:
    """A serializer whose ``dumps`` gives ``str`` (JSON text), not bytes."""

    def dumps(self, value: Any) -> str:
        return json.dumps(value)

    def loads(self, data: bytes) -> Any:
        return json.loads(data)


def build_from_settings(settings: Any, entry: dict[str, Any]) -> Any:
    """Put ``entry`` in ``settings.CACHES['default']`` and build it as Django does."""
    settings.CACHES = {"default": entry}
    backend = CacheHandler()["default"]
    if isinstance(backend, ShardedSQLiteCache):
        backend.close_connections()
    return backend


def config_error(settings: Any, entry: dict[str, Any]) -> str:
    """The message of the ``ImproperlyConfigured`` raised when building ``entry``."""
    with pytest.raises(ImproperlyConfigured) as info:
        build_from_settings(settings, entry)
    return str(info.value)
