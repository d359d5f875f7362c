"""The shards' write-ahead logs stay bounded after large writes.

Pinned (docs/architecture.md "One shard", store/shard.py ``WAL_LIMIT``): a
batch of large rows makes the ``-wal`` file grow while it is written, but
once checkpointed the log is truncated back to at most ``WAL_LIMIT``
(``journal_size_limit``), and a log that readers kept from being reset is
truncated by the writers' periodic TRUNCATE checkpoint. Values large enough
for files (``LARGE_MIN``) never pass through the log at all.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.store.codec import LARGE_MIN

from .sqlite_helpers import cache_dir, make_cache, raw_shard, shard_files

__all__ = ["cache_dir", "make_cache"]  # fixtures used by the tests below

LIMIT = 4 * 1024 * 1024  # store/shard.py WAL_LIMIT


def wal_sizes(location: Path) -> list[int]:
    return [
        os.path.getsize(str(p) + "-wal")
        for p in shard_files(location)
        if os.path.exists(str(p) + "-wal")
    ]


def test_wal_shrinks_back_after_a_large_batch(
    make_cache: Callable[..., ShardedSQLiteCache], cache_dir: Path
) -> None:
    cache = make_cache({"SHARDS": 1, "MAX_ENTRIES": None})
    cache.set_many({f"k{i}": os.urandom(30_000) for i in range(400)})  # ~12 MB, one commit
    assert max(wal_sizes(cache_dir)) > 2 * LIMIT  # the premise: the log grew
    for i in range(20):
        cache.set(f"small{i}", i)
    assert max(wal_sizes(cache_dir)) <= LIMIT + 64 * 1024, wal_sizes(cache_dir)


def test_wal_held_open_by_a_reader_is_truncated_by_the_periodic_checkpoint(
    make_cache: Callable[..., ShardedSQLiteCache], cache_dir: Path
) -> None:
    cache = make_cache({"SHARDS": 1, "MAX_ENTRIES": None})
    cache.set("seed", 1)
    (path,) = shard_files(cache_dir)
    with raw_shard(path) as reader:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM cache").fetchone()  # holds a snapshot
        for i in range(300):
            cache.set(f"k{i}", os.urandom(30_000))
        assert max(wal_sizes(cache_dir)) > 2 * LIMIT  # nothing could be reset
        reader.execute("COMMIT")
    for i in range(600):  # past the next sweep of the shard (every 256th write)
        cache.set(f"small{i}", i)
    assert max(wal_sizes(cache_dir)) <= 2 * LIMIT, wal_sizes(cache_dir)


def test_wal_stays_bounded_while_large_values_are_written_and_replaced(
    make_cache: Callable[..., ShardedSQLiteCache], cache_dir: Path
) -> None:
    """150 MB of 1 MB values, replaced again and again, with row values between:
    the log never holds more than its bound plus the last commit."""
    cache = make_cache({"SHARDS": 1, "MAX_ENTRIES": None})
    peak = 0
    for i in range(150):
        cache.set(f"big{i % 30}", os.urandom(1_000_000))
        cache.set(f"row{i}", os.urandom(LARGE_MIN // 2))  # in the row: through the log
        peak = max(peak, *wal_sizes(cache_dir))
    files = [p for p in (cache_dir / "values").rglob("*") if p.is_file()]
    assert len(files) == 30  # the premise: the large values are in files, the old ones gone
    assert peak <= LIMIT + 64 * 1024, peak
