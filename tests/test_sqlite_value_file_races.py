"""Value files under concurrent writes and failing removals: found by an independent
attacker on the large-value path, each test failing on the code before its fix.

* ``has_key`` (and ``touch``, which verifies through it) of a key whose large
  value another process replaced by a small one between the SELECT and the file
  read answered False and counted the key as tampered; ``get`` already read the
  row again.
* A large value replaced by a small one (``set``, ``set_many``, ``incr``) left
  its file until some later large write or the 256th write to the shard.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.store.codec import LARGE_MIN
from djcachebench.store.values import ValueFiles

from .sqlite_helpers import cache, cache_dir, make_cache

__all__ = ["cache", "cache_dir", "make_cache"]  # fixtures used by the tests below

BIG = b"x" * (LARGE_MIN + 10)


def value_files(location: Path) -> set[str]:
    return {p.name for p in (location / "values").rglob("*") if p.is_file()}


def files_of(cache: ShardedSQLiteCache, key: str) -> ValueFiles:
    return cache._store.shards[cache._store.route(cache.make_key(key))].files


@pytest.mark.parametrize("small", [b"small", 7], ids=["bytes", "int"])
@pytest.mark.parametrize("call", ["has_key", "touch"])
def test_a_file_value_replaced_by_a_row_value_during_the_read_is_still_there(
        make_cache: Callable[..., ShardedSQLiteCache], monkeypatch: pytest.MonkeyPatch,
        call: str, small: Any) -> None:
    reader = make_cache()
    writer = make_cache()  # another process on the same directory
    writer.set("k", BIG)
    files = files_of(reader, "k")
    read = ValueFiles.read
    raced: list[bool] = []

    def read_after_a_replacement(self: ValueFiles, *args: Any, **kwargs: Any) -> Any:
        if not raced:
            raced.append(True)
            writer.set("k", small)  # commits, then removes the file the reader selected
            writer.reclaim_files()  # (before its own fix, the set left the file: see below)
        return read(self, *args, **kwargs)

    monkeypatch.setattr(files, "read", read_after_a_replacement.__get__(files))
    if call == "has_key":
        assert reader.has_key("k") is True
    else:
        assert reader.touch("k", 300) is True
    assert raced
    stats = reader.stats()
    assert stats["tampered"] == 0 and stats["errors"] == 0
    assert reader.get("k") == small


def test_a_read_outpaced_by_writers_is_a_plain_miss(
        make_cache: Callable[..., ShardedSQLiteCache], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every try finds the file just replaced: a miss, neither a fault nor a hang."""
    reader = make_cache()
    writer = make_cache()
    writer.set("k", BIG)
    files = files_of(reader, "k")
    read = ValueFiles.read
    tries: list[int] = []

    def read_after_another_write(self: ValueFiles, *args: Any, **kwargs: Any) -> Any:
        tries.append(1)
        writer.set("k", BIG + bytes([len(tries)]))
        return read(self, *args, **kwargs)

    monkeypatch.setattr(files, "read", read_after_another_write.__get__(files))
    assert reader.get("k", "miss") == "miss"
    assert reader.has_key("k") is False
    assert 2 <= len(tries) <= 16
    assert reader.stats()["errors"] == 0 and reader.stats()["tampered"] == 0


@pytest.mark.parametrize("replace", ["set", "set_many", "incr"])
def test_a_file_value_replaced_by_a_row_value_is_removed_at_once(
        cache: ShardedSQLiteCache, cache_dir: Path, replace: str) -> None:
    big_int = 10 ** 80_000  # its pickle is over LARGE_MIN: a value file
    cache.set("k", big_int if replace == "incr" else BIG)
    assert len(value_files(cache_dir)) == 1
    if replace == "set":
        cache.set("k", b"small")
    elif replace == "set_many":
        assert cache.set_many({"k": b"small", "other": b"small too"}) == []
    else:
        cache.set("k", 5)  # a small int in the row, then an incr of it
        cache.set("k", big_int)
        assert cache.decr("k", big_int - 5) == 5
    assert value_files(cache_dir) == set()
    assert cache.get("k") in (b"small", 5)


@pytest.mark.parametrize("replace", ["add over an expired row", "size limit", "blob"])
def test_other_writes_that_release_a_value_file_remove_it_at_once(
        make_cache: Callable[..., ShardedSQLiteCache], cache_dir: Path, replace: str) -> None:
    cache = make_cache({"SIZE_LIMIT": 10**9} if replace == "size limit" else None)
    cache.set("k", BIG, timeout=1 if replace.startswith("add") else None)
    assert len(value_files(cache_dir)) == 1
    if replace.startswith("add"):
        time.sleep(1.1)
        assert cache.add("k", b"small") is True
    elif replace == "size limit":
        cache.set("k", b"small")
    else:
        cache.set("k", b"m" * 4000)  # a mid-size value: the blobs table
    assert value_files(cache_dir) == set()
