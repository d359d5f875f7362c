"""A lost or damaged manifest never lets a process with another ``SHARDS`` join.

Pinned (store/layout.py, docs/settings.md "What a failure looks like"): the
manifest is written once and never touched while the shards change, so a temp
cleaner deletes it first. A process with another shard count then wrote its
own from its settings and joined the running cache: each side read its own
older values after the other's acknowledged writes. Now the shard files are
the truth: a manifest is written only where the shard files agree with the
count, one that disagrees with them is refused, and a running process that
finds the directory holding another layout (the whole directory removed and
made again by a process with another count) stops serving it: reads miss,
writes fail, logged, and nothing it acknowledges is lost to the other side.

Every case with real processes: a running process ``A`` and a starting one
``B``, each a child serving on command.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import zlib
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.store import connections, counts

from .helpers import SPAWN, join_all, new_cache
from .workers import serving_worker

SETTLE = getattr(connections, "FILE_CHECK_INTERVAL", 1.0) + 0.3
OPTIONS = {"MAX_ENTRIES": None, "LOCK_TIMEOUT": 5.0}


def split_keys(count: int) -> list[str]:
    """Keys whose shard under 8 shards is not their shard under 4 (Django's
    final key ``:1:<key>`` is what is routed)."""
    out = []
    n = 0
    while len(out) < count:
        key = f"k{n}"
        crc = zlib.crc32(f":1:{key}".encode())
        if crc % 8 != crc % 4:
            out.append(key)
        n += 1
    return out


KEYS = split_keys(40)


class Served:
    """A child process serving the cache at ``location`` on command."""

    def __init__(self, location: Path, shards: int) -> None:
        self.conn: Connection
        self.conn, theirs = SPAWN.Pipe()
        self.proc = SPAWN.Process(target=serving_worker, daemon=True,
                                  args=(str(location), {**OPTIONS, "SHARDS": shards}, theirs))
        self.proc.start()
        if not self.conn.poll(120):
            raise RuntimeError("the serving child did not start")
        self.state, self.message = self.conn.recv()

    def __call__(self, op: str, args: Any = None) -> Any:
        self.conn.send((op, args))
        if not self.conn.poll(120):
            raise RuntimeError(f"the serving child did not answer {op}")
        status, result = self.conn.recv()
        assert status == "ok"
        return result

    def stop(self) -> None:
        if self.proc.is_alive() and self.state == "ready":
            self.conn.send(("exit", None))
        assert join_all([self.proc], 60) == [0]


@pytest.fixture
def serve() -> Iterator[Callable[[Path, int], Served]]:
    started: list[Served] = []

    def start(location: Path, shards: int) -> Served:
        started.append(Served(location, shards))
        return started[-1]

    yield start
    for served in started:
        served.stop()


def manifest_of(location: Path) -> dict[str, Any]:
    return json.loads((location / "manifest.json").read_text())  # type: ignore[no-any-return]


@pytest.mark.parametrize("damage", ["deleted", "noise"])
def test_a_process_with_another_count_cannot_join_after_the_manifest_is_lost(
        cache_dir: Path, serve: Callable[[Path, int], Served], damage: str) -> None:
    a = serve(cache_dir, 8)
    assert a.state == "ready"
    a("set_many", {k: "A1" for k in KEYS})
    manifest = cache_dir / "manifest.json"
    if damage == "deleted":
        manifest.unlink()
    else:
        manifest.write_bytes(os.urandom(10))
    b = serve(cache_dir, 4)
    assert b.state == "refused", (
        f"a SHARDS=4 process opened a directory of 8 shard files; what it then reads "
        f"of A's keys: {b('get_many', KEYS[:5])}")
    assert "record 8 shards" in b.message and "SHARDS=4" in b.message, b.message
    # The running process still serves its data, and writes the manifest again
    # from the shard files at its next check.
    time.sleep(SETTLE)
    assert a("get_many", KEYS) == {k: "A1" for k in KEYS}
    assert manifest_of(cache_dir)["shards"] == 8
    assert serve(cache_dir, 8).state == "ready"


def test_a_running_process_stops_serving_a_directory_remade_with_another_count(
        cache_dir: Path, serve: Callable[[Path, int], Served]) -> None:
    a = serve(cache_dir, 8)
    a("set_many", {k: "A1" for k in KEYS})
    assert a("get_many", KEYS) == {k: "A1" for k in KEYS}  # warm connections
    errors_before = a("stats")["errors"]
    shutil.rmtree(cache_dir)
    b = serve(cache_dir, 4)  # an empty directory: B's layout is the directory's now
    assert b.state == "ready", b.message
    b("set_many", {k: "B1" for k in KEYS})
    time.sleep(SETTLE)
    seen = a("get_many", KEYS)
    assert not [k for k in KEYS if seen[k] == "A1"], "A served values older than B's writes"
    # Whatever A acknowledges, B reads; whatever A does not, B's values stay.
    added = a("add_each", {f"new-{k}": "A2" for k in KEYS})
    read = b("get_many", list(added))
    assert [k for k, ok in added.items() if ok and read[k] != "A2"] == [], (
        "B did not read what A acknowledged")
    a("set_many", {k: "A2" for k in KEYS})
    after_b = b("get_many", KEYS)
    after_a = a("get_many", KEYS)
    assert [k for k in KEYS if after_a[k] == "A2" and after_b[k] != "A2"] == [], (
        "A reads its own write that B does not see")
    assert a("stats")["errors"] > errors_before  # every refusal is counted
    assert manifest_of(cache_dir)["shards"] == 4  # A never wrote its own over B's
    assert len(list(cache_dir.glob("shard-*.sqlite3"))) == 4


def test_a_manifest_that_says_fewer_shards_than_the_files_is_refused(
        cache_dir: Path, make_cache: Callable[..., ShardedSQLiteCache]) -> None:
    from django.core.exceptions import ImproperlyConfigured

    make_cache({"SHARDS": 8}).set("k", "v")
    manifest = manifest_of(cache_dir)
    (cache_dir / "manifest.json").write_text(json.dumps({**manifest, "shards": 4}))
    with pytest.raises(ImproperlyConfigured,
                       match=r"says 4 shards but the shard files record 8 shards"):
        make_cache({"SHARDS": 4})


def test_a_missing_manifest_is_written_only_for_the_count_on_disk(
        cache_dir: Path, make_cache: Callable[..., ShardedSQLiteCache]) -> None:
    from django.core.exceptions import ImproperlyConfigured

    make_cache({"SHARDS": 4}).set("k", "v")
    (cache_dir / "manifest.json").unlink()
    for shards in (2, 8):
        with pytest.raises(ImproperlyConfigured,
                           match=f"record 4 shards, but SHARDS={shards}"):
            make_cache({"SHARDS": shards})
        assert not (cache_dir / "manifest.json").exists()
    assert make_cache({"SHARDS": 4}).get("k") == "v"
    assert manifest_of(cache_dir)["shards"] == 4


def test_counts_of_another_layout_are_not_moved_to(
        cache_dir: Path, make_cache: Callable[..., ShardedSQLiteCache]) -> None:
    """The counts file replaced by one another shard count made: its slots and
    floors sit at other offsets, so this process's counts carried over would
    land in its floors. The process keeps the file it has."""
    cache = make_cache({"SHARDS": 8})
    cache.set("k", "v")
    shared = cache._store.counts
    before = shared._file_id
    other = counts.ShardCounts(str(cache_dir / "elsewhere.mmap"), 4)
    other.close()
    os.replace(cache_dir / "elsewhere.mmap", cache_dir / "counts.mmap")
    time.sleep(2 * counts.CHECK_EVERY)
    shared.total()  # a use of the mapping checks the file
    assert shared._file_id == before
    assert os.path.getsize(cache_dir / "counts.mmap") == other._size  # left as it was


def test_counts_of_another_layout_of_the_same_length_are_not_moved_to(
        cache_dir: Path, make_cache: Callable[..., ShardedSQLiteCache]) -> None:
    """4 and 6 shards lay the counts file out to the same length: the count the
    file was laid out for tells them apart."""
    cache = make_cache({"SHARDS": 4})
    cache.set("k", "v")
    shared = cache._store.counts
    before = shared._file_id
    other = counts.ShardCounts(str(cache_dir / "elsewhere.mmap"), 6)
    assert other._size == shared._size  # the premise
    other.store(1, 1, 24)
    other.close()
    os.replace(cache_dir / "elsewhere.mmap", cache_dir / "counts.mmap")
    time.sleep(2 * counts.CHECK_EVERY)
    shared.total()
    assert shared._file_id == before
    mine = counts.ShardCounts(str(cache_dir / "counts.mmap"), 6)
    assert mine.total() == (1, 24)  # nothing of the 4-shard process carried into it
    mine.close()


def test_the_shard_files_record_the_count_when_the_highest_one_is_missing(
        cache_dir: Path, serve: Callable[[Path, int], Served]) -> None:
    """A cleaner deletes the manifest and the highest shard file (idle, it ages
    like the manifest): the count is read from the shard files' own headers,
    not guessed from the highest name, so the running process goes on and a
    new one with the true count opens the cache; one with the count the names
    suggest is refused."""
    from django.core.exceptions import ImproperlyConfigured

    a = serve(cache_dir, 8)
    a("set_many", {k: "A1" for k in KEYS})
    (cache_dir / "manifest.json").unlink()
    for suffix in ("", "-wal", "-shm"):
        path = cache_dir / f"shard-007.sqlite3{suffix}"
        if path.exists():
            path.unlink()
    time.sleep(SETTLE)
    # What shard 7 held went with its file; the others' values are served.
    kept = {k: None if zlib.crc32(f":1:{k}".encode()) % 8 == 7 else "A1" for k in KEYS}
    assert a("get_many", KEYS) == kept
    assert manifest_of(cache_dir)["shards"] == 8
    with pytest.raises(ImproperlyConfigured, match="SHARDS=7"):
        new_cache(cache_dir, {"SHARDS": 7})
    survivor = next(k for k, v in kept.items() if v == "A1")
    assert new_cache(cache_dir, {"SHARDS": 8}).get(survivor) == "A1"


def test_a_name_that_is_not_a_shard_does_not_decide_the_layout(
        cache_dir: Path, make_cache: Callable[..., ShardedSQLiteCache]) -> None:
    """A link to nothing (or an empty file) named like a shard far beyond the
    layout: the shard files' records decide, not the names."""
    make_cache({"SHARDS": 8}).set("k", "v")
    (cache_dir / "shard-999.sqlite3").symlink_to(cache_dir / "nowhere")
    (cache_dir / "shard-500.sqlite3").touch()
    assert make_cache({"SHARDS": 8}).get("k") == "v"
    (cache_dir / "manifest.json").unlink()
    assert make_cache({"SHARDS": 8}).get("k") == "v"


def test_a_shard_file_put_at_another_index_is_refused(
        cache_dir: Path, make_cache: Callable[..., ShardedSQLiteCache]) -> None:
    """Two shard files swapped: each records its own index, so keys are not
    routed to another shard's rows (which could hold another routing's
    older values); the calls on them fail as faults do."""
    cache = make_cache({"SHARDS": 2})
    cache.set_many({f"k{i}": i for i in range(20)})
    cache.close_connections()
    for suffix in ("-wal", "-shm"):
        for i in (0, 1):
            path = cache_dir / f"shard-00{i}.sqlite3{suffix}"
            if path.exists():
                path.unlink()
    os.rename(cache_dir / "shard-000.sqlite3", cache_dir / "swap")
    os.rename(cache_dir / "shard-001.sqlite3", cache_dir / "shard-000.sqlite3")
    os.rename(cache_dir / "swap", cache_dir / "shard-001.sqlite3")
    fresh = make_cache({"SHARDS": 2})
    assert fresh.get_many([f"k{i}" for i in range(20)]) == {}
    assert fresh.stats()["errors"] > 0
