"""Fork while other threads of the process use ShardedSQLiteCache (store/forkgate.py).

A child forked while another thread is inside SQLite inherits SQLite's
process-wide mutexes locked, and blocks for good on its first SQLite call; the
gate keeps forks out while a call is inside SQLite. Without the gate, this test
sees hung children in nearly every run.
"""

from __future__ import annotations

import os
import select
import threading
import time
from pathlib import Path

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.store import forkgate

from .helpers import PATIENT

FORKS = 20
CHILD_BOUND = 60.0  # seconds a child may take before it counts as hung


def _child(cache: ShardedSQLiteCache, out: int) -> None:
    try:
        good = 0
        for i in range(16):
            cache.set(f"child{i}", "v")
            good += cache.get(f"child{i}") == "v"
        os.write(out, b"%d" % good)
    finally:
        os._exit(0)


def _fork_and_wait(cache: ShardedSQLiteCache, bound: float) -> str:
    """Fork a child that uses ``cache`` (``_child``); what it wrote back, or
    "hung" if it said nothing within ``bound`` seconds (then it is killed)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        _child(cache, write)
    os.close(write)
    # poll, not select: the suite's process may hold over 1,024 descriptors.
    poller = select.poll()
    poller.register(read, select.POLLIN)
    ready = poller.poll(bound * 1000)
    got = os.read(read, 16) if ready else b"hung"
    os.close(read)
    if not ready:
        os.kill(pid, 9)
    os.waitpid(pid, 0)
    return got.decode()


def test_a_child_forked_while_threads_use_the_cache_does_not_block(tmp_path: Path) -> None:
    location = str(tmp_path / "cache")
    # Patient lock waits: the parent's threads go on writing the same shards
    # while a child writes, and on a loaded machine a give-up would be taken
    # for the defect this test is about.
    cache = ShardedSQLiteCache(location, {"OPTIONS": {"SHARDS": 4, **PATIENT}})
    stop = threading.Event()

    def busy(n: int) -> None:
        j = 0
        while not stop.is_set():
            cache.set(f"busy{n}-{j % 20}", j)
            cache.get(f"busy{n}-{(j * 7) % 20}")
            j += 1

    threads = [threading.Thread(target=busy, args=(n,), daemon=True) for n in range(3)]
    for t in threads:
        t.start()
    outcomes = []
    try:
        for _ in range(FORKS):
            time.sleep(0.05)
            outcomes.append(_fork_and_wait(cache, CHILD_BOUND))
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert outcomes == ["16"] * FORKS, outcomes


def test_a_child_forked_while_threads_end_does_not_block(tmp_path: Path) -> None:
    """Threads that end close their connections as their thread-local state is
    freed: the sqlite3 module does that inside SQLite, outside the fork gate, so
    a child forked meanwhile would block for good. Their connections are closed
    through the gate."""
    location = str(tmp_path / "cache")
    cache = ShardedSQLiteCache(location, {"OPTIONS": {"SHARDS": 16, **PATIENT}})
    # Enough pages cached per connection that freeing them (inside SQLite, in
    # the ending thread) takes a while.
    keys = [f"b{i}" for i in range(3000)]
    cache.set_many(dict.fromkeys(keys, "y" * 3000))
    stop = threading.Event()

    def short_lived() -> None:
        cache.get_many(keys)  # opens all 16 shards; the thread ends and frees them

    def spawner() -> None:
        while not stop.is_set():
            thread = threading.Thread(target=short_lived)
            thread.start()
            thread.join()

    spawners = [threading.Thread(target=spawner, daemon=True) for _ in range(2)]
    for t in spawners:
        t.start()
    outcomes = []
    try:
        for _ in range(4 * FORKS):
            time.sleep(0.01)
            outcomes.append(_fork_and_wait(cache, CHILD_BOUND / 3))
    finally:
        stop.set()
        for t in spawners:
            t.join(30)
    assert outcomes == ["16"] * len(outcomes), outcomes


def test_connections_of_threads_that_ended_are_closed(tmp_path: Path) -> None:
    """What the gate closes is really closed: a thread's connections do not
    outlive it (no descriptors of shard files, wal and shm left per ended thread)."""
    location = str(tmp_path / "cache")
    cache = ShardedSQLiteCache(location, {"OPTIONS": {"SHARDS": 4}})
    cache.set("k", 1)

    def shard_descriptors() -> int:
        fds = os.listdir("/proc/self/fd")
        return sum(os.path.realpath(f"/proc/self/fd/{fd}").startswith(location) for fd in fds)

    def one_thread() -> None:
        thread = threading.Thread(target=cache.get_many, args=([f"k{i}" for i in range(64)],))
        thread.start()
        thread.join()

    # SQLite keeps a closed connection's database descriptor for reuse while the
    # process holds locks on that file: one thread's worth, reused after.
    one_thread()
    before = shard_descriptors()
    for _ in range(5):
        one_thread()
    assert shard_descriptors() == before


def test_a_call_arriving_while_a_fork_waits_keeps_its_own_bound(tmp_path: Path) -> None:
    """A fork waits (up to FORK_WAIT) for the calls inside SQLite; a call that
    arrives meanwhile must not wait at the gate for the fork past its own
    LOCK_TIMEOUT (else a get of a free shard is held for as long as another
    thread's clear() of a large shard runs). It is told the store is busy and
    gives up within its bound, while the fork still waits."""
    cache = ShardedSQLiteCache(str(tmp_path / "cache"), {"OPTIONS": {
        "SHARDS": 2, "LOCK_TIMEOUT": 0.05, "RETRIES": 0}})
    cache.set("k", "v")
    events: list[str] = []
    inside = threading.Event()
    release = threading.Event()

    def long_call() -> None:
        # A call inside SQLite for as long as the test needs (a clear() of a
        # large shard, say): counted in by the gate, out when it ends.
        forkgate.enter()
        inside.set()
        release.wait(30)
        forkgate.leave()

    def forker() -> None:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        events.append("fork returned")
        os.waitpid(pid, 0)

    holder = threading.Thread(target=long_call)
    holder.start()
    assert inside.wait(10)
    fork_thread = threading.Thread(target=forker)
    fork_thread.start()
    try:
        deadline = time.monotonic() + 10
        while not forkgate._forking and time.monotonic() < deadline:
            time.sleep(0.001)
        assert forkgate._forking
        got = cache.get("k", "gave up")
        events.append(f"get returned {got}")
    finally:
        release.set()
        holder.join(30)
        fork_thread.join(30)
    assert events == ["get returned gave up", "fork returned"]
    assert cache.get("k") == "v"


_FORK_DURING_COLLECTION = """
import gc, os, sys, time
import django
from django.conf import settings
settings.configure(SECRET_KEY="x" * 50)
django.setup()

def another_librarys_hook():  # registered first, so it runs after the gate closed
    gc.collect()

os.register_at_fork(before=another_librarys_hook)
from djcachebench.backends.sqlite import ShardedSQLiteCache

location = sys.argv[1]
cache = ShardedSQLiteCache(location + "/a", {"OPTIONS": {}})
cache.set("k", "v")
gc.disable()
dropped = ShardedSQLiteCache(location + "/b", {"OPTIONS": {}})
dropped.set("x", 1)
del dropped  # a cycle holding this thread's connections: freed by the collection
pid = os.fork()
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
print(cache.get("k"), ShardedSQLiteCache(location + "/b", {"OPTIONS": {}}).get("x"))
"""


def test_a_collection_during_a_fork_does_not_wait_for_the_fork(tmp_path: Path) -> None:
    """Cache instances are reference cycles, so the garbage collector frees their
    connections wherever it runs; run in the forking thread after the gate closed
    (another library's fork hook), a finalizer that waited for the fork, which
    waits for that thread, would keep os.fork() from returning. The finalizer
    leaves them for the next call through the gate. In a child process: a fork
    hook cannot be unregistered."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _FORK_DURING_COLLECTION, str(tmp_path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["v", "1"]
