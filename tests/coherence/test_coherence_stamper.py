"""The engine stamper: marks inside the write transaction, stamps after it.

What it must guarantee (coherence/stamper.py): every change the engine makes to
a key moves the slot's mark inside its transaction and its stamp after the
commit; a writer keeps its own value only under the pair its write left, so a
writer whose post-commit stamp lands *after* a later write's can never serve its
older value; the board never serves a value the slot's pair does not vouch for.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.backends.tiered import TieredCache
from djcachebench.coherence.layout import U64
from tests.tiered.helpers import SQLITE, sqlite_tiered


def _pair(cache: TieredCache, key: str) -> tuple[int, int]:
    table = cache.generation_table
    return table.read_at(table.locate(cache.l2.make_key(key)))[2]


def _late_stamp(cache: TieredCache, key: str, stamp: int) -> None:
    """Store ``stamp`` into the key's slot, as a writer descheduled between its
    commit and its stamp would, after every later write's stamp."""
    table = cache.generation_table
    U64.pack_into(table.buffer, table.locate(cache.l2.make_key(key)), stamp)


def _plain(tmp_path: Path, **options: object) -> ShardedSQLiteCache:
    """Another process's plain ShardedSQLiteCache on the same directory."""
    return ShardedSQLiteCache(str(tmp_path / "sqlite"), {"OPTIONS": dict(options)})


@pytest.fixture
def pair(tmp_path: Path) -> tuple[TieredCache, TieredCache]:
    first = sqlite_tiered(tmp_path, L1_MAX_ENTRIES=1000)
    second = sqlite_tiered(tmp_path, L1_MAX_ENTRIES=1001)  # another L1: another process
    first.get("warm")  # watched
    return first, second


def test_a_late_stamp_cannot_revive_the_writers_older_value(
        pair: tuple[TieredCache, TieredCache]) -> None:
    a, b = pair
    a.set("k", "old")
    stamp_a = _pair(a, "k")[0]
    assert a.get("k") == "old" and a.stats()["l1_hits"] == 1  # kept by the writer
    b.set("k", "new")  # a later write, acknowledged
    _late_stamp(a, "k", stamp_a)  # a's stamp lands last: the stamp word is a's again
    assert a.get("k") == "new"  # the mark moved in b's transaction: a's copy is dead
    assert a.get("k") == "new"
    assert b.get("k") == "new"


def test_a_late_stamp_cannot_make_the_board_serve_an_older_value(tmp_path: Path) -> None:
    a = sqlite_tiered(tmp_path, L1_MAX_ENTRIES=1000)
    b = sqlite_tiered(tmp_path, L1_MAX_ENTRIES=1001)
    c = sqlite_tiered(tmp_path, L1_MAX_ENTRIES=1002)
    a.set("k", "v0")
    assert c.get("k") == "v0" and c.get("k") == "v0"  # c holds an entry
    a.set("k", "old")  # published on the board under a's pair
    stamp_a = _pair(a, "k")[0]
    b.set("k", {"new": 1})  # not a value the board carries: a's stays on it
    _late_stamp(a, "k", stamp_a)
    assert c.get("k") == {"new": 1}
    assert a.get("k") == {"new": 1}


def test_every_kind_of_change_moves_the_mark(tmp_path: Path) -> None:
    """Including those made by a plain ShardedSQLiteCache, culling and expiry."""
    tiered = sqlite_tiered(tmp_path)
    tiered.get("warm")
    plain = _plain(tmp_path)
    culling = _plain(tmp_path, MAX_ENTRIES=5, CULL_FREQUENCY=2)

    def moved(key: str, change: object) -> bool:
        before = _pair(tiered, key)[1]
        change()  # type: ignore[operator]
        return _pair(tiered, key)[1] != before

    plain.set("n", 1)
    assert moved("n", lambda: plain.set("n", 2))
    assert moved("n", lambda: plain.incr("n"))
    assert moved("n", lambda: plain.touch("n", 100))
    assert moved("n", lambda: plain.delete("n"))
    assert moved("a", lambda: plain.add("a", 1))
    assert not moved("a", lambda: plain.add("a", 2))  # refused: nothing changed
    assert moved("m", lambda: plain.set_many({"m": 1, "x": 2}))
    assert moved("m", lambda: plain.delete_many(["m"]))
    plain.set("gone", 1, 0.05)
    time.sleep(0.1)
    store = plain._store
    index = store.route(plain.make_key("gone"))
    assert moved("gone", lambda: store.run(index, store._sweep, index))  # expiry removal
    for i in range(10):
        culling.set(f"c{i}", i)
    culled = [f"c{i}" for i in range(10) if culling.get(f"c{i}") is None]
    assert culled  # culling removed some: their marks moved when they went
    for key in culled:
        assert _pair(tiered, key)[1] != 0


def test_a_plain_writer_and_a_late_stamp_still_end_the_writers_copy(
        tmp_path: Path) -> None:
    writer = sqlite_tiered(tmp_path)
    writer.set("k", "mine")
    stamp = _pair(writer, "k")[0]
    assert writer.get("k") == "mine"
    _plain(tmp_path).delete("k")
    _late_stamp(writer, "k", stamp)
    assert writer.get("k") is None


def test_the_board_is_written_only_when_every_key_of_a_slot_is_in_one_shard(
        tmp_path: Path) -> None:
    """Board publishes are serialised by the shard's write lock: with a slot
    count that is not a multiple of the shard count, nothing is published (the
    writer still keeps its own value)."""
    aligned = TieredCache("", {"OPTIONS": {"L2": {
        "BACKEND": SQLITE, "LOCATION": str(tmp_path / "a"), "OPTIONS": {"SHARDS": 3}}}})
    assert aligned.generation_table.slots % 3 == 0
    assert aligned.l2.coherence_stamper.aligned
    aligned.set("k", "v")
    assert aligned.stats()["published"] == 1
    (tmp_path / "b").mkdir(mode=0o700)
    from djcachebench.coherence import open_table

    open_table(str(tmp_path / "b" / "generations.mmap"), slots=1000)  # made by someone else
    odd = TieredCache("", {"OPTIONS": {"L2": {
        "BACKEND": SQLITE, "LOCATION": str(tmp_path / "b"), "OPTIONS": {"SHARDS": 3}}}})
    assert odd.generation_table.slots == 1000 and not odd.l2.coherence_stamper.aligned
    odd.set("k", "v")
    assert odd.stats()["published"] == 0
    assert odd.get("k") == "v" and odd.stats()["l1_hits"] == 1


def test_a_failed_write_keeps_nothing_and_a_refused_add_keeps_nothing(
        tmp_path: Path) -> None:
    cache = sqlite_tiered(tmp_path)
    cache.set("k", "first")
    assert not cache.add("k", "second")
    assert cache.get("k") == "first"
    cache.delete("k")
    with pytest.raises(ValueError):
        cache.incr("k-not-there-either")
    assert cache.get("k") is None


def test_an_adapter_may_not_stamp_a_table_an_engine_stamps(tmp_path: Path) -> None:
    from django.core.exceptions import ImproperlyConfigured

    sqlite_tiered(tmp_path).get("k")
    with pytest.raises(ImproperlyConfigured, match="GENERATION_PATH"):
        TieredCache("", {"OPTIONS": {
            "L2": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
            "GENERATION_PATH": str(tmp_path / "sqlite" / "generations.mmap")}})


def test_touch_and_incr_that_find_nothing_still_stamp(tmp_path: Path) -> None:
    """The stress test's "regressed" reads: a touch or incr told "absent" while a
    delete had committed but not yet stamped, and a later read took the old value
    from an L1. Reporting absence is acknowledging it: the key is stamped."""
    cache = sqlite_tiered(tmp_path)
    l2, table = cache.l2, cache.generation_table
    before = table.token(l2.make_key("gone"))
    assert l2.touch("gone", 10) is False
    after_touch = table.token(l2.make_key("gone"))
    assert after_touch != before
    with pytest.raises(ValueError):
        l2.incr("gone")
    assert table.token(l2.make_key("gone")) != after_touch
