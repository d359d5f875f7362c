"""Connections: one per (process, thread, shard), kept warm, never shared across fork.

Pinned (docs/architecture.md "Connections", store/connections.py):

- Django calls ``close()`` on every cache after each request
  (``request_finished``); that must keep the shard connections open, since
  reopening costs a file open and a schema check per shard. The very same
  ``sqlite3.Connection`` objects serve the next request.
- ``close_connections()`` really closes them (and other threads' on their
  next use).
- Each thread has its own connections.
- After ``os.fork()`` the child never uses (nor closes) the parent's
  connections: it opens its own, reads what the parent wrote, writes what the
  parent then reads, while the parent keeps working with its own.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import pytest
from django.core.cache import caches
from django.core.signals import request_finished

from djcachebench.backends.sqlite import ShardedSQLiteCache

from .helpers import caches_entry, integrity_check, shard_files


def connections(cache: ShardedSQLiteCache) -> list[sqlite3.Connection]:
    """This thread's connection to every shard (opening the missing ones)."""
    return [cache._store.pool.get(i) for i in range(cache._store.n)]


def is_closed(conn: sqlite3.Connection) -> bool:
    try:
        conn.execute("SELECT 1")
    except sqlite3.ProgrammingError:
        return True
    return False


# -- close() keeps them warm ----------------------------------------------------------


def test_close_keeps_the_same_connections_warm(cache: ShardedSQLiteCache) -> None:
    cache.set("k", "v")
    assert cache.get("k") == "v"
    before = connections(cache)
    warm = cache._store.pool.warm()
    assert warm == cache._store.n
    cache.close()
    assert cache._store.pool.warm() == warm
    after = connections(cache)
    assert all(a is b for a, b in zip(before, after, strict=True))
    assert not any(is_closed(c) for c in after)
    assert cache.get("k") == "v"


def test_request_finished_signal_keeps_connections_warm(
    settings: Any, cache_dir: Any
) -> None:
    """Through Django's own wiring: ``caches[alias]`` + the ``request_finished`` signal."""
    settings.CACHES = {"default": caches_entry(cache_dir)}
    backend = caches["default"]
    assert isinstance(backend, ShardedSQLiteCache)
    try:
        backend.set("k", "v")
        assert backend.get("k") == "v"
        before = connections(backend)
        request_finished.send(sender=None)
        assert caches["default"] is backend
        assert backend._store.pool.warm() == backend._store.n
        assert all(a is b for a, b in zip(before, connections(backend), strict=True))
        assert backend.get("k") == "v"
    finally:
        backend.close_connections()


def test_close_connections_really_closes_them(cache: ShardedSQLiteCache) -> None:
    cache.set("k", "v")
    before = connections(cache)
    cache.close_connections()
    assert cache._store.pool.warm() == 0
    assert all(is_closed(c) for c in before)
    # The cache reopens lazily: only the shard that is used.
    assert cache.get("k") == "v"
    assert cache._store.pool.warm() == 1
    assert all(a is not b for a, b in zip(before, connections(cache), strict=True))


def test_close_connections_closes_another_threads_on_its_next_use(
    cache: ShardedSQLiteCache,
) -> None:
    cache.set("k", "v")
    opened: list[sqlite3.Connection] = []
    go_on = threading.Event()
    seen: dict[str, Any] = {}

    def worker() -> None:
        opened.append(cache._store.pool.get(0))
        go_on.wait(30)
        seen["value"] = cache.get("k")
        seen["reopened"] = cache._store.pool.get(0) is not opened[0]
        seen["old_closed"] = is_closed(opened[0])

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not opened and time.monotonic() < deadline:
            time.sleep(0.01)
        cache.close_connections()
    finally:
        go_on.set()
        thread.join(30)
    assert not thread.is_alive()
    assert seen == {"value": "v", "reopened": True, "old_closed": True}


def test_each_thread_has_its_own_connections(cache: ShardedSQLiteCache) -> None:
    mine = connections(cache)
    theirs: list[sqlite3.Connection] = []
    thread = threading.Thread(target=lambda: theirs.extend(connections(cache)))
    thread.start()
    thread.join(30)
    assert len(theirs) == len(mine)
    assert not {id(c) for c in mine} & {id(c) for c in theirs}


def test_threads_sharing_one_cache_lose_no_incr(cache: ShardedSQLiteCache) -> None:
    """Each thread uses its own connections; incr stays atomic between them."""
    cache.set("counter", 0)
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(200):
                cache.incr("counter")
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert cache.get("counter") == 1600


# -- fork ----------------------------------------------------------------------------------


def _in_forked_child(cache: ShardedSQLiteCache, inherited: list[sqlite3.Connection],
                     report: int) -> None:
    """Runs in the child: exit 0 only if every check holds; never returns."""
    code = 1
    try:
        pool = cache._store.pool
        assert pool.warm() == 0, "the child sees the parent's connections as its own"
        assert cache.get("from-parent") == "p"
        cache.set("from-child", "c")
        mine = connections(cache)
        assert all(m is not i for m, i in zip(mine, inherited, strict=True))
        for n in range(200):  # while the parent writes too
            cache.set(f"child-{n}", n)
            cache.incr("shared")
        assert cache.get_many([f"child-{n}" for n in range(200)]) == {
            f"child-{n}": n for n in range(200)}
        code = 0
    except BaseException:
        os.write(report, traceback.format_exc().encode()[-3000:])
    finally:
        os._exit(code)


def _wait_child(pid: int, deadline: float) -> int | None:
    """The child's exit status, or None (after killing it) if it outlived ``deadline``."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return None


@pytest.mark.slow
def test_forked_child_opens_its_own_connections(
    make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    cache = make_cache({"LOCK_TIMEOUT": 10.0, "MAX_ENTRIES": None})
    cache.set("from-parent", "p")
    cache.set("shared", 0)
    inherited = connections(cache)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child ends in os._exit
        os.close(read_end)
        _in_forked_child(cache, inherited, write_end)
    os.close(write_end)
    for n in range(200):  # concurrent use from the parent
        cache.set(f"parent-{n}", n)
        cache.incr("shared")
    status = _wait_child(pid, 120)
    with os.fdopen(read_end, "rb") as f:  # the child's traceback, if it failed
        child_error = f.read().decode(errors="replace")
    assert status == 0, child_error or f"child exit status {status}"
    # The parent's connections are untouched and still its own.
    assert all(a is b for a, b in zip(inherited, connections(cache), strict=True))
    assert not any(is_closed(c) for c in inherited)
    assert cache.get("from-child") == "c"
    assert cache.get("shared") == 400
    assert cache.get_many([f"child-{n}" for n in range(200)]) == {
        f"child-{n}": n for n in range(200)}
    assert cache.get_many([f"parent-{n}" for n in range(200)]) == {
        f"parent-{n}": n for n in range(200)}
    cache.close_connections()
    for path in shard_files(cache._store.directory):
        assert integrity_check(path) == "ok"


def test_reads_and_writes_leave_no_read_snapshot_open(cache: ShardedSQLiteCache) -> None:
    """Cursors are kept per connection (connections.py): a statement left open would pin
    a read snapshot, and a checkpoint could then not reset the WAL."""
    from .helpers import shard_path

    cache.set("k", "v")
    assert cache.get("k") == "v"
    assert cache.get("absent") is None
    cache.set("k", "w")  # replaces: the lean upsert
    conn = sqlite3.connect(shard_path(cache, "k"), timeout=5, isolation_level=None)
    try:
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    finally:
        conn.close()
    assert busy == 0, "a reader held a snapshot after its call returned"
    assert cache.get("k") == "w"


def test_instances_built_per_thread_do_not_keep_a_descriptor_each(tmp_path: Any) -> None:
    """The process shares one descriptor of ``counts.mmap``: with one per instance
    (Django builds one per thread), kept until a full collection, a low file
    limit makes every shard open fail for the life of the process."""
    import gc

    location = str(tmp_path / "cache")

    def descriptors() -> int:
        count = 0
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                count += os.readlink(f"/proc/self/fd/{fd}").startswith(location)
        return count

    ShardedSQLiteCache(location, {"OPTIONS": {}}).set("k", 1)

    def one_thread() -> None:  # as Django: an instance per thread, used, the thread ends
        c = ShardedSQLiteCache(location, {"OPTIONS": {}})
        c.set("k", 1)
        assert c.get("k") == 1
        c.close()

    def some_threads(n: int) -> None:
        for _ in range(n):
            thread = threading.Thread(target=one_thread)
            thread.start()
            thread.join()

    gc.disable()  # as between two full collections of a busy process
    try:
        some_threads(2)  # SQLite keeps a closed connection's descriptors for reuse
        before = descriptors()
        some_threads(20)
        assert descriptors() == before
    finally:
        gc.enable()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
def test_a_dropped_instance_closes_its_threads_connections_at_once(cache_dir: Any) -> None:
    """The store of an instance is a cycle, so until a full collection a dropped
    instance would keep its shard connections open in the thread that used it:
    instances made and dropped in a thread that lives on (asgiref's executor
    thread) would pile up descriptors. With collection off, the test sees one set
    of connections per instance unless dropping closes them."""
    import gc

    def shard_descriptors() -> int:
        found = 0
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                found += os.readlink(f"/proc/self/fd/{fd}").startswith(str(cache_dir))
        return found

    ShardedSQLiteCache(str(cache_dir), {}).set_many({f"k{i}": i for i in range(64)})
    gc.collect()
    gc.disable()
    try:
        before = shard_descriptors()
        for _ in range(20):
            instance = ShardedSQLiteCache(str(cache_dir), {})
            assert instance.get_many([f"k{i}" for i in range(64)])  # opens every shard
            del instance
        assert shard_descriptors() <= before + 2 * 8  # at most one instance's worth
    finally:
        gc.enable()
