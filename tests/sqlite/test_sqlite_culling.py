"""Size bounds: MAX_ENTRIES / CULL_FREQUENCY across all shards, and SIZE_LIMIT.

Pinned (docs/architecture.md "Counting and culling across shards",
store/eviction.py): Django's documented culling, counted over all shards
together whatever their number: before a *new* key is stored into a cache
holding ``MAX_ENTRIES`` entries, expired entries go first, then
``entries // CULL_FREQUENCY`` of the oldest-written ones (all of them when
``CULL_FREQUENCY`` is 0). So the count never grows past ``MAX_ENTRIES``;
replacing an existing key culls nothing; ``MAX_ENTRIES: None`` never culls.
``SIZE_LIMIT`` bounds the stored bytes the same way, oldest first.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.serializers import TAG_SIZE
from djcachebench.store import eviction

from .helpers import shard_of

LIMIT = 30


def stored_bytes(cache: ShardedSQLiteCache) -> int:
    """Bytes stored across all shards, counted from the shards themselves."""
    return cache._store.culler.recount()[1]


@pytest.mark.parametrize("shards", [1, 8, 16])
@pytest.mark.parametrize("frequency", [2, 3, 10])
def test_count_never_passes_max_entries(
    make_cache: Callable[..., ShardedSQLiteCache], shards: int, frequency: int
) -> None:
    cache = make_cache({"SHARDS": shards, "MAX_ENTRIES": LIMIT, "CULL_FREQUENCY": frequency})
    for i in range(4 * LIMIT):
        cache.set(f"k{i}", i)
        count = cache.entry_count()
        assert count <= LIMIT, f"{count} entries after set #{i}"
        assert cache.get(f"k{i}") == i  # the key just written survives its own cull
    assert cache.stats()["culled"] > 0
    assert len({shard_of(cache, f"k{i}") for i in range(4 * LIMIT)}) == shards


@pytest.mark.parametrize("shards", [1, 8])
def test_cull_removes_the_oldest_written_across_shards(
    make_cache: Callable[..., ShardedSQLiteCache], shards: int
) -> None:
    cache = make_cache({"SHARDS": shards, "MAX_ENTRIES": LIMIT, "CULL_FREQUENCY": 3})
    for i in range(LIMIT):
        cache.set(f"k{i}", i)
    assert cache.entry_count() == LIMIT
    cache.set("new", "x")
    # 30 // 3 = 10 removed, then the new key stored.
    assert cache.entry_count() == LIMIT - LIMIT // 3 + 1
    assert cache.get_many([f"k{i}" for i in range(10)]) == {}
    assert cache.get_many([f"k{i}" for i in range(10, LIMIT)]) == {
        f"k{i}": i for i in range(10, LIMIT)
    }
    assert cache.stats()["culled"] == 10


def test_rewriting_a_key_makes_it_young_again(
    make_cache: Callable[..., ShardedSQLiteCache],
) -> None:
    """ "Oldest" means least recently written (reads never write)."""
    cache = make_cache({"MAX_ENTRIES": LIMIT, "CULL_FREQUENCY": 3})
    for i in range(LIMIT):
        cache.set(f"k{i}", i)
    cache.set("k0", "rewritten")
    cache.get("k1")  # a read does not protect k1
    cache.set("new", "x")
    assert cache.get("k0") == "rewritten"
    assert cache.get("k1") is None


def test_replacing_a_key_in_a_full_cache_culls_nothing(
    make_cache: Callable[..., ShardedSQLiteCache],
) -> None:
    cache = make_cache({"MAX_ENTRIES": LIMIT, "CULL_FREQUENCY": 3})
    for i in range(LIMIT):
        cache.set(f"k{i}", i)
    for i in range(LIMIT):
        cache.set(f"k{i}", -i)
    assert cache.entry_count() == LIMIT
    assert cache.stats()["culled"] == 0


@pytest.mark.parametrize("shards", [1, 8])
def test_cull_frequency_zero_empties_the_cache(
    make_cache: Callable[..., ShardedSQLiteCache], shards: int
) -> None:
    cache = make_cache({"SHARDS": shards, "MAX_ENTRIES": LIMIT, "CULL_FREQUENCY": 0})
    for i in range(LIMIT):
        cache.set(f"k{i}", i)
    cache.set("new", "x")
    assert cache.entry_count() == 1
    assert cache.get("new") == "x"
    assert cache.get_many([f"k{i}" for i in range(LIMIT)]) == {}


def test_expired_entries_are_culled_before_live_ones(
    make_cache: Callable[..., ShardedSQLiteCache],
) -> None:
    cache = make_cache({"MAX_ENTRIES": LIMIT, "CULL_FREQUENCY": 3})
    for i in range(10):
        cache.set(f"short{i}", i, timeout=0.2)
    for i in range(LIMIT - 10):
        cache.set(f"live{i}", i)
    time.sleep(0.5)
    cache.set("new", "x")
    # The 10 expired entries freed enough room: no live entry was culled.
    assert cache.get_many([f"live{i}" for i in range(LIMIT - 10)]) == {
        f"live{i}": i for i in range(LIMIT - 10)
    }
    assert cache.entry_count() == LIMIT - 10 + 1
    assert cache.stats()["expired_removed"] == 10


def test_expired_rows_are_swept_lazily_by_writes(
    make_cache: Callable[..., ShardedSQLiteCache],
) -> None:
    """Reads never write; expired rows leave the file as writes go on (every
    SWEEP_EVERY writes to a shard), so an unlimited cache does not fill up with them."""
    from djcachebench.store.core import SWEEP_EVERY

    cache = make_cache({"SHARDS": 1, "MAX_ENTRIES": None})
    cache.set_many({f"short{i}": i for i in range(10)}, timeout=0.2)
    time.sleep(0.5)
    assert cache.get("short0") is None
    assert cache.entry_count() == 10  # a miss, but still on disk
    for i in range(SWEEP_EVERY):
        cache.set(f"live{i % 50}", i)
    assert cache.entry_count() == 50
    assert cache.stats()["expired_removed"] == 10


def test_a_sweep_that_finds_many_expired_rows_goes_on(
    make_cache: Callable[..., ShardedSQLiteCache],
) -> None:
    """One batch of SWEEP_LIMIT rows per SWEEP_EVERY writes checks one row per
    write, and unique keys that expire add one: without a count limit expired
    rows would grow without bound. A batch mostly expired is followed by the
    next (one batch alone would remove 256, not 1,024)."""
    from djcachebench.store.core import SWEEP_BATCHES, SWEEP_EVERY, SWEEP_LIMIT

    cache = make_cache({"SHARDS": 1, "MAX_ENTRIES": None})
    cache.set_many({f"old{i:05d}": i for i in range(3000)}, timeout=0.2)
    time.sleep(0.5)
    for i in range(SWEEP_EVERY - 1):  # the set_many counted as one write
        cache.set(f"z{i}", i)  # after the old keys: the sweep goes in key order
    assert cache.stats()["expired_removed"] == SWEEP_BATCHES * SWEEP_LIMIT
    # The next trigger goes on from there: the whole backlog goes in a few.
    for _ in range(2):
        for i in range(SWEEP_EVERY):
            cache.set(f"z{i}", i)
    assert cache.stats()["expired_removed"] == 3000
    assert cache.entry_count() == SWEEP_EVERY


def test_set_many_and_add_respect_max_entries(
    make_cache: Callable[..., ShardedSQLiteCache],
) -> None:
    cache = make_cache({"MAX_ENTRIES": LIMIT, "CULL_FREQUENCY": 3})
    assert cache.set_many({f"k{i}": i for i in range(100)}) == []
    assert cache.entry_count() <= LIMIT
    assert cache.get("k99") == 99  # as a loop of set(): the last one stays
    for i in range(100):
        assert cache.add(f"a{i}", i) is True
        assert cache.entry_count() <= LIMIT
    assert cache.get("a99") == 99


def test_default_max_entries_is_djangos_300(make_cache: Callable[..., ShardedSQLiteCache]) -> None:
    cache = make_cache()
    cache.set_many({f"k{i}": i for i in range(400)})
    assert 0 < cache.entry_count() <= 300


def test_max_entries_none_is_unlimited(make_cache: Callable[..., ShardedSQLiteCache]) -> None:
    cache = make_cache({"MAX_ENTRIES": None})
    data = {f"k{i}": i for i in range(1500)}
    cache.set_many(dict(list(data.items())[:1000]))
    for key, value in list(data.items())[1000:]:
        cache.set(key, value)
    assert cache.entry_count() == 1500
    assert cache.get_many(list(data)) == data
    assert cache.stats()["culled"] == 0


# -- SIZE_LIMIT ------------------------------------------------------------------


@pytest.mark.parametrize("shards", [1, 8])
def test_size_limit_bounds_the_stored_bytes(
    make_cache: Callable[..., ShardedSQLiteCache], shards: int
) -> None:
    limit = 20_000
    cache = make_cache({"SHARDS": shards, "MAX_ENTRIES": None, "SIZE_LIMIT": limit})
    for i in range(200):
        cache.set(f"k{i}", "v" * 500 + str(i))
        assert stored_bytes(cache) <= limit, f"after set #{i}"
        assert cache.get(f"k{i}") == "v" * 500 + str(i)
    assert cache.stats()["culled"] > 0
    # Roughly limit / ~550 bytes per entry remain; the oldest went first.
    assert 10 <= cache.entry_count() <= limit // 500
    assert cache.get("k0") is None


def test_size_limit_with_set_many(make_cache: Callable[..., ShardedSQLiteCache]) -> None:
    limit = 20_000
    cache = make_cache({"MAX_ENTRIES": None, "SIZE_LIMIT": limit})
    cache.set_many({f"k{i}": "v" * 500 for i in range(200)})
    assert stored_bytes(cache) <= limit
    assert cache.get("k199") == "v" * 500


def test_size_limit_counts_integers_too(make_cache: Callable[..., ShardedSQLiteCache]) -> None:
    cache = make_cache({"MAX_ENTRIES": None, "SIZE_LIMIT": 800})
    for i in range(500):
        cache.set(f"n{i}", i)
    assert stored_bytes(cache) <= 800
    assert cache.entry_count() <= 100


def summed_sizes(cache: ShardedSQLiteCache) -> int:
    """Bytes stored, summed row by row (what the shards' byte totals must equal)."""
    store = cache._store
    return sum(
        store.pool.get(i).execute("SELECT coalesce(sum(size), 0) FROM cache").fetchone()[0]
        for i in range(store.n)
    )


def test_size_limit_makes_byte_totals_exact_where_another_cache_left_them_loose(
    make_cache: Callable[..., ShardedSQLiteCache],
) -> None:
    """Without SIZE_LIMIT, replacing writes do not update the byte totals (shard.py):
    a cache with SIZE_LIMIT on the same directory must recount them, and from then
    on every writer's replacements are counted, its own and the other cache's."""
    plain = make_cache({"MAX_ENTRIES": None})
    for i in range(100):
        plain.set(f"k{i}", "a" * 10)
    for i in range(100):
        plain.set(f"k{i}", "b" * 300)
    assert stored_bytes(plain) != summed_sizes(plain), "premise: replacements untracked"
    limited = make_cache({"MAX_ENTRIES": None, "SIZE_LIMIT": 10**6})
    assert stored_bytes(limited) == summed_sizes(limited)
    for i in range(100):
        plain.set(f"k{i}", "c" * (i + 1))
        limited.set(f"k{i + 50}", "d" * 7)
    assert stored_bytes(limited) == summed_sizes(limited)
    assert limited.stats()["culled"] == 0


def test_a_large_cull_is_spread_over_later_inserts_in_bounded_batches(
    make_cache: Callable[..., ShardedSQLiteCache],
) -> None:
    """Regression: a cull used to remove ``entries // CULL_FREQUENCY`` rows inside the
    one set that triggered it (seconds at a million entries). Now no set removes more
    than a batch (eviction.CULL_BATCH); the rest is debt paid by the next inserts,
    the count never passes MAX_ENTRIES + 1, and the whole cull is done in the end,
    oldest first."""
    from djcachebench.store import eviction

    batch = getattr(eviction, "CULL_BATCH", 128)
    limit = 3000
    cache = make_cache({"MAX_ENTRIES": limit, "CULL_FREQUENCY": 2, "SHARDS": 4})
    cache.set_many({f"old{i}": i for i in range(limit - 100)})
    for i in range(100):
        cache.set(f"fill{i}", i)
    store = cache._store
    assert store.counts.total()[0] == limit
    largest_drop = 0
    before = limit
    for i in range(40):
        cache.set(f"new{i}", i)
        now = store.counts.total()[0]
        largest_drop = max(largest_drop, before + 1 - now)
        assert now <= limit + 1
        before = now
    assert largest_drop <= batch, largest_drop
    for i in range(2000):  # pays off the debt, and the culls after it
        cache.set(f"more{i}", i)
        assert store.counts.total()[0] <= limit + 1
    # Oldest first: the first keys written are gone, the last ones are there.
    assert cache.get_many([f"old{i}" for i in range(50)]) == {}
    assert cache.get("more1999") == 1999


def has_stored_index(cache: ShardedSQLiteCache) -> list[bool]:
    """Per shard: does it have the index on write order?"""
    from .helpers import raw_shard, shard_files

    found = []
    for path in shard_files(cache._store.directory):
        with raw_shard(path) as conn:
            found.append(
                bool(
                    conn.execute(
                        "SELECT count(*) FROM sqlite_master WHERE name = 'cache_stored'"
                    ).fetchone()[0]
                )
            )
    return found


@pytest.mark.parametrize(
    ("options", "indexed"),
    [
        ({"MAX_ENTRIES": 300}, False),
        ({"MAX_ENTRIES": None}, False),
        ({"MAX_ENTRIES": 1_000_000}, True),
        ({"MAX_ENTRIES": None, "SIZE_LIMIT": 10**9}, True),
    ],
    ids=["small", "unlimited", "large", "size-limit"],
)
def test_only_a_cache_that_may_cull_many_entries_indexes_write_order(
    make_cache: Callable[..., ShardedSQLiteCache], options: dict, indexed: bool
) -> None:
    """Regression: every shard had an index on ``stored``, which costs each
    replacing set two more pages (half again its time) even where culling never
    needs more than a scan of a few thousand rows (eviction.SMALL_CACHE)."""
    cache = make_cache({"SHARDS": 2, **options})
    cache.set("k", 1)
    assert has_stored_index(cache) == [indexed, indexed]


def test_a_cull_of_a_large_cache_without_the_index_creates_it(
    make_cache: Callable[..., ShardedSQLiteCache],
) -> None:
    """Shards written without a limit, then culled by a process whose limit is small
    but whose cache is large: the cull indexes them, so that later culls walk the
    index instead of scanning and sorting every shard."""
    from djcachebench.store.eviction import SMALL_CACHE

    filler = make_cache({"SHARDS": 2, "MAX_ENTRIES": None})
    filler.set_many({f"k{i}": i for i in range(SMALL_CACHE + 100)})
    assert has_stored_index(filler) == [False, False]
    culling = make_cache({"SHARDS": 2, "MAX_ENTRIES": 300, "CULL_FREQUENCY": 2})
    culling.set("new", 1)
    assert has_stored_index(culling) == [True, True]
    assert culling.get_many(["k0", "k1", "k2"]) == {}  # the oldest went first
    assert culling.get("new") == 1


def test_deletes_leave_the_shared_counts_high_until_a_recount(
    make_cache: Callable[..., ShardedSQLiteCache],
) -> None:
    """Culling decides on the shared copy of the counts, so it must never be
    below the shards' own: a delete lowers it only when a write that adds to its
    shard copies the shard's counts again, or a recount (every cull) does."""
    cache = make_cache({"SHARDS": 2, "MAX_ENTRIES": None, "SIZE_LIMIT": 10**9})
    for i in range(20):
        cache.set(f"k{i}", b"x" * (i + 1))
    all_sizes = [i + 1 + TAG_SIZE for i in range(20)]
    store = cache._store
    assert store.counts.total() == (20, sum(all_sizes))
    for i in range(0, 20, 3):
        assert cache.delete(f"k{i}")
    assert not cache.delete("k0")
    kept = [size for i, size in enumerate(all_sizes) if i % 3]
    assert store.counts.total() == (20, sum(all_sizes))  # high, never low
    assert store.culler.recount() == (len(kept), sum(kept))
    assert store.counts.total() == (len(kept), sum(kept))


def _held_write(cache: ShardedSQLiteCache, index: int, sql: str, params: tuple) -> Iterator[None]:
    conn = cache._store.pool.get(index)
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(sql, params)
        yield
    finally:
        conn.execute("COMMIT")


def test_an_insert_copies_its_counts_under_the_shard_lock_and_a_removal_after_its_commit(
    make_cache: Callable[..., ShardedSQLiteCache],
) -> None:
    """The shared counts are copied in the order the shard's lock gives the
    writes: an insert copies the count it leaves inside its transaction (at
    worst ahead of the commit), a removal none before its commit (the lower
    count would let writers pass the limit while its rows are still there).
    Copied after the commit, an insert's copy could land after a later
    writer's and put back an older, lower count: with 6 writer processes on a
    loaded machine the count passed the documented bound by up to 4."""
    from djcachebench.store.statements import SQL_DELETE, SQL_UPSERT

    cache = make_cache({"SHARDS": 1, "MAX_ENTRIES": 1000})
    cache.set("a", 1)
    store = cache._store
    assert store.counts.total()[0] == 1
    with contextlib.contextmanager(_held_write)(
            cache, 0, SQL_UPSERT, ("b", None, time.time_ns(), 1, b"x", 1)):
        assert store.counts.total()[0] == 2  # copied before the commit
    with contextlib.contextmanager(_held_write)(cache, 0, SQL_DELETE, ("b",)):
        assert store.counts.total()[0] == 2  # not before the commit
    store.culler.copy_after_removal(0)
    assert store.counts.total()[0] == 1


def _committed(cache: ShardedSQLiteCache) -> tuple[int, int]:
    store = cache._store
    rows = [store.pool.get(i).execute("SELECT entries, bytes FROM meta").fetchone()
            for i in range(store.n)]
    return sum(r[0] for r in rows), sum(r[1] for r in rows)


def test_a_cache_opened_during_an_insert_does_not_lower_the_copy(
    make_cache: Callable[..., ShardedSQLiteCache],
) -> None:
    """Opening a cache copies the shards' counts only where the copy is lower
    than them, and then under the shard's lock: a copy of what it read without
    the lock could be older than an insert committing meanwhile (every new
    cache object did it; Django makes one per thread)."""
    from djcachebench.store.statements import SQL_UPSERT

    cache = make_cache({"SHARDS": 1, "MAX_ENTRIES": 1000})
    cache.set("a", 1)
    with contextlib.contextmanager(_held_write)(
            cache, 0, SQL_UPSERT, ("b", None, time.time_ns(), 1, b"x", 1)):
        make_cache({"SHARDS": 1, "MAX_ENTRIES": 1000})  # opens while "b" commits
    assert cache._store.counts.total() == _committed(cache)


def test_a_process_without_size_limit_copies_the_bytes_its_replacements_add(
    make_cache: Callable[..., ShardedSQLiteCache],
) -> None:
    """Another process's SIZE_LIMIT decides on the copied byte total: a cache
    without SIZE_LIMIT that makes values larger must copy it too (it did not,
    and the cache with the limit never culled, at 8 times its limit)."""
    limited = make_cache({"SHARDS": 2, "SIZE_LIMIT": 100_000, "MAX_ENTRIES": None})
    for i in range(40):
        limited.set(f"k{i}", b"x")
    unlimited = make_cache({"SHARDS": 2, "MAX_ENTRIES": None})
    for i in range(40):
        unlimited.set(f"k{i}", b"x" * 20_000)
    assert limited._store.counts.total() == _committed(limited)
    for i in range(40):
        limited.set(f"k{i}", b"x" * 20_000)
    assert _committed(limited)[1] <= 1.2 * 100_000 + 20_100


def test_a_delete_in_a_full_cache_copies_its_lower_count(
    make_cache: Callable[..., ShardedSQLiteCache],
) -> None:
    """In a cache at its limit, a delete copies its shard's lower count (under
    the lock): left high, the next insert would recount every shard and remove
    nothing."""
    cache = make_cache({"SHARDS": 2, "MAX_ENTRIES": 10})
    for i in range(10):
        cache.set(f"k{i}", i)
    assert cache._store.counts.total()[0] == 10
    assert cache.delete("k3")
    assert cache._store.counts.total()[0] == 9
    cache.set("k3", 3)
    cache.delete_many(["k4", "k5"])
    assert cache._store.counts.total()[0] == 8
    cache.set("new", 1)  # below the limit: culls nothing
    assert cache.get_many([f"k{i}" for i in range(10)] + ["new"]) == {
        **{f"k{i}": i for i in range(10) if i not in (4, 5)}, "new": 1}


@pytest.mark.parametrize("emptied_by", ["clear", "delete_many"])
def test_an_outstanding_cull_removes_nothing_from_a_cache_below_its_limit(
    make_cache: Callable[..., ShardedSQLiteCache], emptied_by: str
) -> None:
    """A cull larger than one batch leaves debt; entries that go another way
    (``clear()``, deletes) pay it too. Paid in full regardless, the debt removed
    keys written afterwards from a cache far below MAX_ENTRIES."""
    batch = getattr(eviction, "CULL_BATCH", 128)
    limit = 4 * batch + 88
    cache = make_cache({"SHARDS": 4, "MAX_ENTRIES": limit, "CULL_FREQUENCY": 2})
    for i in range(limit + 1):
        cache.set(f"old{i}", i)
    # Premise: half the cache is owed, one batch paid, more than a batch left.
    assert cache._store.counts.debt() > batch
    if emptied_by == "clear":
        cache.clear()
    else:
        cache.delete_many([f"old{i}" for i in range(limit + 1)])
    assert cache.set_many({f"new{i}": i for i in range(100)}) == []
    cache.set("one_more", 1)
    missing = [i for i in range(100) if cache.get(f"new{i}") != i]
    assert missing == [], f"{len(missing)} of 100 fresh keys culled below MAX_ENTRIES={limit}"


@pytest.mark.parametrize("odd", ["directory", "dangling-link"])
def test_a_cull_lock_that_is_not_a_file_fails_no_write_and_culling_goes_on(
    make_cache: Callable[..., ShardedSQLiteCache], cache_dir: Path, odd: str
) -> None:
    """``cull.lock`` replaced by a directory must not make every insert into a full
    cache raise IsADirectoryError (after its row was written), nor stop culling
    for good: it is moved aside and made again."""
    cache = make_cache({"SHARDS": 2, "MAX_ENTRIES": 5})
    for i in range(5):
        cache.set(f"k{i}", i)
    lock = cache_dir / "cull.lock"
    lock.unlink(missing_ok=True)
    if odd == "directory":
        lock.mkdir()
    else:
        lock.symlink_to(cache_dir / "no-such-dir" / "lock")
    for i in range(10):
        cache.set(f"new{i}", i)  # raised on the code before
        assert cache.get(f"new{i}") == i
    assert cache.add("added", 1) is True
    assert cache.entry_count() <= 5
    assert list(cache_dir.glob("cull.lock.corrupt-*"))


@contextlib.contextmanager
def _cull_lock_held(cache_dir: Path) -> Iterator[None]:
    """``cull.lock`` held as a culler that never finishes holds it (a process
    stopped in its cull): a lock on another open file description."""
    fd = os.open(cache_dir / "cull.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def test_a_cull_that_does_not_finish_does_not_lift_size_limit(
    make_cache: Callable[..., ShardedSQLiteCache], cache_dir: Path
) -> None:
    """A process stopped in its cull (holding ``cull.lock``) must not let every
    other process write as if there were no SIZE_LIMIT. Writers wait for a cull
    once the cache is one cull's worth (a tenth of the limit) over it, and past
    two they cull without the lock."""
    limit, value = 200_000, 10_000
    cache = make_cache({"SHARDS": 2, "MAX_ENTRIES": None, "SIZE_LIMIT": limit,
                        "LOCK_TIMEOUT": 0.02, "RETRIES": 0})
    most = 0
    with _cull_lock_held(cache_dir):
        for i in range(100):
            cache.set(f"k{i}", bytes([i]) * value)
            most = max(most, stored_bytes(cache))
            assert cache.get(f"k{i}") == bytes([i]) * value  # the new key always stays
    assert most <= limit * 1.2 + value + TAG_SIZE, most
    assert stored_bytes(cache) <= limit * 1.2 + value + TAG_SIZE


def test_a_set_many_waits_for_a_cull_within_one_call_budget(
    make_cache: Callable[..., ShardedSQLiteCache], cache_dir: Path
) -> None:
    """Behind a cull that does not finish, a ``set_many`` into a cache one cull's
    worth over MAX_ENTRIES waits for the cull lock within the one budget every
    call's waits share (settings.md, ``RETRIES``), not LOCK_TIMEOUT after each
    of its keys."""
    make_cache({"SHARDS": 2, "MAX_ENTRIES": None}).set_many({f"old{i}": i for i in range(140)})
    cache = make_cache({"SHARDS": 2, "MAX_ENTRIES": 100, "CULL_FREQUENCY": 3,
                        "LOCK_TIMEOUT": 0.1, "RETRIES": 1})
    bound = cache._store.policy.worst_case()
    with _cull_lock_held(cache_dir):
        started = time.monotonic()
        assert cache.set_many({f"new{i}": i for i in range(20)}) == []
        took = time.monotonic() - started
    assert took < bound + 0.5, (took, bound)  # 20 waits of 0.1 s before
    assert cache.get_many([f"new{i}" for i in range(20)]) == {f"new{i}": i for i in range(20)}
