"""A generation table file deleted, damaged or impossible to create under running
processes: the L1s over it go off, never the cache, and coherence holds when the
table comes back (coherence/table_file.py, ``pending`` and ``_switch``).
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import time
from pathlib import Path

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.backends.tiered import TieredCache
from djcachebench.coherence.table import CHECK_EVERY
from tests.tiered.helpers import sqlite_tiered

SPAWN = multiprocessing.get_context("spawn")


def _plain_set(location: str, key: str, value: str) -> None:
    """Another process, which writes through the L2 alone (no TieredCache)."""
    ShardedSQLiteCache(location, {"OPTIONS": {}}).set(key, value)


def _write_in_another_process(location: str, key: str, value: str) -> None:
    child = SPAWN.Process(target=_plain_set, args=(location, key, value))
    child.start()
    child.join(60)
    assert child.exitcode == 0


def test_a_table_made_again_after_its_file_was_deleted_still_says_it_is_watched(
        tmp_path: Path) -> None:
    """The table file deleted (a /tmp cleaner, an operator) and made again by the
    reader that noticed: the new file lacked the *watched* word, so a process
    started later that writes through ShardedSQLiteCache alone skipped its
    stamps, and the reader served the value that write had replaced until
    L1_TIMEOUT. A process moving to a new file now sets there the words it
    relied on."""
    reader = sqlite_tiered(tmp_path)
    location = str(tmp_path / "sqlite")
    reader.set("k", "v1")
    assert reader.get("k") == "v1"
    os.unlink(os.path.join(location, "generations.mmap"))
    time.sleep(2 * CHECK_EVERY)
    assert reader.get("k") == "v1"  # noticed, moved to a new file, refilled
    assert reader.get("k") == "v1"
    _write_in_another_process(location, "k", "v2")  # acknowledged
    assert reader.get("k") == "v2"


def _odd(path: Path, kind: str) -> None:
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.write_bytes(os.urandom(100))  # not a table's shape: refused, never overwritten


def _undo(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


@pytest.mark.parametrize("kind", ["directory", "fifo", "garbage"])
def test_a_table_file_that_cannot_be_used_turns_l1s_off_not_the_cache(
        tmp_path: Path, kind: str) -> None:
    """The table file replaced by something that is not a table (or impossible to
    create: a full disk) made every construction of the cache raise
    ImproperlyConfigured, for ShardedSQLiteCache and every TieredCache over it,
    although the shards were fine. Now the cache works and the L1s are off; once
    a table can be had, the next check takes it, and coherence holds with a
    process that opened it normally."""
    location = tmp_path / "sqlite"
    location.mkdir(mode=0o700)
    table = location / "generations.mmap"
    _odd(table, kind)
    plain = ShardedSQLiteCache(str(location), {"OPTIONS": {}})
    plain.set("k", "v1")
    assert plain.get("k") == "v1"
    reader = sqlite_tiered(tmp_path)
    for _ in range(3):
        assert reader.get("k") == "v1"
    assert reader.stats()["l1_hits"] == 0  # nothing kept under a table nobody shares
    assert reader.stats()["coherence_faults"] >= 1
    _undo(table)
    for _ in range(3):
        assert reader.get("k") == "v1"
        time.sleep(2 * CHECK_EVERY)
    assert reader.stats()["l1_hits"] >= 1  # the table was taken: the L1 is on again
    _write_in_another_process(str(location), "k", "v2")  # opens the table normally
    assert reader.get("k") == "v2"


@pytest.mark.parametrize("kind", ["directory", "garbage"])
def test_a_generation_path_that_cannot_be_used_turns_the_l1_off(
        tmp_path: Path, kind: str) -> None:
    """The same for the table of any other L2 (``GENERATION_PATH``)."""
    path = tmp_path / "g.mmap"
    _odd(path, kind)
    options = {"L2": {"BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
                      "LOCATION": str(tmp_path / "fb")}, "GENERATION_PATH": str(path)}
    cache = TieredCache("", {"OPTIONS": options})
    cache.set("k", "v")
    assert [cache.get("k") for _ in range(3)] == ["v"] * 3
    assert cache.stats()["l1_hits"] == 0
    _undo(path)
    for _ in range(3):
        cache.get("k")
        time.sleep(2 * CHECK_EVERY)
    assert cache.get("k") == "v"
    assert cache.stats()["l1_hits"] >= 1
