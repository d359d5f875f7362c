"""``counts.mmap`` deleted or replaced under running processes.

The file holds the shard counts and the floors of failed writes
(``store/counts.py``). A process that had it mapped kept the old file when it
was deleted, while every process started since made and used a new one: a
failed write's floor raised in one file was never seen by the readers of the
other, who went on serving the value that write meant to replace. Now a
process notices the change within ``CHECK_EVERY`` (and at once when it raises
a floor) and moves to the file at the path, carrying its floors and counts.

Each test fails on the code before the move (the floor is not seen).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.store.counts import CHECK_EVERY, ShardCounts

from .helpers import shard_locked, shard_path
from .test_sqlite_failed_writes import FAST, read_elsewhere


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[ShardCounts, ShardCounts]]:
    """``old`` maps the file that is then deleted; ``new`` (a process started
    since) makes and maps a new one at the same path."""
    path = str(tmp_path / "counts.mmap")
    old = ShardCounts(path, 4)
    os.unlink(path)
    new = ShardCounts(path, 4)
    try:
        yield old, new
    finally:
        old.close()
        new.close()


def test_a_floor_raised_on_the_deleted_file_reaches_the_new_one_at_once(
    pair: tuple[ShardCounts, ShardCounts],
) -> None:
    old, new = pair
    at = time.time_ns()
    old.raise_floors([7], at)
    assert new.floor(7) == at and new.highest_floor() == at
    assert old.floor(7) == at


def test_a_process_on_the_deleted_file_moves_to_the_new_one(
    pair: tuple[ShardCounts, ShardCounts],
) -> None:
    old, new = pair
    old.store(1, 10, 1000)
    at = time.time_ns()
    new.raise_floors([5], at)
    time.sleep(2 * CHECK_EVERY)
    assert old.floor(5) == at
    # The counts the new file had none for came along.
    assert new.load(1) == (10, 1000)
    old.store(2, 3, 30)
    assert new.load(2) == (3, 30)
    st = os.stat(new.path)
    assert old._file_id == new._file_id == (st.st_dev, st.st_ino)


def test_floors_carried_over_are_the_higher_of_both_files(
    pair: tuple[ShardCounts, ShardCounts],
) -> None:
    old, new = pair
    early, late = time.time_ns(), time.time_ns() + 1000
    old._floors[3] = late  # raised before the file was deleted
    old._floors[4] = early
    old._floors[old.slots] = late
    new.raise_floors([4], late)
    time.sleep(2 * CHECK_EVERY)
    assert old.floor(3) == new.floor(3) == late
    assert old.floor(4) == new.floor(4) == late


def test_a_file_replaced_by_rename_is_noticed_too(tmp_path: Path) -> None:
    path = str(tmp_path / "counts.mmap")
    old = ShardCounts(path, 4)
    other = str(tmp_path / "other.mmap")
    made = ShardCounts(other, 4)
    os.replace(other, path)
    try:
        at = time.time_ns()
        made.raise_floors([9], at)
        time.sleep(2 * CHECK_EVERY)
        assert old.floor(9) == at
    finally:
        old.close()
        made.close()


def test_a_file_that_cannot_be_made_again_keeps_the_mapping(tmp_path: Path) -> None:
    where = tmp_path / "gone"
    where.mkdir()
    counts = ShardCounts(str(where / "counts.mmap"), 2)
    try:
        os.unlink(where / "counts.mmap")
        where.rmdir()
        at = time.time_ns()
        counts.raise_floors([1], at)  # must not raise
        time.sleep(2 * CHECK_EVERY)
        assert counts.floor(1) == at
        counts.store(0, 5, 50)
        assert counts.total() == (5, 50)
        assert not where.exists(), "a removed directory must stay removed"
    finally:
        counts.close()


@pytest.mark.slow
def test_a_failed_write_after_the_counts_file_was_deleted_voids_in_new_processes(
    make_cache: Callable[..., ShardedSQLiteCache], cache_dir: Path
) -> None:
    cache = make_cache(FAST)
    cache.set("k", "old")
    os.unlink(cache_dir / "counts.mmap")
    with shard_locked(shard_path(cache, "k"), "write"):
        cache.set("k", "new")
        assert cache.stats()["give_ups"] >= 1, "the write must have failed"
        assert cache.get("k") is None
        seen = read_elsewhere(cache_dir, FAST, ["k"])
        assert seen["get"]["k"] is None
        assert seen["has_key"]["k"] is False
    assert cache.get("k") is None
