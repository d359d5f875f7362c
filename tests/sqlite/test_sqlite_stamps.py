"""Every acknowledged mutation through a ShardedSQLiteCache alias stamps the key.

Pinned (docs/architecture.md "Coherence hook", store/core.py): once a
TieredCache watches ``LOCATION/generations.mmap``, each write made directly
through the SQLite alias changes the key's token, *including a delete that
finds nothing*. Why that matters: writer B's delete may have committed but not
yet stamped when C's delete of the same key finds no row and returns; C's call
is acknowledged, so from then on no L1 may serve the old value, and only C's
own stamp can guarantee it. A shard file quarantined as corrupt changes every
value it held at once: the table's epoch moves, so no L1 entry read before
stays servable.

The tokens are read from the table itself (``GenerationTable.token``), as a
TieredCache reader takes them; the unstamped delete of writer B is played by a
plain sqlite3 connection.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache

from .helpers import raw_shard, shard_path


def token(cache: ShardedSQLiteCache, key: str) -> tuple[int, int, int]:
    """The coherence token of Django key ``key`` as a reader would take it."""
    return cache.coherence_table.token(cache.make_key(key))


def epoch(cache: ShardedSQLiteCache) -> int:
    return token(cache, "any")[1]


def test_delete_of_an_absent_key_stamps_once_watched(cache: ShardedSQLiteCache) -> None:
    cache.coherence_table.watch()
    before = token(cache, "never-set")
    assert cache.delete("never-set") is False
    assert token(cache, "never-set") != before


def test_delete_racing_an_unstamped_delete_still_stamps(cache: ShardedSQLiteCache) -> None:
    """B's delete committed without its stamp; C's delete finds nothing and returns:
    the token a reader took before must no longer be current."""
    cache.coherence_table.watch()
    cache.set("k", "old")
    reader_token = token(cache, "k")  # a reader's L1 holds "old" under this token
    with raw_shard(shard_path(cache, "k")) as conn:  # writer B: committed, not stamped
        assert conn.execute("DELETE FROM cache WHERE key = ?",
                            (cache.make_key("k"),)).rowcount == 1
    assert cache.delete("k") is False  # writer C, acknowledged
    assert token(cache, "k") != reader_token


def test_delete_many_stamps_absent_keys_too(cache: ShardedSQLiteCache) -> None:
    cache.coherence_table.watch()
    cache.set("present", 1)
    keys = ["present", "absent-1", "absent-2"]
    before = {k: token(cache, k) for k in keys}
    cache.delete_many(keys)
    assert all(token(cache, k) != before[k] for k in keys)


def test_set_with_timeout_zero_on_an_absent_key_stamps(cache: ShardedSQLiteCache) -> None:
    """``set(k, v, 0)`` is a delete (Django: nothing is stored): stamped like one."""
    cache.coherence_table.watch()
    before = token(cache, "zero")
    cache.set("zero", "v", timeout=0)
    assert token(cache, "zero") != before


def test_no_stamp_while_nobody_watches(cache: ShardedSQLiteCache) -> None:
    """Today's rule is kept: stamps cost a third of a write and are skipped until
    a reader declared itself (``watch``)."""
    before = token(cache, "never-set")
    assert cache.delete("never-set") is False
    assert token(cache, "never-set") == before


def test_quarantined_shard_moves_the_epoch(
    make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    cache = make_cache({"SHARDS": 2})
    cache.set("k", "v" * 300)
    path = shard_path(cache, "k")
    cache.close_connections()  # the WAL is checkpointed away: the file is the data
    before = epoch(cache)
    with open(path, "r+b") as f:
        f.write(os.urandom(4096))
    assert cache.get("k") is None
    assert cache.stats()["corruptions"] == 1
    assert epoch(cache) != before


@pytest.mark.parametrize("call", ["delete", "delete_many"])
def test_delete_that_gives_up_on_a_busy_shard_still_stamps(
    make_cache: Callable[..., ShardedSQLiteCache], call: str
) -> None:
    """A give-up returns what "found nothing" returns (False, or nothing for
    delete_many): the caller cannot tell them apart, so it stamps the same."""
    cache = make_cache({"LOCK_TIMEOUT": 0.05, "RETRIES": 0})
    cache.coherence_table.watch()
    cache.set("k", "old")
    before = token(cache, "k")
    with raw_shard(shard_path(cache, "k")) as holder:
        holder.execute("BEGIN IMMEDIATE")  # another writer holds the shard
        if call == "delete":
            assert cache.delete("k") is False
        else:
            cache.delete_many(["k"])
        holder.execute("ROLLBACK")
    assert cache.stats()["give_ups"] == 1
    assert token(cache, "k") != before
