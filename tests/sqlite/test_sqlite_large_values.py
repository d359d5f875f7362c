"""Large values live in files beside the shards, as safe as values in rows.

Pinned (docs/architecture.md "Large values", store/values.py): a payload of
``LARGE_MIN`` bytes or more goes to a file of a new random name; the row holds
its name and tag. Every file is named by a live row or listed in the shard's
``garbage`` table, so replacing, deleting, culling, expiring and clearing
remove the files, and writers killed with SIGKILL at any moment leave nothing
that ``reclaim`` does not find. A file altered on disk reads as a miss (a
serialized one is never unpickled), ``SIZE_LIMIT`` counts file values, and a
quarantined shard takes its files with it.
"""

from __future__ import annotations

import os
import pickle
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.store.codec import LARGE_MIN
from djcachebench.store.protocol import MISSING

from .helpers import (
    PATIENT,
    SPAWN,
    TouchOnUnpickle,
    join_all,
    kill_writers,
    raw_shard,
    shard_files,
    shard_path,
    start,
)
from .workers import large_value_replacer, large_value_writer, replaced_value

BIG = b"x" * (LARGE_MIN + 10)


def value_files(location: Path) -> set[str]:
    return {p.name for p in (location / "values").rglob("*") if p.is_file()}


def named_files(location: Path) -> set[str]:
    names: set[str] = set()
    for path in shard_files(location):
        with raw_shard(path) as conn:
            names.update(
                r[0] for r in conn.execute("SELECT file FROM cache WHERE file IS NOT NULL")
            )
    return names


def file_of(cache: ShardedSQLiteCache, key: str) -> Path:
    with raw_shard(shard_path(cache, key)) as conn:
        (name,) = conn.execute(
            "SELECT file FROM cache WHERE key = ?", (cache.make_key(key),)
        ).fetchone()
    index = cache._store.route(cache.make_key(key))
    return Path(cache._store.shards[index].files.path(name))


@pytest.mark.parametrize(
    "value", [BIG, BIG.decode() + "é", {"blob": BIG, "n": 1}], ids=["bytes", "str", "pickled"]
)
def test_large_values_round_trip_through_a_file(
    cache: ShardedSQLiteCache, cache_dir: Path, value: Any
) -> None:
    cache.set("k", value)
    assert file_of(cache, "k").exists()
    for _ in range(2):  # the second read may come through the memo
        assert cache.get("k") == value
    assert cache.get_many(["k"]) == {"k": value}
    assert cache.has_key("k")
    assert value_files(cache_dir) == named_files(cache_dir) != set()


def test_replacing_deleting_and_clearing_remove_the_files(
    cache: ShardedSQLiteCache, cache_dir: Path
) -> None:
    cache.set("a", BIG)
    first = file_of(cache, "a")
    cache.set("a", BIG + b"2")
    assert not first.exists() and cache.get("a") == BIG + b"2"
    cache.set("a", "small now")  # a row value replaces the file, removed at once
    assert value_files(cache_dir) == set()
    cache.set_many({"b": BIG, "c": BIG, "d": b"small"})
    assert len(value_files(cache_dir)) == 2
    cache.delete("b")
    assert len(value_files(cache_dir)) == 1
    cache.delete_many(["c"])
    assert value_files(cache_dir) == set()
    cache.set("e", BIG)
    assert cache.add("e", BIG) is False and len(value_files(cache_dir)) == 1
    assert cache.add("f", BIG) is True and cache.get("f") == BIG
    cache.clear()
    assert value_files(cache_dir) == set()


def test_culling_and_expiry_remove_the_files(
    make_cache: Callable[..., ShardedSQLiteCache], cache_dir: Path
) -> None:
    cache = make_cache({"MAX_ENTRIES": 10, "CULL_FREQUENCY": 2})
    for i in range(40):
        cache.set(f"k{i}", BIG)
    assert cache.entry_count() <= 10
    assert value_files(cache_dir) == named_files(cache_dir)
    assert len(value_files(cache_dir)) == cache.entry_count()
    cache.set("short", BIG, timeout=0.05)
    time.sleep(0.1)
    assert cache.get("short") is None
    cache._store.culler.cull()  # removes the expired rows first
    assert value_files(cache_dir) == named_files(cache_dir)


def test_size_limit_counts_values_in_files(
    make_cache: Callable[..., ShardedSQLiteCache], cache_dir: Path
) -> None:
    limit = 10 * len(BIG)
    cache = make_cache({"SIZE_LIMIT": limit, "MAX_ENTRIES": None})
    for i in range(30):
        cache.set(f"k{i}", BIG)
    total = sum(os.path.getsize(p) for p in (cache_dir / "values").rglob("*") if p.is_file())
    assert total <= limit
    assert cache.get("k29") == BIG


def test_altered_file_is_a_miss_and_a_pickle_in_it_never_runs(
    cache: ShardedSQLiteCache, tmp_path: Path
) -> None:
    marker = tmp_path / "unpickled"
    value = {"pad": BIG}
    cache.set("k", value)
    assert cache.get("k") == value  # verified once: a pickle is still checked every read
    path = file_of(cache, "k")
    evil = pickle.dumps([TouchOnUnpickle(marker), BIG])
    path.write_bytes(evil[: len(pickle.dumps(value))].ljust(len(pickle.dumps(value)), b"."))
    assert cache.get("k", "default") == "default"
    path.write_bytes(evil)
    assert cache.get("k", "default") == "default"
    assert not marker.exists()
    assert cache.stats()["tampered"] == 2
    cache.set("raw", BIG)
    raw = file_of(cache, "raw")
    raw.write_bytes(b"y" * len(BIG))
    other = ShardedSQLiteCache(str(cache.location), {})  # has never verified it
    assert other.get("raw", "default") == "default"


def test_a_missing_file_is_a_miss(cache: ShardedSQLiteCache) -> None:
    cache.set("k", BIG)
    file_of(cache, "k").unlink()
    assert cache.get("k", "default") == "default"
    cache.set("k", BIG)
    assert cache.get("k") == BIG


def test_quarantined_shard_takes_its_files_along(cache: ShardedSQLiteCache) -> None:
    cache.set("k", BIG)
    path = file_of(cache, "k")
    store = cache._store
    index = store.route(cache.make_key("k"))
    moved = store.shards[index].quarantine(store.shards[index].file_id())
    assert moved is not None
    assert not path.exists()
    assert Path(moved + "-values").is_dir()


def test_sigkilled_large_value_writers_leave_no_orphan_and_no_torn_value(
    cache_dir: Path, make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    """Writers of large values are SIGKILLed at random moments (some in the middle
    of writing a file). Afterwards every file is named by a row or reclaimed, every
    row's file exists, and every value read back is whole and is the key's own."""
    options = {**PATIENT, "SHARDS": 2, "MAX_ENTRIES": None}
    make_cache(options)
    seed = random.randrange(2**32)
    kill_writers(large_value_writer, cache_dir, options, seed)
    reader = make_cache(options)
    reader.reclaim_files(pending_age=0)
    assert value_files(cache_dir) == named_files(cache_dir), f"seed {seed}"
    keys = [f"r{r}w{w}-{k}" for r in range(4) for w in range(3) for k in range(6)]
    found = reader.get_many(keys)
    for key, value in found.items():
        assert value.startswith(f"{key}|".encode()), (key, value[:40], seed)
        assert len(value) >= 40_000
    assert reader.stats()["tampered"] == 0 and reader.stats()["errors"] == 0


def pending_names(location: Path) -> set[str]:
    """Names entered for a file whose row was never committed (values.py)."""
    names: set[str] = set()
    for path in shard_files(location):
        with raw_shard(path) as conn:
            names.update(r[0] for r in conn.execute("SELECT name FROM garbage WHERE since > 0"))
    return names


def last_ack(recv: Any) -> int:
    """The last write a killed replacer acknowledged (-1: none)."""
    last = -1
    try:
        while recv.poll(0):
            last = recv.recv()
    except EOFError:
        pass
    return last


@pytest.mark.slow
def test_a_large_value_replaced_under_sigkill_reads_whole_old_or_new(
    cache_dir: Path, make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    """Processes replacing 1-4 MB values are SIGKILLed at random moments, in rounds,
    until at least two died mid-write (between entering a file's name and committing
    its row). After every round each key reads as its last acknowledged value or
    the one in flight, byte for byte, never another; at the end the files of the
    killed writes are collected and every file left is named by a row."""
    options = {**PATIENT, "SHARDS": 2, "MAX_ENTRIES": None}
    cache = make_cache(options)
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    writers = [[f"w{w}k{k}" for k in range(2)] for w in range(3)]
    acked = {key: 0 for keys in writers for key in keys}
    for key in acked:
        cache.set(key, replaced_value(key, 0))
    killed_mid_write = rounds = 0
    pending: set[str] = set()
    while killed_mid_write < 2 and rounds < 15:
        rounds += 1
        first = rounds * 1_000_000
        procs = []
        for keys in writers:
            recv, send = SPAWN.Pipe(duplex=False)
            procs.append(
                (start(large_value_replacer, str(cache_dir), options, keys, first, send), recv)
            )
            send.close()
        for _, recv in procs:
            assert recv.poll(60) and recv.recv() == -1, f"writer not ready (seed {seed})"
        time.sleep(rng.uniform(0.05, 0.3))
        for proc, _ in procs:
            os.kill(proc.pid, signal.SIGKILL)
            time.sleep(rng.uniform(0, 0.01))
        assert join_all([p for p, _ in procs], 60) == [-signal.SIGKILL] * 3
        in_flight: dict[str, int] = {}
        for keys, (_, recv) in zip(writers, procs, strict=True):
            last = last_ack(recv)
            for i in range(last + 1):
                acked[keys[i % len(keys)]] = first + i
            in_flight[keys[(last + 1) % len(keys)]] = first + last + 1
        for key, version in acked.items():
            value = cache.get(key)
            assert value is not None, (key, seed)
            n = int(value.split(b"|")[1])
            assert n in (version, in_flight.get(key)), (key, n, version, seed)
            assert value == replaced_value(key, n), (key, n, seed)
            acked[key] = n
        now_pending = pending_names(cache_dir)
        killed_mid_write += len(now_pending - pending)
        pending = now_pending
    assert killed_mid_write >= 1, f"no kill landed mid-write in {rounds} rounds (seed {seed})"
    cache.reclaim_files(pending_age=0)
    assert value_files(cache_dir) == named_files(cache_dir), f"seed {seed}"
    assert not pending_names(cache_dir)
    assert cache.stats()["tampered"] == 0 and cache.stats()["errors"] == 0


def test_a_read_racing_a_delete_of_a_file_value_is_a_plain_miss(
    cache: ShardedSQLiteCache,
) -> None:
    """The row was selected, then deleted (its file removed) before the file was
    read: the reader gets a miss, counted as a miss, not as a fault."""
    cache.set("k", BIG)
    final = cache.make_key("k")
    index = cache._store.route(final)
    with raw_shard(shard_path(cache, "k")) as conn:
        row = conn.execute(
            "SELECT kind, value, expires, file, size FROM cache WHERE key = ?", (final,)
        ).fetchone()
    assert cache.delete("k")
    errors = cache._store.stats.errors
    value = cache._store.reader.decode_file(index, final, row)[0]
    assert value is MISSING
    assert cache._store.stats.errors == errors


@pytest.mark.parametrize("op", ["set", "add", "incr"])
def test_a_writer_later_than_pending_age_loses_nothing(
    make_cache: Callable[..., ShardedSQLiteCache], cache_dir: Path, op: str
) -> None:
    """A writer stalled between writing its value file and committing the row for
    longer than ``PENDING_AGE`` (600 s) may find its file reclaimed by another
    process's collection; committing a row naming it anyway would lose both its
    acknowledged value and the one it replaced. Here the other process collects
    with a pending age of 0 at that moment: the late writer writes the value
    again under a new name."""
    writer = make_cache({"SHARDS": 1, "MAX_ENTRIES": None})
    other = make_cache({"SHARDS": 1, "MAX_ENTRIES": None})
    huge = 256 ** (LARGE_MIN + 10)  # an int whose pickle needs a value file
    old, new = (BIG, b"y" * len(BIG)) if op != "incr" else (huge, huge + 1)
    if op != "add":
        writer.set("k", old, None)
    files = writer._store.shards[0].files
    write = files.write
    stalls = [1]  # the writer is late once

    def write_then_be_taken_for_dead(name: str, payload: bytes) -> None:
        write(name, payload)
        if stalls.pop() if stalls else 0:
            collector = other._store
            collector.shards[0].files.collect(collector.pool.get(0), pending_age=0.0)

    files.write = write_then_be_taken_for_dead  # type: ignore[method-assign]
    if op == "set":
        writer.set("k", new, None)
    elif op == "add":
        assert writer.add("k", new, None) is True
    else:
        assert writer.incr("k") == new
    files.write = write  # type: ignore[method-assign]
    for reader in (writer, other, make_cache({"SHARDS": 1, "MAX_ENTRIES": None})):
        assert reader.get("k") == new
    assert value_files(cache_dir) == named_files(cache_dir)  # no orphan, none missing
