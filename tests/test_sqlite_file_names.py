"""A row names its value file and its size; whoever can write a shard can name anything.

The integrity tag vouches for a value only after it was read, and the file's
name and size come from the row before that. Each test plants one such row
(or file) and failed on the code before the fix: a name that is a path had its
file deleted once the row was replaced, a size of 32 TiB raised MemoryError out
of ``get``, and a FIFO under a value's name blocked ``get`` forever.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.store.codec import LARGE_MIN

from .sqlite_helpers import cache, cache_dir, make_cache, raw_shard, shard_path

__all__ = ["cache", "cache_dir", "make_cache"]  # fixtures used by the tests below

BIG = b"x" * (LARGE_MIN + 10)


def _set_column(cache: ShardedSQLiteCache, key: str, column: str, value: object) -> None:
    with raw_shard(shard_path(cache, key)) as conn:
        conn.execute(f"UPDATE cache SET {column} = ? WHERE key = ?",
                     (value, cache.make_key(key)))


def _churn(cache: ShardedSQLiteCache) -> None:
    """Writes that replace and delete file values, so that every shard collects
    the names its rows released."""
    for i in range(64):
        cache.set(f"churn{i}", BIG)
        cache.delete(f"churn{i}")


@pytest.mark.parametrize("planted", ["absolute", "relative"])
def test_a_name_that_is_a_path_is_never_read_or_removed(
        cache: ShardedSQLiteCache, tmp_path: Path, planted: str) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    cache.set("k", BIG)
    # A relative name's first two characters are its directory: "../../victim"
    # was <values>/<shard>/../../../victim, that is <values>/../../victim.
    name = str(victim) if planted == "absolute" else os.path.relpath(
        victim, Path(cache.location) / "values")
    _set_column(cache, "k", "file", name)
    assert cache.get("k", "default") == "default"
    cache.set("k", b"replaced")  # the old name is released...
    cache.delete("k")
    _churn(cache)  # ...and collected
    cache.clear()
    assert victim.read_text() == "precious"
    cache.set("k", BIG)
    assert cache.get("k") == BIG


def test_a_size_larger_than_the_file_is_a_miss(cache: ShardedSQLiteCache) -> None:
    cache.set("k", BIG)
    _set_column(cache, "k", "size", 2**45)
    assert cache.get("k", "default") == "default"
    assert cache.get_many(["k"]) == {}
    cache.set("k", BIG)
    assert cache.get("k") == BIG


def test_a_fifo_under_a_values_name_is_a_prompt_miss(cache: ShardedSQLiteCache) -> None:
    cache.set("k", BIG)
    with raw_shard(shard_path(cache, "k")) as conn:
        (name,) = conn.execute("SELECT file FROM cache WHERE key = ?",
                               (cache.make_key("k"),)).fetchone()
    path = cache._store.shards[cache._store.route(cache.make_key("k"))].files.path(name)
    os.unlink(path)
    os.mkfifo(path)
    start = time.monotonic()
    assert cache.get("k", "default") == "default"  # before the fix: blocked in open()
    assert time.monotonic() - start < 5
