"""Value files under concurrent writes and failing removals, on the large-value path.

* ``has_key`` (and ``touch``, which verifies through it) of a key whose large
  value another process replaces by a small one between the SELECT and the file
  read reads the row again, as ``get`` does, instead of answering False and
  counting the key as tampered.
* A large value replaced by a small one (``set``, ``set_many``, ``incr``) has
  its file removed then, not at some later large write or the 256th write to
  the shard.
* A file whose removal failed, one created by a writer taken for dead (its
  pending name reclaimed) and then killed, and one no name covers at all are not
  left for good: tombstones retry the first two, and ``reclaim_files`` sweeps
  the directory for the third.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.serializers import TAG_SIZE
from djcachebench.store.codec import LARGE_MIN
from djcachebench.store.values import ValueFiles

from .helpers import raw_shard, shard_path, start
from .workers import late_writer_dies

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


def named_or_listed(cache: ShardedSQLiteCache, key: str) -> set[str]:
    conn = cache._store.pool.get(cache._store.route(cache.make_key(key)))
    return ({r[0] for r in conn.execute("SELECT file FROM cache WHERE file IS NOT NULL")}
            | {r[0] for r in conn.execute("SELECT name FROM garbage")})


def test_a_late_writer_killed_after_creating_its_file_leaves_nothing_for_good(
        make_cache: Callable[..., ShardedSQLiteCache], cache_dir: Path) -> None:
    """Its pending name was reclaimed (it was taken for dead), then it created the
    file and died: the name stays as a tombstone and the next collection removes
    the file. Before the fix, nothing listed the file and nothing ever removed it."""
    options = {"SHARDS": 1, "MAX_ENTRIES": None}
    cache = make_cache(options)
    cache.set("k", b"o" * len(BIG), None)
    child = start(late_writer_dies, str(cache_dir), options, "k", len(BIG))
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    assert value_files(cache_dir) - named_or_listed(cache, "k") == set()
    cache.reclaim_files()  # what a later write's collection does
    assert len(value_files(cache_dir)) == 1 and cache.get("k") == b"o" * len(BIG)


def test_a_file_that_cannot_be_removed_is_tried_again(
        cache: ShardedSQLiteCache, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the fix its name was dropped whatever the unlink said, and the file
    stayed for good (a read-only or immutable directory at that moment)."""
    cache.set("k", BIG)
    unlink = os.unlink

    def refuse(path: Any, *args: Any, **kwargs: Any) -> None:
        raise PermissionError(1, "Operation not permitted", path)

    monkeypatch.setattr(os, "unlink", refuse)
    cache.delete("k")
    assert len(value_files(cache_dir)) == 1
    monkeypatch.setattr(os, "unlink", unlink)
    cache.reclaim_files()
    assert value_files(cache_dir) == set()


def test_reclaim_files_removes_every_file_no_row_names(
        cache: ShardedSQLiteCache, cache_dir: Path) -> None:
    """Files no name covers (written into a shard whose database was deleted, by a
    process that had not noticed yet): ``reclaim_files`` sweeps the directory.
    A file a row names, one too young to tell from a write under way, and
    anything not named as a value file are left alone."""
    cache.set("k", BIG)
    (kept,) = value_files(cache_dir)
    folder = next((cache_dir / "values").iterdir())
    old, young = "ab" + "0" * 30, "ab" + "1" * 30
    (folder / "ab").mkdir(exist_ok=True)
    for name in (old, young, "notes.txt"):
        (folder / "ab" / name).write_bytes(b"left behind")
    past = time.time() - 3600
    os.utime(folder / "ab" / old, (past, past))
    cache.reclaim_files()
    assert value_files(cache_dir) == {kept, young, "notes.txt"}
    cache.reclaim_files(pending_age=0)
    assert value_files(cache_dir) == {kept, "notes.txt"}
    assert cache.get("k") == BIG


def test_a_row_claiming_a_size_no_process_can_hold_is_a_miss(
        cache: ShardedSQLiteCache, cache_dir: Path) -> None:
    """Whoever can write a shard sets a row's size to 1 TiB and stretches its file
    to match (sparse: no disk used). ``get`` raised MemoryError; now a miss."""
    cache.set("k", BIG)
    huge = 2 ** 40
    with raw_shard(shard_path(cache, "k")) as conn:
        (name,) = conn.execute("SELECT file FROM cache WHERE key = ?",
                               (cache.make_key("k"),)).fetchone()
        conn.execute("UPDATE cache SET size = ? WHERE key = ?",
                     (huge + TAG_SIZE, cache.make_key("k")))
    os.truncate(files_of(cache, "k").path(name), huge)
    assert cache.get("k", "miss") == "miss"
    assert cache.has_key("k") is False
