"""Shards are read through a mapping once large, and a file cut from outside kills nothing.

Pinned (``store/shard.py``, ``store/connections.py``): with ``MMAP_SIZE`` None
(the default) a connection maps its shard once the file reaches
``MMAP_AUTO_FROM`` bytes, at open or at the thread's next file check; 0 never
maps, a number always maps that much. SQLite maps every shard's ``-shm``
whatever the setting. A page of a mapping past the end of a file that was
truncated under it raises SIGBUS when touched, so the file check closes the
connections of a shard whose file or ``-shm`` shrank before they read again;
the reads that follow are misses or the values as they were, never a crash.

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
from djcachebench.store import shard as shard_module

from .sqlite_helpers import cache_dir, make_cache, new_cache

__all__ = ["cache_dir", "make_cache"]  # fixtures used by the tests below


def mapped(cache: ShardedSQLiteCache, index: int) -> int:
    """The ``mmap_size`` in force on this thread's connection to shard ``index``."""
    return cache._store.pool.get(index).execute("PRAGMA mmap_size").fetchone()[0]


def test_small_shards_are_read_with_pread_and_mapped_once_they_grow(
    make_cache: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shard_module, "MMAP_AUTO_FROM", 256 * 1024)
    cache = make_cache({"SHARDS": 1, "MAX_ENTRIES": None})
    cache.set("k", b"v")
    assert mapped(cache, 0) == 0
    cache.set_many({f"k{i}": os.urandom(2000) for i in range(300)})  # ~600 KiB
    # Into the file itself (a writer's periodic checkpoint would do it too).
    cache._store.pool.get(0).execute("PRAGMA wal_checkpoint(TRUNCATE)")
    cache._store.pool.check_files()  # as every thread does each FILE_CHECK_INTERVAL
    assert mapped(cache, 0) == shard_module.MMAP_AUTO_SIZE
    assert cache.get("k") == b"v"
    # A new connection to a file that is already large maps it from the start.
    other = new_cache(cache.location,
                      {"SHARDS": 1, "MAX_ENTRIES": None})
    assert mapped(other, 0) == shard_module.MMAP_AUTO_SIZE


@pytest.mark.parametrize("setting, expected", [(0, 0), (2**20, 2**20)])
def test_an_explicit_mmap_size_is_kept_whatever_the_size(
    make_cache: Any, monkeypatch: pytest.MonkeyPatch, setting: int, expected: int
) -> None:
    monkeypatch.setattr(shard_module, "MMAP_AUTO_FROM", 1)
    cache = make_cache({"SHARDS": 1, "MMAP_SIZE": setting})
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
