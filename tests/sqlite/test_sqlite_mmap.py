"""A shard or its ``-shm`` cut short from outside kills no process.

Pinned (``store/connections.py``, ``store/shard.py``): SQLite maps every
shard's ``-shm`` (its WAL index) whatever ``MMAP_SIZE`` says, and the shard
itself when ``MMAP_SIZE`` is set (0, the default, never maps it). A page of a
mapping past the end of a file that was truncated under it raises SIGBUS when
touched, so each thread's file check gives a shard or ``-shm`` that shrank its
bytes back (zeros) and reopens it before anything reads again; the reads that
follow are misses or the values as they were, never a crash. A new file that
another process put at the path is not grown.

The truncation cases run in a child process: SIGBUS would take pytest with it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache

from .helpers import new_cache


def mapped(cache: ShardedSQLiteCache, index: int) -> int:
    """The ``mmap_size`` in force on this thread's connection to shard ``index``."""
    return cache._store.pool.get(index).execute("PRAGMA mmap_size").fetchone()[0]


@pytest.mark.parametrize("setting, expected", [(None, 0), (0, 0), (2**20, 2**20)])
def test_mmap_size_is_what_the_connections_use(
    make_cache: Any, setting: int | None, expected: int
) -> None:
    options: dict[str, Any] = {"SHARDS": 1}
    if setting is not None:  # None: the default
        options["MMAP_SIZE"] = setting
    cache = make_cache(options)
    cache.set_many({f"k{i}": os.urandom(2000) for i in range(100)})
    cache._store.pool.check_files()
    assert mapped(cache, 0) == expected


CHILD = textwrap.dedent("""
    import os, sys
    from django.conf import settings
    settings.configure(SECRET_KEY="mmap-test-not-secret-0123456789abcdef")
    from djcachebench.backends.sqlite import ShardedSQLiteCache
    from djcachebench.store import connections

    where, part, checks = sys.argv[1], sys.argv[2], sys.argv[3] == "checks"
    cache = ShardedSQLiteCache(where, {"OPTIONS": {
        "SHARDS": 1, "MAX_ENTRIES": None, "MMAP_SIZE": 64 * 2**20}})
    data = {f"k{i}": os.urandom(3000) for i in range(2000)}  # ~6 MB of pages
    cache.set_many(data)
    assert all(cache.get(k) == v for k, v in data.items())  # every page mapped and read
    cache._store.pool.check_files()  # the periodic check, as it ran before the cut
    path = cache._store.shards[0].path + ("-shm" if part == "shm" else "")
    os.truncate(path, os.path.getsize(path) // 2 if part == "file" else 0)
    if checks:
        cache._store.pool.check_files()  # what the next operation does once the interval is over
    got = sum(cache.get(k) == v for k, v in data.items())
    print("read back", got, "reopened", cache.stats()["reopened"], flush=True)
""")


@pytest.mark.parametrize("part", ["file", "shm"])
def test_a_shard_cut_under_a_running_process_is_reopened_not_a_crash(
    tmp_path: Path, part: str
) -> None:
    """Without the size check the child dies of SIGBUS on its next read (shown
    here by the same child skipping the check)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    runs = {}
    for checks in ("checks", "no-checks"):
        where = tmp_path / checks
        runs[checks] = subprocess.run(
            [sys.executable, "-c", CHILD, str(where), part, checks],
            capture_output=True, text=True, timeout=120, env=env)
    ok = runs["checks"]
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "reopened 1" in ok.stdout, ok.stdout
    if part == "file":  # a cut file is corrupt: set aside, its keys misses
        assert list((tmp_path / "checks").glob("shard-000.sqlite3.corrupt-*"))
    else:  # SQLite rebuilds a -shm from the log: every value is still there
        assert "read back 2000 " in ok.stdout, ok.stdout
    assert runs["no-checks"].returncode == -7  # SIGBUS: what the check prevents


def test_a_smaller_new_shard_at_the_path_is_not_grown(make_cache: Any) -> None:
    """Another process set the shard aside and made a fresh one (quarantine): the
    new file is smaller than the old, but nobody cut it, and nobody maps it past
    its end. Checking the sizes before the file's identity grew it with zeros."""
    cache = make_cache({"SHARDS": 1, "MAX_ENTRIES": None})
    cache.set_many({f"k{i}": os.urandom(2000) for i in range(300)})
    pool = cache._store.pool
    pool.get(0).execute("PRAGMA wal_checkpoint(TRUNCATE)")
    pool.check_files()  # this thread has now seen the large file
    path = cache._store.shards[0].path
    os.rename(path, path + ".aside")
    for leftover in (path + "-wal", path + "-shm"):
        if os.path.exists(leftover):
            os.rename(leftover, path + ".aside" + leftover[len(path):])
    fresh = new_cache(cache.location, {"SHARDS": 1, "MAX_ENTRIES": None})
    fresh.set("new", b"value")
    before = os.path.getsize(path)
    assert pool.check_files() == [0]  # reopened: another file
    assert os.path.getsize(path) == before
    assert cache.get("new") == b"value"


def page_cache_kib(cache: ShardedSQLiteCache, index: int) -> int:
    """SQLite's ``cache_size`` on this thread's connection to shard ``index``
    (negative: KiB)."""
    return cache._store.pool.get(index).execute("PRAGMA cache_size").fetchone()[0]


@pytest.mark.parametrize("setting, expected", [
    (None, -32 * 1024),  # the default: 32 MiB
    (0, -2000),  # SQLite's own default (-2000 KiB) is left in place
    (2**20, -1024),
    (100, -1),  # less than a KiB: the smallest cache SQLite takes by size
])
def test_page_cache_is_what_the_connections_use(
    make_cache: Any, setting: int | None, expected: int
) -> None:
    options: dict[str, Any] = {"SHARDS": 2}
    if setting is not None:
        options["PAGE_CACHE"] = setting
    cache = make_cache(options)
    cache.set_many({f"k{i}": os.urandom(2000) for i in range(100)})
    assert cache.get_many([f"k{i}" for i in range(100)]).keys() == {f"k{i}" for i in range(100)}
    assert [page_cache_kib(cache, i) for i in range(2)] == [expected, expected]


def test_the_largest_page_cache_allowed_is_the_one_sqlite_uses(make_cache: Any) -> None:
    """2**40 bytes is 2**30 KiB: still a cache for SQLite (it read 10**30 and 2**63 bytes as 0)."""
    cache = make_cache({"SHARDS": 1, "PAGE_CACHE": 2**40})
    cache.set("k", b"v")
    assert cache.get("k") == b"v"
    assert page_cache_kib(cache, 0) == -(2**30)


COUNTS_CHILD = textwrap.dedent("""
    import os, sys, time
    from django.conf import settings
    settings.configure(SECRET_KEY="mmap-test-not-secret-0123456789abcdef")
    from djcachebench.backends.sqlite import ShardedSQLiteCache

    where = sys.argv[1]
    cache = ShardedSQLiteCache(where, {"OPTIONS": {"SHARDS": 2, "MAX_ENTRIES": 50}})
    for i in range(20):
        cache.set(f"k{i}", i)
    os.truncate(os.path.join(where, "counts.mmap"), 0)
    time.sleep(0.05)  # past the check interval
    for i in range(20, 200):
        cache.set(f"k{i}", i)
    print("alive", cache.get("k199"), os.path.getsize(os.path.join(where, "counts.mmap")))
""")


def test_shard_counts_cut_short_kill_no_process(tmp_path: Path) -> None:
    """Defect: ``counts.mmap`` (the shared per-shard counts) was a sparse file
    mapped without any size check, so a truncation (or a full disk) killed every
    process of the cache with SIGBUS at its next write. Its size is checked
    before it is touched now, and a cut file is given its length back."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run([sys.executable, "-c", COUNTS_CHILD, str(tmp_path / "c")],
                         capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    alive, value, size = run.stdout.split()
    assert (alive, value) == ("alive", "199") and int(size) > 0


def test_shard_counts_that_cannot_be_opened_are_kept_privately(
    make_cache: Any, cache_dir: Path
) -> None:
    """A directory where ``counts.mmap`` should be (or no room for it) used to make
    every process fail to open the cache; it counts privately instead, and
    culling still keeps the cache near its limit."""
    cache_dir.mkdir(mode=0o700)
    (cache_dir / "counts.mmap").mkdir()
    cache = make_cache({"SHARDS": 2, "MAX_ENTRIES": 50})
    for i in range(200):
        cache.set(f"k{i}", i)
    assert cache.get("k199") == 199
    assert sum(cache._store.counts.load(i)[0] for i in range(2)) <= 50 + 50 // 3 + 1
