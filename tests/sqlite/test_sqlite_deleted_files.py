"""A shard file deleted under running processes is noticed and recreated.

Pinned (store/connections.py, docs/architecture.md "Faults"): an open SQLite
connection keeps the inode it opened, so after ``rm shard-003.sqlite3*`` a
running process would go on serving the deleted file's values, and writing
where nobody else reads, for ever. Each thread compares its connections'
(device, inode) with the shard paths at most every ``FILE_CHECK_INTERVAL``
seconds and reopens what changed: the new file (created if missing) is then
shared again with every other process, ``stats()["reopened"]`` counts it, and
the coherence table's epoch moves so no L1 keeps a value of the old file.
A ``-wal``/``-shm`` left without its database belongs to the deleted file and
is removed before the new file is created, never taken over by it.

All with real files; one reader is a real second process.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.store import connections

from .helpers import SPAWN, integrity_check, join_all, keys_in_shard, shard_path, start
from .workers import wait_for_value

# The check interval (read softly, so that this module also runs against code
# without one and fails on behaviour), and a wait longer than one interval.
INTERVAL = getattr(connections, "FILE_CHECK_INTERVAL", 1.0)
SETTLE = INTERVAL + 0.3


def remove(path: str, suffixes: tuple[str, ...] = ("", "-wal", "-shm")) -> None:
    for suffix in suffixes:
        if os.path.exists(path + suffix):
            os.unlink(path + suffix)


def test_deleted_shard_is_reopened_and_shared_again(
    make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    running = make_cache()
    running.set("k", "old")
    assert running.get("k") == "old"  # a warm connection on the file
    path = shard_path(running, "k")
    epoch = running.coherence_table.token("any")[1]
    remove(path)
    fresh = make_cache()  # another process starting now
    fresh.set("k", "new")
    assert os.path.exists(path)
    time.sleep(SETTLE)
    assert running.get("k") == "new"
    assert running.stats()["reopened"] == 1
    assert running.coherence_table.token("any")[1] != epoch
    # Its writes now reach the shared file too.
    running.set("k", "newer")
    assert fresh.get("k") == "newer"
    assert integrity_check(path) == "ok"


def test_only_the_database_file_deleted_leaves_no_shared_log(
    make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    """The -wal/-shm left behind belong to the deleted file. Were the new file to
    open next to them, its connections and those still on the deleted inode would
    share one wal-index over two different logs: SQLite then reads frames of the
    wrong file ("database disk image is malformed"), taken for a corrupt shard."""
    running = make_cache({"SHARDS": 1, "MAX_ENTRIES": None})
    running.set_many({f"old{i}": "o" * 100 for i in range(50)})
    path = shard_path(running, "old0")
    assert os.path.exists(path + "-wal") and os.path.exists(path + "-shm")
    remove(path, ("",))
    fresh = make_cache({"SHARDS": 1, "MAX_ENTRIES": None})
    for i in range(300):  # both sides write, before the running one notices
        fresh.set(f"f{i}", "f" * 200)
        running.set(f"r{i}", "r" * 200)
    assert fresh.get_many([f"old{i}" for i in range(50)]) == {}  # a new, empty file
    assert running.stats()["corruptions"] == 0
    assert fresh.stats()["corruptions"] == 0
    time.sleep(SETTLE)
    assert running.get_many([f"f{i}" for i in range(300)]) == {
        f"f{i}": "f" * 200 for i in range(300)}
    running.set("after", "shared")
    assert fresh.get("after") == "shared"
    assert running.stats()["corruptions"] == 0
    running.close_connections()
    fresh.close_connections()
    assert integrity_check(path) == "ok"


@pytest.mark.slow
def test_a_reader_process_sees_the_new_file(
    make_cache: Callable[..., ShardedSQLiteCache], cache_dir: Path
) -> None:
    writer = make_cache()
    writer.set("k", "old")
    path = shard_path(writer, "k")
    ready = SPAWN.Event()
    receive, send = SPAWN.Pipe(duplex=False)
    proc = start(wait_for_value, str(cache_dir), {}, "k", "new", ready, send)
    assert ready.wait(60)  # the reader has read "old" through its connection
    writer.close_connections()
    remove(path)
    writer.set("k", "new")  # creates the new file
    report = receive.recv() if receive.poll(60) else None
    assert join_all([proc]) == [0]
    assert report is not None
    assert report["first"] == "old"
    assert report["seen_after"] is not None, "the reader kept the deleted file"
    assert report["seen_after"] < INTERVAL + 5
    assert report["reopened"] == 1


def _get_once(location: str, options: dict, out: Any) -> None:
    cache = ShardedSQLiteCache(location, {"OPTIONS": options})
    out.put((cache.get("k", "miss"), cache.stats()["give_ups"]))


def test_recreating_a_deleted_shard_waits_no_longer_than_the_retry_policy(
        cache_dir: Path) -> None:
    """The process that recreates a deleted shard takes the directory's lock; every
    other process waits for it only within the retry policy (else for ever, if
    the holder is stopped). The lock is held here (as a stopped process would
    hold it): another process's get is a miss within the policy, and the shard
    comes back once the lock is free."""
    import fcntl
    import multiprocessing

    options = {"SHARDS": 1, "LOCK_TIMEOUT": 0.05, "RETRIES": 1, "RETRY_BACKOFF": 0.01}
    first = ShardedSQLiteCache(str(cache_dir), {"OPTIONS": options})
    first.set("k", "v")
    first.close_connections()
    for suffix in ("", "-wal", "-shm"):
        path = cache_dir / f"shard-000.sqlite3{suffix}"
        if path.exists():
            path.unlink()
    holder = os.open(cache_dir, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    spawn = multiprocessing.get_context("spawn")
    out = spawn.Queue()
    child = spawn.Process(target=_get_once, args=(str(cache_dir), options, out), daemon=True)
    try:
        child.start()
        child.join(30)
        assert not child.is_alive(), "the get waited past every bound"
        got, give_ups = out.get(timeout=5)
        assert got == "miss" and give_ups >= 1
    finally:
        os.close(holder)
        if child.is_alive():
            child.kill()
    cache = ShardedSQLiteCache(str(cache_dir), {"OPTIONS": options})
    cache.set("k", "again")
    assert cache.get("k") == "again"


@pytest.mark.parametrize("odd", ["directory", "fifo"])
def test_a_shard_path_that_is_not_a_file_is_set_aside_and_made_again(
        cache_dir: Path, odd: str) -> None:
    """A shard's path replaced by a directory or a FIFO would fail every call on
    that shard for good ("unable to open", "disk I/O error"). It holds no value of
    the cache: it is moved aside like a corrupt file, and the shard created again;
    the other shards keep their values."""
    cache = ShardedSQLiteCache(str(cache_dir), {"OPTIONS": {"SHARDS": 2}})
    victim, other = keys_in_shard(cache, 0, 1, "v")[0], keys_in_shard(cache, 1, 1, "o")[0]
    cache.set(victim, "lost")
    cache.set(other, "kept")
    cache.close_connections()
    path = cache_dir / "shard-000.sqlite3"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    if odd == "directory":
        path.mkdir()
    else:
        os.mkfifo(path)
    assert cache.get(victim, "miss") == "miss"
    cache.set(victim, "again")
    assert cache.get(victim) == "again"
    assert cache.get(other) == "kept"
    assert [p.name for p in cache_dir.iterdir() if ".corrupt-" in p.name]
