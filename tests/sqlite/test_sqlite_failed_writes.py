"""A write that fails leaves no older value to read, in any process.

A write can fail while reads still work: a full disk, a shard whose write lock
another process holds past the retry policy, an I/O error on write. Django's
``set`` has no result and ``delete``'s False also means "absent", so a caller
goes on as if the write had happened; before this, every read then served the
value it meant to replace or remove, for as long as that value lived. Now the
failing process voids the key's stored rows (``store/counts.py``, "Why
floors"): they read as absent to every process, and to every write that reads
(``add`` over them succeeds, ``touch`` answers False, ``incr`` raises
``ValueError``), until a write that succeeds stores the key again.

Each test below fails on the code before the floors (the old value is read).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.backends.tiered import TieredCache
from djcachebench.store.counts import ShardCounts
from tests.tiered.helpers import SQLITE

from .helpers import (
    SPAWN,
    join_all,
    keys_elsewhere,
    keys_in_shard,
    shard_locked,
    shard_of,
    shard_path,
    start,
)
from .workers import disk_full_replacer, read_back

# Give up fast: these tests are about what a failed write leaves, not the wait.
FAST = {"LOCK_TIMEOUT": 0.05, "RETRIES": 0, "RETRY_BACKOFF": 0.01}


def read_elsewhere(cache_dir: Path, options: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """What a freshly started process reads of ``keys``."""
    receive, send = SPAWN.Pipe(duplex=False)
    child = start(read_back, str(cache_dir), options, keys, send)
    assert receive.poll(120), "the reader sent nothing"
    seen = receive.recv()
    assert join_all([child]) == [0]
    return seen


def assert_absent(cache: ShardedSQLiteCache, key: str) -> None:
    assert cache.get(key) is None
    assert cache.get(key, "default") == "default"
    assert cache.get_many([key]) == {}
    assert cache.has_key(key) is False
    assert cache.get_with_expiry(key) == (None, None)


FAILING_WRITES: dict[str, Callable[[ShardedSQLiteCache], Any]] = {
    "set": lambda c: c.set("k", "new"),
    "set_many": lambda c: c.set_many({"k": "new"}),
    "set_past_timeout": lambda c: c.set("k", "new", timeout=0),
    "delete": lambda c: c.delete("k"),
    "delete_many": lambda c: c.delete_many(["k"]),
    "touch_past_timeout": lambda c: c.touch("k", 0),
}


@pytest.mark.slow
@pytest.mark.parametrize("write", list(FAILING_WRITES))
def test_a_write_that_gave_up_leaves_no_older_value_in_any_process(
    make_cache: Callable[..., ShardedSQLiteCache], cache_dir: Path, write: str
) -> None:
    cache = make_cache(FAST)
    cache.set("k", "old")
    others = keys_elsewhere(cache, shard_of(cache, "k"), 4)
    cache.set_many({o: "kept" for o in others})
    assert cache.get("k") == "old"
    with shard_locked(shard_path(cache, "k"), "write"):
        FAILING_WRITES[write](cache)
        assert cache.stats()["give_ups"] >= 1, "the write must have failed"
        # Reads still work on the locked shard (WAL), and must not serve "old".
        assert_absent(cache, "k")
        seen = read_elsewhere(cache_dir, FAST, ["k", *others])
        assert seen["get"]["k"] is None
        assert "k" not in seen["get_many"]
        assert seen["has_key"]["k"] is False
        assert all(seen["get"][o] == "kept" for o in others)
    assert_absent(cache, "k")
    assert cache.get_many(others) == {o: "kept" for o in others}
    assert cache.stats()["voided"] == 1
    cache.set("k", "after")  # a write that succeeds is served again
    assert cache.get("k") == "after"
    assert read_elsewhere(cache_dir, FAST, ["k"])["get"]["k"] == "after"


@pytest.mark.slow
@pytest.mark.parametrize("write", ["set", "set_many"])
def test_a_write_that_waited_through_another_ones_failure_is_live(
    make_cache: Callable[..., ShardedSQLiteCache], write: str
) -> None:
    """A patient writer waits on the locked shard while an impatient one gives up
    and voids the key; the patient one then commits, and its value is read.
    ``set_many`` must take its rows' time after the wait: taken before, it is at
    or below the floor raised meanwhile, and its value reads as absent."""
    patient = make_cache({"LOCK_TIMEOUT": 10.0, "RETRIES": 0})
    impatient = make_cache(FAST)
    patient.set("k", "old")
    done: list[Any] = []
    with shard_locked(shard_path(patient, "k"), "write"):
        writer = threading.Thread(target=lambda: done.append(
            patient.set("k", "patient") if write == "set"
            else patient.set_many({"k": "patient"})))
        writer.start()
        time.sleep(0.3)  # the patient writer is waiting on the lock by now
        impatient.set("k", "impatient")
        assert impatient.stats()["voided"] == 1
        assert patient.get("k") is None
    writer.join(30)
    assert done in ([None], [[]])
    assert patient.get("k") == impatient.get("k") == "patient"


@pytest.mark.slow
def test_writes_that_read_take_a_voided_row_for_absent(
    make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    cache = make_cache(FAST)
    cache.set_many({"k": "old", "n": 5, "t": "old"})
    for key in ("k", "n", "t"):
        with shard_locked(shard_path(cache, key), "write"):
            cache.set(key, "new")
    assert cache.touch("t", 100) is False
    with pytest.raises(ValueError):
        cache.incr("n")
    assert cache.delete("k") is False  # it was absent to every read
    assert cache.add("t", "added") is True
    assert cache.get("t") == "added"
    assert cache.add("n", 1) is True
    assert cache.incr("n") == 2


@pytest.mark.slow
def test_a_failed_clear_voids_the_shard_it_could_not_clear(
    make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    cache = make_cache(FAST)
    index = shard_of(cache, "k")
    others = keys_elsewhere(cache, index, 8)
    cache.set_many({"k": "old", **{o: "v" for o in others}})
    with shard_locked(shard_path(cache, "k"), "write"):
        cache.clear()
        assert_absent(cache, "k")
    assert cache.get_many(["k", *others]) == {}
    cache.set("k", "new")
    assert cache.get("k") == "new"


@pytest.mark.slow
def test_a_set_that_finds_the_disk_full_leaves_no_older_value(
    make_cache: Callable[..., ShardedSQLiteCache], cache_dir: Path
) -> None:
    """The real SQLite files, unable to grow (``RLIMIT_FSIZE``, as a full disk)."""
    cache = make_cache({"MAX_ENTRIES": None})
    cache.set("k", "old")
    cache.set("other", "kept")
    cache.close_connections()
    receive, send = SPAWN.Pipe(duplex=False)
    child = start(disk_full_replacer, str(cache_dir), {"MAX_ENTRIES": None}, "k", 400_000, send)
    assert receive.poll(120), "the child reported nothing"
    outcome = receive.recv()
    assert join_all([child]) == [0]
    assert outcome["errors"] > 0, "the set must have failed"
    assert outcome["voided"] == 1
    assert outcome["read"] is None, "the process whose set failed read the old value"
    again = make_cache({"MAX_ENTRIES": None})
    assert again.get("k") is None
    assert again.get("other") == "kept"


@pytest.mark.slow
def test_a_write_that_fails_on_a_key_without_a_row_voids_nothing(
    make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    """Only keys that have a row are voided: voiding a slot voids its other keys too."""
    cache = make_cache(FAST)
    cache.set("k", "old")
    [fresh] = keys_in_shard(cache, shard_of(cache, "k"), 1, prefix="never-stored")
    with shard_locked(shard_path(cache, "k"), "write"):
        cache.set(fresh, "new")
        assert cache.stats()["give_ups"] == 1
    assert cache.stats()["voided"] == 0
    assert cache.get("k") == "old"


@pytest.mark.slow
def test_a_failed_set_under_tiered_leaves_no_older_value_in_its_l1(tmp_path: Path) -> None:
    cache = TieredCache("", {"OPTIONS": {
        "L2": {"BACKEND": SQLITE, "LOCATION": str(tmp_path / "sqlite"), "OPTIONS": FAST}}})
    l2 = cache._l2
    cache.set("k", "old")
    assert cache.get("k") == "old"
    assert cache.get("k") == "old"  # from the L1 now
    with shard_locked(shard_path(l2, "k"), "write"):
        cache.set("k", "new")
        assert cache.get("k") is None
    assert cache.get("k") is None


def test_floors_only_rise_and_are_shared_by_every_mapping(tmp_path: Path) -> None:
    path = str(tmp_path / "counts.mmap")
    one, two = ShardCounts(path, 3), ShardCounts(path, 3)
    assert one.slots % 3 == 0
    one.raise_floors([7], 100)
    one.raise_floors([7], 50)  # an earlier failure never lowers a floor
    assert one.floor(7) == two.floor(7) == 100
    assert two.floor(7 + two.slots) == 100  # a slot is a crc modulo ``slots``
    assert two.floor(8) == 0
    two.raise_floors(range(1, two.slots, 3), 200)  # every slot of shard 1
    assert one.floor(4) == 200 and one.floor(7) == 200 and one.floor(6) == 0
    assert one.highest_floor() == two.highest_floor() == 200  # get_many's shortcut
    one.raise_floors([6], 150)
    assert two.highest_floor() == 200 and two.floor(6) == 150
    one.close()
    two.close()
