"""TieredCache behaviour in one process: what each operation does to the L1."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from django.core.cache.backends.locmem import LocMemCache

from djcachebench.backends import tiered as tiered_backend
from djcachebench.backends.tiered import TieredCache
from tests.tiered.helpers import locmem_tiered, sqlite_tiered


@pytest.fixture(params=["locmem", "sqlite"])
def cache(request: pytest.FixtureRequest, tmp_path: Path) -> TieredCache:
    if request.param == "locmem":
        return locmem_tiered(tmp_path)
    return sqlite_tiered(tmp_path)


@pytest.fixture
def other(cache: TieredCache, tmp_path: Path) -> TieredCache:
    """Another L1 over the same L2 and table: a second process, in one."""
    if isinstance(cache.l2, LocMemCache):
        return locmem_tiered(tmp_path, L1_MAX_ENTRIES=9999)
    return sqlite_tiered(tmp_path, L1_MAX_ENTRIES=9999)


def hits(c: TieredCache) -> tuple[int, int, int]:
    s = c.stats()
    return s["l1_hits"], s["l2_hits"], s["misses"]


def test_a_reader_fills_its_l1_from_the_l2(cache: TieredCache, other: TieredCache) -> None:
    other.set("k", b"value")
    assert hits(cache) == (0, 0, 0)
    assert cache.get("k") == b"value"
    assert hits(cache) == (0, 1, 0)
    assert cache.get("k") == b"value"
    assert hits(cache) == (1, 1, 0)


def test_the_writer_keeps_what_it_wrote(cache: TieredCache) -> None:
    # Over a ShardedSQLiteCache, only once it stamps its own culls.
    wrote_through = isinstance(cache.l2, LocMemCache) or cache.l2.coherence_table is not None
    assert cache.write_through is wrote_through
    cache.set("k", b"value")
    assert cache.get("k") == b"value"
    assert hits(cache) == ((1, 0, 0) if wrote_through else (0, 1, 0))
    assert cache.add("new", "added") is True
    assert cache.get("new") == "added"
    assert hits(cache) == ((2, 0, 0) if wrote_through else (0, 2, 0))


def test_absence_is_remembered_until_a_write(cache: TieredCache, other: TieredCache) -> None:
    assert cache.get("absent", "dflt") == "dflt"
    assert cache.get("absent", "dflt") == "dflt"
    assert not cache.has_key("absent")
    s = cache.stats()
    assert (s["l2_misses"], s["l1_misses"], s["misses"]) == (1, 1, 2)
    other.set("absent", "here now")
    assert cache.get("absent") == "here now"


def test_every_write_drops_the_l1_entry(cache: TieredCache) -> None:
    def warm(key: str) -> None:
        cache.get(key)
        before = cache.stats()["l1_hits"]
        cache.get(key)
        assert cache.stats()["l1_hits"] == before + 1, "entry should be in L1 now"

    cache.set("k", 1)
    warm("k")
    cache.set("k", 2)
    assert cache.get("k") == 2
    warm("k")
    cache.incr("k", 5)
    assert cache.get("k") == 7
    warm("k")
    cache.decr("k")
    assert cache.get("k") == 6
    warm("k")
    assert cache.add("k", 99) is False
    assert cache.get("k") == 6
    warm("k")
    cache.set_many({"k": "many", "other": 1})
    assert cache.get_many(["k", "other"]) == {"k": "many", "other": 1}
    warm("k")
    assert cache.delete("k") is True
    assert cache.get("k") is None
    cache.set("k", "back")
    warm("k")
    cache.delete_many(["k"])
    assert cache.get("k") is None
    cache.set("k", "again")
    warm("k")
    cache.clear()
    assert cache.get("k") is None and cache.get("other") is None


def test_get_many_mixes_l1_and_l2(cache: TieredCache) -> None:
    cache.set_many({"a": 1, "b": 2, "c": 3})
    assert cache.get("a") == 1  # a now in L1
    assert cache.get_many(["a", "b", "c", "zz"]) == {"a": 1, "b": 2, "c": 3}
    assert hits(cache) == (1, 3, 1)
    assert cache.get_many(["a", "b", "c"]) == {"a": 1, "b": 2, "c": 3}
    assert hits(cache) == (4, 3, 1)


def test_has_key_answers_from_l1(cache: TieredCache) -> None:
    cache.set("k", "v")
    cache.get("k")
    assert cache.has_key("k") and "k" in cache
    cache.delete("k")
    assert not cache.has_key("k")


def test_versions_are_separate_entries(cache: TieredCache) -> None:
    cache.set("k", "v1")
    cache.set("k", "v2", version=2)
    assert cache.get("k") == "v1" and cache.get("k", version=2) == "v2"
    assert cache.get("k", version=1) == "v1"  # same entry as version=None
    assert cache.incr_version("k") == 2
    assert cache.get("k") is None
    assert cache.get("k", version=2) == "v1"
    assert cache.decr_version("k", version=2) == 1
    assert cache.get("k") == "v1" and cache.get("k", version=2) is None


def test_get_or_set(cache: TieredCache) -> None:
    assert cache.get_or_set("k", lambda: [1, 2]) == [1, 2]
    assert cache.get_or_set("k", "other") == [1, 2]


def test_keys_are_the_l2s(tmp_path: Path) -> None:
    c = TieredCache("", {"KEY_PREFIX": "pfx", "VERSION": 3, "OPTIONS": {
        "L2": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
               "LOCATION": str(tmp_path)},
        "GENERATION_PATH": str(tmp_path / "g")}})
    assert c.make_key("k") == "pfx:3:k" == c.l2.make_key("k")
    c.set("k", "v")
    assert c.l2.get("k") == "v"  # same entry through the L2 itself
    c.key_prefix = "other"  # test suites poke attributes: they go to the L2
    assert c.l2.key_prefix == "other" and c.get("k") is None


# -- mutation safety ---------------------------------------------------------


def test_mutating_what_get_returned_does_not_change_the_cache(
        cache: TieredCache, other: TieredCache) -> None:
    other.set("d", {"list": [1]})
    first = cache.get("d")  # from L2: fills L1
    first["list"].append(2)
    second = cache.get("d")  # L1 hit
    assert second == {"list": [1]}
    second["list"].append(3)
    second["new"] = True
    assert cache.get("d") == {"list": [1]}
    assert cache.stats()["l1_hits"] == 2


def test_mutating_what_was_set_does_not_change_the_cache(cache: TieredCache) -> None:
    value = {"list": [1]}
    cache.set("d", value)  # kept by the writer's L1 (write-through)
    value["list"].append(2)
    assert cache.get("d") == {"list": [1]}
    assert cache.get("d") == {"list": [1]}
    assert cache.stats()["l1_hits"] == (2 if cache.write_through else 1)


def test_mutable_inside_a_tuple_is_copied(cache: TieredCache) -> None:
    cache.set("t", (1, [2]))
    cache.get("t")
    got = cache.get("t")
    got[1].append(3)
    assert cache.get("t") == (1, [2])


def test_immutable_values_are_kept_as_objects(cache: TieredCache) -> None:
    value = ("a", 1, 2.5, None, b"x", frozenset({1}))
    cache.set("i", value)
    cache.get("i")
    assert cache.get("i") is cache.get("i")  # no copy, no unpickling on a hit


def test_aget_answers_an_l1_hit_without_a_thread(cache: TieredCache,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    cache.set("k", "v")
    cache.set("m", "w")
    cache.get("k")
    cache.get("m")

    def no_thread(*args: object, **kwargs: object) -> None:
        raise AssertionError("thread hop on an L1 hit")

    monkeypatch.setattr(tiered_backend, "sync_to_async", no_thread)
    assert asyncio.run(cache.aget("k")) == "v"
    assert asyncio.run(cache.aget_many(["k", "m"])) == {"k": "v", "m": "w"}
    assert asyncio.run(cache.ahas_key("k")) is True
    with pytest.raises(AssertionError, match="thread hop"):
        asyncio.run(cache.aget("not-in-l1"))


def test_async_misses_go_to_the_l2(cache: TieredCache) -> None:
    cache.set("k", "v")
    assert asyncio.run(cache.aget("k")) == "v"
    assert asyncio.run(cache.aget_many(["k", "nope"])) == {"k": "v"}
    assert asyncio.run(cache.ahas_key("nope")) is False
    asyncio.run(cache.aset("k", "w"))
    assert asyncio.run(cache.aget("k")) == "w"


# -- bounds --------------------------------------------------------------------


def test_entry_bound_is_lru(tmp_path: Path) -> None:
    c = locmem_tiered(tmp_path, L1_MAX_ENTRIES=3)
    for i in range(5):
        # Twice: a full L1 takes a key it does not hold on its second touch
        # (tiered/admission.py's doorkeeper); the first three fit at once.
        c.set(f"k{i}", i)
        c.set(f"k{i}", i)
    s = c.stats()
    assert s["l1_entries"] == 3 and s["l1_evictions"] == 2
    c.get("k2")  # k2 is now the most recent: k3 goes next
    c.set("k5", 5)
    c.set("k5", 5)
    assert hits(c) == (1, 0, 0)
    c.get("k2")
    c.get("k4")
    assert hits(c) == (3, 0, 0)
    c.get("k3")  # evicted: from L2 again
    c.get("k0")
    assert hits(c) == (3, 2, 0)


def test_byte_bound(tmp_path: Path) -> None:
    c = locmem_tiered(tmp_path, L1_MAX_BYTES=3500)
    for i in range(6):
        c.set(f"k{i}", b"x" * 1000)
    s = c.stats()
    assert s["l1_bytes"] <= 3500
    assert s["l1_entries"] == 3
    c.set("huge", b"x" * 5000)
    assert c.get("huge") == b"x" * 5000
    assert c.get("huge") == b"x" * 5000
    s = c.stats()
    assert s["l1_rejected"] >= 1 and s["l2_hits"] == 2, "too big for L1: always from L2"


def test_zero_entries_disables_the_l1(tmp_path: Path) -> None:
    c = locmem_tiered(tmp_path, L1_MAX_ENTRIES=0)
    c.set("k", "v")
    assert c.get("k") == "v" and c.get("k") == "v"
    assert hits(c) == (0, 2, 0)


# -- expiry --------------------------------------------------------------------


def test_l1_never_outlives_the_l2_expiry(cache: TieredCache, other: TieredCache) -> None:
    t0 = time.monotonic()
    cache.set("e", "soon", timeout=2)
    cache.set("f", "later", timeout=60)
    # The writer kept them (write-through); the other L1 fills from the L2 and
    # learns the expiry from the read.
    got = (cache.get("e"), other.get("e"), other.get("e"))
    if time.monotonic() - t0 < 1.0:  # not meaningful on a stalled machine
        assert got == ("soon", "soon", "soon")
        assert other.stats()["l1_hits"] == 1
        assert cache.stats()["l1_hits"] == (1 if cache.write_through else 0)
    time.sleep(max(0.0, t0 + 2.1 - time.monotonic()))
    assert cache.get("e") is None and other.get("e") is None
    assert cache.get("f") == "later"


def test_l1_timeout_caps_the_l1_life(tmp_path: Path) -> None:
    c = locmem_tiered(tmp_path, L1_TIMEOUT=0.3)
    c.set("k", "v", timeout=None)
    c.get("k")
    assert hits(c) == (1, 0, 0)
    time.sleep(0.35)
    assert c.get("k") == "v"
    assert hits(c) == (1, 1, 0)
    assert c.stats()["l1_expirations"] == 1


def test_zero_timeout_keeps_nothing(cache: TieredCache) -> None:
    cache.set("z", "v")
    cache.get("z")
    cache.set("z", "gone", timeout=0)
    assert cache.get("z") is None


def test_touch_moves_the_expiry(cache: TieredCache) -> None:
    cache.set("t", "v", timeout=60)
    cache.get("t")
    assert cache.touch("t", timeout=1) is True
    assert cache.get("t") == "v"
    time.sleep(2.05)
    assert cache.get("t") is None
    assert cache.touch("t") is False


class ExpiryBlindLocMem(LocMemCache):
    """An L2 that cannot report the expiry of what it returns (like memcached):
    a subclass, so TieredCache does not read LocMemCache's internals."""

    tiered_returns_what_was_set = True

    def tiered_failure_count(self) -> int:
        return 0


def test_unknown_expiry_is_not_kept_in_host_mode(tmp_path: Path) -> None:
    c = TieredCache("", {"OPTIONS": {
        "L2": {"BACKEND": "tests.tiered.test_tiered.ExpiryBlindLocMem", "LOCATION": str(tmp_path)},
        "GENERATION_PATH": str(tmp_path / "gen.mmap")}})
    c.l2.set("direct", "v")  # bypasses the adapter: nothing was published
    assert c.get("direct") == "v" and c.get("direct") == "v"
    assert hits(c) == (0, 2, 0) and c.stats()["no_expiry"] == 2


def test_unknown_expiry_is_kept_by_l1_timeout_in_none_mode(tmp_path: Path) -> None:
    c = locmem_tiered(tmp_path, COHERENCE="none", L1_TIMEOUT=30)
    c.l2.set("direct", "v")
    assert c.get("direct") == "v" and c.get("direct") == "v"
    assert hits(c) == (1, 1, 0)


# -- coherence between two L1s (two "processes" in one) ---------------------------


def test_a_write_through_one_l1_is_seen_by_another(tmp_path: Path) -> None:
    a = locmem_tiered(tmp_path, L1_MAX_ENTRIES=100)
    b = locmem_tiered(tmp_path, L1_MAX_ENTRIES=101)  # other options: its own L1
    a.set("k", "one")
    assert a.get("k") == "one" and b.get("k") == "one"
    assert a.get("k") == "one" and b.get("k") == "one"  # both L1s warm
    assert a.stats()["l1_hits"] == 2 and b.stats()["l1_hits"] == 1
    b.set("k", "two")
    assert a.get("k") == "two"
    assert a.stats()["invalidations"] == 1
    b.delete("k")
    assert a.get("k") is None
    a.set("k", "three")
    b.get("k")
    a.clear()
    assert b.get("k") is None


def test_coherence_none_does_not_see_other_writers(tmp_path: Path) -> None:
    """Another writer of the L2 (another process; here a write that does not go
    through any TieredCache of this process) is seen by L1_TIMEOUT only; this
    process's own writes, through any configuration over the L2, at once."""
    from django.core.cache.backends.locmem import LocMemCache

    a = locmem_tiered(tmp_path, COHERENCE="none", L1_MAX_ENTRIES=100)
    b = locmem_tiered(tmp_path, COHERENCE="none", L1_MAX_ENTRIES=101)
    elsewhere = LocMemCache(f"{tmp_path}/l2", {})
    a.set("k", "one")
    a.get("k")
    elsewhere.set("k", "two")
    assert a.get("k") == "one", "documented: 'none' is fresh by L1_TIMEOUT only"
    b.set("k", "three")  # this process's own writes it does see
    assert a.get("k") == "three"


def test_backend_stamps_its_own_writes_only_once_a_tiered_reader_watches(
        tmp_path: Path) -> None:
    from tests.sqlite.helpers import new_cache

    plain = new_cache(tmp_path / "sqlite")
    table = plain.coherence_table
    before = table.token(plain.make_key("k"))
    plain.set("k", 1)
    assert table.is_current(None, before), "nobody watches: the set skips its stamp"

    reader = sqlite_tiered(tmp_path)  # same LOCATION: watches on construction
    assert table.watched()
    assert reader.get("k") == 1
    plain.set("k", 2)  # a write that bypasses the adapter, as another process's would
    assert reader.get("k") == 2, "the L1 entry must go stale on the plain write"
    plain.delete("k")
    assert reader.get("k") is None


# -- the inlined hit path and the slow path read one layout ---------------------------


def test_l1_record_layout_is_where_the_hit_path_reads_it(tmp_path: Path) -> None:
    from djcachebench.tiered import state

    c = locmem_tiered(tmp_path)
    c.set("k", b"v")
    record = c._l1.records[("k", 1)]
    item = c._l1.get(("k", 1))
    assert record[state.R_PAYLOAD] == item[state.I_PAYLOAD] == b"v"
    assert record[state.R_KIND] == item[state.I_KIND] == state.OBJECT
    token = c.generation_table.token(":1:k")
    assert (record[state.R_OFFSET], record[state.R_EPOCH], record[state.R_TOKEN]) == token
    assert (item[state.I_OFFSET], item[state.I_EPOCH], item[state.I_TOKEN]) == token
    assert record[state.R_FINAL] == item[state.I_FINAL] == b":1:k"
    assert record[state.R_DEADLINE] > time.monotonic()


@pytest.mark.parametrize("value", [b"bytes", "text", 7, {"a": [1]}, None])
def test_hot_and_slow_paths_agree(tmp_path: Path, value: object) -> None:
    """``get`` inlines the L1 lookup; ``get_many`` and ``aget`` take the slow path."""
    writer = locmem_tiered(tmp_path, L1_MAX_ENTRIES=50)
    reader = locmem_tiered(tmp_path, L1_MAX_ENTRIES=51)

    def both(cache: TieredCache) -> None:
        for _ in range(2):  # the second time from L1
            hot = cache.get("k", "absent")
            assert hot == cache.get_many(["k"]).get("k", "absent")
            assert hot == asyncio.run(cache.aget("k", "absent"))

    for step in (lambda: writer.set("k", value), lambda: writer.delete("k"),
                 lambda: writer.set("k", value), lambda: reader.set("k", "other")):
        step()
        both(reader)
        both(writer)


def test_a_write_over_sqlite_takes_no_lock_and_changes_its_slot_once(tmp_path: Path) -> None:
    """Over ShardedSQLiteCache the engine marks the slot inside its transaction
    and stamps it after the commit (coherence/stamper.py): the adapter takes no
    slot lock and makes no stamp of its own, and keeps what it wrote under
    exactly the pair the write left in the slot."""
    from djcachebench.coherence import GenerationTable

    cache = sqlite_tiered(tmp_path)
    cache.get("k")  # watch the table
    table = cache.generation_table
    off = table.locate(cache.l2.make_key("k"))
    before = table.read_at(off)
    locks = []
    original = GenerationTable._lock

    def counting(self: GenerationTable, offset: int) -> bool:
        locks.append(offset)
        return original(self, offset)

    GenerationTable._lock = counting  # type: ignore[method-assign]
    try:
        cache.set("k", "again")
    finally:
        GenerationTable._lock = original  # type: ignore[method-assign]
    assert locks == []
    after = table.read_at(off)
    assert after[2][0] != before[2][0] and after[2][1] != before[2][1]
    record = cache._l1.records[("k", 1)]
    assert record[6] == after[2]
    assert cache.get("k") == "again" and cache.stats()["l1_hits"] >= 1


def test_a_slot_shared_by_many_keys_still_keeps_each_keys_value(tmp_path: Path) -> None:
    """With one slot for every key, each write invalidates every entry, but a read
    still keeps its value under the expiry it read: the L1 never depends on a slot
    remembering which key it last saw."""
    from djcachebench.coherence import open_table

    (tmp_path / "sqlite").mkdir(mode=0o700)
    assert open_table(str(tmp_path / "sqlite" / "generations.mmap"), slots=1).slots == 1
    writer = sqlite_tiered(tmp_path, L1_MAX_ENTRIES=1000)
    assert writer.generation_table.slots == 1
    keys = [f"k{i}" for i in range(200)]
    for key in keys:
        writer.set(key, key.upper(), 60)
    reader = sqlite_tiered(tmp_path, L1_MAX_ENTRIES=1001)
    assert [reader.get(k) for k in keys] == [k.upper() for k in keys]
    assert [reader.get(k) for k in keys] == [k.upper() for k in keys]
    stats = reader.stats()
    assert stats["l1_hits"] == len(keys) and stats["no_expiry"] == 0
    writer.set("k0", "new")  # the one slot: every entry of the reader is stale now
    assert reader.get("k0") == "new" and reader.get("k1") == "K1"


def test_a_write_over_sqlite_replaces_or_drops_the_writers_entry(tmp_path: Path) -> None:
    """The writer's entry is not dropped before its write (``WriteThrough.announced``):
    after it, it is replaced by the written value, or dropped when that value
    cannot be kept (expired at once, or refused by the L2), and the older value
    is never served."""
    from djcachebench.tiered import state

    cache = sqlite_tiered(tmp_path)
    cache.set("k", b"old")
    assert cache._l1.records[("k", 1)][state.R_PAYLOAD] == b"old"
    cache.set("k", {"new": [1]})  # mutable: kept pickled, in place of the old entry
    assert cache._l1.records[("k", 1)][state.R_KIND] == state.PICKLED
    assert cache.get("k") == {"new": [1]}
    cache.set("k", b"brief", timeout=1e-9)  # expired before it could be kept
    assert ("k", 1) not in cache._l1.records
    assert cache.get("k") is None
    cache.set("k", b"kept")
    with pytest.raises(Exception, match="pickle"):
        cache.set("k", lambda: 0)  # the L2 refuses it before writing anything
    assert ("k", 1) not in cache._l1.records
    assert cache.get("k") == b"kept"
    cache.delete("k")  # a delete keeps the absence, in place of the value
    assert cache._l1.records[("k", 1)][state.R_KIND] == state.ABSENCE
    assert cache.get("k", "gone") == "gone"
