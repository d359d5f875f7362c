"""A shard path holding what this engine did not write is set aside, never a dead shard.

A dangling symbolic link or a link to a device at a shard's path, another
program's SQLite database there (a ``cache`` table of another shape), a table of
the schema altered, and a shard cut short under a running process above the
size its last check saw (its counts then read as NULL) must not leave the shard
failing every call, in every process, for good, nor (the last) make every new
cache object raise TypeError. Each test checks that the file is set aside and
the shard serves again, without errors or misses.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.store.connections import FILE_CHECK_INTERVAL

ONE = {"SHARDS": 1, "MAX_ENTRIES": None}


def _works(cache: ShardedSQLiteCache, n: int = 5) -> None:
    for i in range(n):
        cache.set(f"w{i}", i)
    assert cache.get_many([f"w{i}" for i in range(n)]) == {f"w{i}": i for i in range(n)}
    assert cache.stats()["errors"] == 0


def _aside(path: Path) -> list[Path]:
    return [p for p in path.parent.glob(path.name + ".*")
            if not p.name.endswith(("-wal", "-shm"))]


def _emptied(make_cache: Callable[..., ShardedSQLiteCache], cache_dir: Path) -> Path:
    """A one-shard cache made once, then its shard file removed: its path."""
    cache = make_cache(ONE)
    cache.set("k", 1)
    cache.close_connections()
    shard = cache_dir / "shard-000.sqlite3"
    for suffix in ("", "-wal", "-shm"):
        Path(str(shard) + suffix).unlink(missing_ok=True)
    return shard


@pytest.mark.parametrize("target", ["/nonexistent/dir/shard", "/dev/zero"])
def test_a_link_to_nothing_or_to_a_device_is_set_aside(
    make_cache: Callable[..., ShardedSQLiteCache], cache_dir: Path, target: str
) -> None:
    shard = _emptied(make_cache, cache_dir)
    shard.symlink_to(target)
    cache = make_cache(ONE)
    _works(cache)
    assert not shard.is_symlink() and shard.is_file()
    (aside,) = _aside(shard)
    assert aside.is_symlink() and os.readlink(aside) == target  # kept, as it was


def test_a_link_to_a_shard_file_is_followed(
    make_cache: Callable[..., ShardedSQLiteCache], cache_dir: Path, tmp_path: Path
) -> None:
    cache = make_cache(ONE)
    cache.set("k", "v")
    cache.close_connections()
    shard = cache_dir / "shard-000.sqlite3"
    real = tmp_path / "elsewhere.sqlite3"
    shard.rename(real)
    shard.symlink_to(real)
    again = make_cache(ONE)
    assert again.get("k") == "v"
    _works(again)
    assert shard.is_symlink() and not _aside(shard)


def test_another_programs_database_is_set_aside_untouched(
    make_cache: Callable[..., ShardedSQLiteCache], cache_dir: Path
) -> None:
    shard = _emptied(make_cache, cache_dir)
    foreign = sqlite3.connect(shard)
    foreign.execute("CREATE TABLE cache (key TEXT PRIMARY KEY, value TEXT)")
    foreign.execute("INSERT INTO cache VALUES ('theirs', 'data')")
    foreign.commit()
    foreign.close()
    before = shard.read_bytes()
    cache = make_cache(ONE)
    _works(cache)
    assert cache.stats()["corruptions"] == 1
    (aside,) = _aside(shard)
    assert aside.read_bytes() == before  # not altered (the schema's upgrade rolled back)


@pytest.mark.parametrize("alter", [
    "ALTER TABLE cache RENAME COLUMN expires TO expiry",
    "ALTER TABLE meta RENAME COLUMN entries TO n",
    "DROP TABLE cache",
])
def test_a_schema_altered_under_a_running_cache_is_recovered(
    make_cache: Callable[..., ShardedSQLiteCache], cache_dir: Path, alter: str
) -> None:
    cache = make_cache(ONE)
    cache.set_many({f"k{i}": i for i in range(20)})
    other = sqlite3.connect(cache_dir / "shard-000.sqlite3")
    other.execute(alter)
    other.commit()
    other.close()
    for i in range(20):  # misses or the values, never an exception
        assert cache.get(f"k{i}") in (None, i)
    # A write that meets the damage fails (the shard is set aside as it does),
    # as a write that meets a corrupt shard does; the next one is stored.
    cache.set("probe", 1)
    cache.set("after", 1)
    assert cache.get("after") == 1
    _works(cache)
    fresh = make_cache(ONE)
    assert fresh.get("after") == 1
    assert fresh.entry_count() == cache.entry_count() == len(
        [k for k in ["probe", "after", *(f"w{i}" for i in range(5)),
                     *(f"k{i}" for i in range(20))]
         if fresh.get(k) is not None])


def test_a_shard_cut_above_the_size_last_seen_is_set_aside(
    make_cache: Callable[..., ShardedSQLiteCache], cache_dir: Path
) -> None:
    """The hardest case: the file grows by a checkpoint after the running
    process's last check, then is cut to half: the check does not see a cut,
    and the page holding the counts reads as an empty record."""
    cache = make_cache(ONE)
    cache.set("a", 1)
    cache.set("big", b"x" * 50_000)
    cache.set("obj", [1, 2])
    shard = cache_dir / "shard-000.sqlite3"
    checkpoint = sqlite3.connect(shard)
    checkpoint.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    checkpoint.close()
    os.truncate(shard, shard.stat().st_size // 2)
    time.sleep(FILE_CHECK_INTERVAL + 0.2)
    assert cache.get("a") in (None, 1)
    fresh = make_cache(ONE)  # raised TypeError
    assert fresh.get("a") in (None, 1)
    assert isinstance(cache.entry_count(), int)  # raised TypeError
    for i in range(50):
        cache.set(f"n{i}", i)
    assert cache.get_many([f"n{i}" for i in range(50)]) == {f"n{i}": i for i in range(50)}
    assert fresh.get("n49") == 49
