"""Django cache semantics worth pinning beyond Django's own suite.

Pinned (docs/architecture.md "ShardedSQLiteCache"): timeouts (``TIMEOUT`` None / 0 /
fractions, per-call overrides), integers stored natively (atomic ``incr``,
beyond 64 bits still right, ``bool`` stays ``bool``), the msgpack and dotted
path serializers, ``stats()`` counters, persistence across instances, private
file modes, batch operations across shards (one statement or transaction per
shard touched), and ``clear()``.
"""

from __future__ import annotations

import enum
import os
import stat
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.serializers import TAG_SIZE

from .helpers import raw_shard, shard_of, shard_path


def cache_location(cache: ShardedSQLiteCache) -> Path:
    return Path(str(cache.location))


def row(cache: ShardedSQLiteCache, key: str) -> tuple[Any, ...] | None:
    """``(kind, typeof(value), value, expires)`` of Django key ``key``, read raw."""
    with raw_shard(shard_path(cache, key)) as conn:
        return conn.execute("SELECT kind, typeof(value), value, expires FROM cache "
                            "WHERE key = ?", (cache.make_key(key),)).fetchone()


# -- timeouts ---------------------------------------------------------------------------


def test_timeout_none_never_expires(make_cache: Callable[..., ShardedSQLiteCache]) -> None:
    cache = make_cache(TIMEOUT=None)
    cache.set("k", "v")
    assert row(cache, "k")[3] is None
    assert cache.get("k") == "v"


def test_timeout_zero_caches_nothing(make_cache: Callable[..., ShardedSQLiteCache]) -> None:
    """Django: a default TIMEOUT of 0 means values expire immediately."""
    cache = make_cache(TIMEOUT=0)
    cache.set("k", "v")
    cache.set_many({"a": 1, "b": 2})
    assert cache.get("k") is None
    assert cache.get_many(["a", "b"]) == {}
    assert cache.entry_count() == 0


def test_fractional_default_timeout_is_not_truncated(
    make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    """TIMEOUT=2.5 is accepted as "a number of seconds", so it must not become 2
    (and TIMEOUT=0.5 must not silently become 0, i.e. caching nothing)."""
    cache = make_cache(TIMEOUT=2.5)
    before = time.time()
    cache.set("k", "v")
    expires = row(cache, "k")[3]
    assert before + 2.4 <= expires <= time.time() + 2.6
    short = make_cache(location=Path(cache.location) / "short", TIMEOUT=0.5)
    short.set("k", "v")
    assert short.get("k") == "v"


def test_per_call_timeouts(make_cache: Callable[..., ShardedSQLiteCache]) -> None:
    cache = make_cache(TIMEOUT=60)
    cache.set("forever", "v", timeout=None)
    assert row(cache, "forever")[3] is None
    cache.set("default", "v")
    assert time.time() + 50 < row(cache, "default")[3] <= time.time() + 61
    cache.set("gone", "v")
    cache.set("gone", "new", timeout=0)  # timeout 0 expires immediately: deleted
    assert cache.get("gone") is None and row(cache, "gone") is None
    cache.set("negative", "v", timeout=-1)
    assert cache.get("negative") is None
    assert cache.add("added-expired", "v", timeout=0) is True
    assert cache.get("added-expired") is None


def test_expired_values_are_misses_everywhere(cache: ShardedSQLiteCache) -> None:
    cache.set("text", "v", timeout=0.3)
    cache.set("n", 1, timeout=0.3)
    time.sleep(0.6)
    assert cache.get("text") is None
    assert cache.has_key("text") is False
    assert cache.get_many(["text", "n"]) == {}
    with pytest.raises(ValueError):
        cache.incr("n")
    assert cache.touch("text", 100) is False
    assert cache.add("text", "again") is True  # add replaces an expired value
    assert cache.get("text") == "again"


def test_deleting_an_expired_value_says_nothing_was_deleted(cache: ShardedSQLiteCache) -> None:
    """``delete`` answers False for a row that has expired (it was not there to
    delete), agreeing with ``get`` and ``has_key``, which say the key is missing;
    Django's backends answer False then (redis always)."""
    cache.set("a", "v", timeout=0.3)
    cache.set("b", "v", timeout=0.3)
    time.sleep(0.6)
    assert cache.get("a") is None
    assert cache.delete("a") is False
    assert cache.has_key("b") is False
    assert cache.delete("b") is False
    cache.set("c", "v")
    assert cache.delete("c") is True
    assert cache.delete("c") is False


def test_touch_changes_only_the_expiry(cache: ShardedSQLiteCache) -> None:
    cache.set("k", "v", timeout=100)
    assert cache.touch("k", None) is True
    assert row(cache, "k")[3] is None
    assert cache.touch("k", 0) is True  # Django: touch with 0 expires it
    assert cache.get("k") is None


@pytest.mark.parametrize("timeout", [0, -1])
def test_touch_with_a_past_timeout_finds_only_live_keys(cache: ShardedSQLiteCache,
                                                        timeout: int) -> None:
    """With a timeout already past, touch deletes the row but answers True only
    for a live one: an expired key is not "touched" (LocMemCache, and touch with
    a future timeout, say False)."""
    cache.set("gone", "v", timeout=0.05)
    time.sleep(0.1)
    assert cache.touch("gone", timeout) is False
    assert cache.touch("never", timeout) is False
    cache.set("live", "v")
    assert cache.touch("live", timeout) is True
    assert cache.get("live") is None
    assert cache.touch("live", timeout) is False


# -- integers -------------------------------------------------------------------------


def test_incr_of_an_int_whose_pickle_needs_a_value_file(cache: ShardedSQLiteCache) -> None:
    """incr of an int whose pickle is 32 KiB or more adds, as LocMemCache does,
    rather than raising TypeError: the sum goes to a value file, stored only if
    the key still holds what was added to."""
    huge = 10**100_000
    cache.set("n", huge)
    assert cache.incr("n") == huge + 1
    assert cache.get("n") == huge + 1
    assert cache.incr("n", huge) == 2 * huge + 1
    assert cache.decr("n", 2 * huge) == 1  # back in a row
    assert cache.get("n") == 1 and cache.incr("n") == 2
    cache.set("m", 7)
    assert cache.incr("m", huge) == huge + 7  # from a row to a file
    assert cache.get_many(["m", "n"]) == {"m": huge + 7, "n": 2}
    cache.delete("m")
    cache.reclaim_files(0)
    files = [f for f in (cache_location(cache) / "values").rglob("*") if f.is_file()]
    assert files == []  # every file a sum made is released again



def test_integers_are_sealed(cache: ShardedSQLiteCache) -> None:
    """Defect: 64-bit ints were bare SQL integers, without a tag (so that incr
    could be one UPDATE), and whoever could write a shard set any cached int:
    a user id, a counter, a flag. They are sealed like every value now."""
    cache.set("n", 41)
    kind, sql_type, stored, _ = row(cache, "n")
    assert (kind, sql_type) == (6, "blob") and stored[TAG_SIZE:] == (41).to_bytes(8, "big")
    assert cache.incr("n") == 42
    assert cache.decr("n", 50) == -8
    assert cache.get("n") == -8 and cache.get_many(["n"]) == {"n": -8}
    assert row(cache, "n")[2][TAG_SIZE:] == (-8).to_bytes(8, "big", signed=True)
    # The number altered in place, tag kept: not served, not incremented.
    forged = row(cache, "n")[2][:TAG_SIZE] + (1).to_bytes(8, "big")
    with raw_shard(shard_path(cache, "n")) as conn:
        conn.execute("UPDATE cache SET value = ? WHERE key = ?", (forged, cache.make_key("n")))
    assert cache.get("n") is None
    assert cache.has_key("n") is False
    with pytest.raises(ValueError):
        cache.incr("n")


def test_a_sealed_integer_copied_onto_another_key_is_refused(cache: ShardedSQLiteCache) -> None:
    """incr adds inside its UPDATE (djcb_incr): the row is verified there too, under
    its own key, so a counter copied from another key is neither read nor
    incremented."""
    cache.set("admin_id", 1)
    cache.set("user_id", 500)
    stolen = row(cache, "admin_id")[2]
    with raw_shard(shard_path(cache, "user_id")) as conn:
        conn.execute("UPDATE cache SET value = ? WHERE key = ?",
                     (stolen, cache.make_key("user_id")))
    assert cache.get("user_id") is None
    with pytest.raises(ValueError):
        cache.incr("user_id")
    assert cache.incr("admin_id", 2) == 3


def test_an_unsealed_integer_row_reads_as_absent(cache: ShardedSQLiteCache) -> None:
    """A bare SQL integer row (kind 0: what earlier versions wrote, or what a
    forger writes) is never served; it does not block add, so add-then-incr
    (a rate limiter) starts again from the value added."""
    cache.set("hits", 1)
    with raw_shard(shard_path(cache, "hits")) as conn:
        conn.execute("UPDATE cache SET kind = 0, value = 1000, blob = NULL WHERE key = ?",
                      (cache.make_key("hits"),))
    assert cache.get("hits") is None
    assert cache.has_key("hits") is False
    assert cache.touch("hits", 100) is False
    with pytest.raises(ValueError):
        cache.incr("hits")
    assert cache.add("hits", 0, timeout=-1) is True  # nothing live to block it
    assert cache.add("hits", 0) is True
    assert cache.incr("hits") == 1


def test_incr_past_64_bits_keeps_working(cache: ShardedSQLiteCache) -> None:
    top = 2**63 - 1
    cache.set("n", top)
    assert row(cache, "n")[:2] == (6, "blob")
    assert cache.incr("n") == top + 1
    assert cache.get("n") == top + 1
    assert cache.incr("n", 10) == top + 11
    assert cache.decr("n", top + 11 - 5) == 5
    assert row(cache, "n")[:2] == (6, "blob")  # back within 64 bits: 8 bytes again
    assert cache.incr("n", 2**64) == 2**64 + 5
    cache.set("low", -(2**63))
    assert cache.decr("low") == -(2**63) - 1
    assert cache.get("low") == -(2**63) - 1
    cache.set("huge", 10**30)
    assert cache.get("huge") == 10**30 and type(cache.get("huge")) is int
    assert cache.incr("huge", -(10**30)) == 0


@pytest.mark.parametrize("value", [True, False])
def test_bool_stays_bool(cache: ShardedSQLiteCache, value: bool) -> None:
    cache.set("b", value)
    got = cache.get("b")
    assert got is value
    assert cache.get_many(["b"])["b"] is value
    assert row(cache, "b")[0] != 0  # not stored as an SQL integer


class Colour(enum.IntEnum):
    RED = 1


@pytest.mark.parametrize("value", [Colour.RED, 1.0, 2.5, Decimal("1.5"), 0, -1],
                         ids=["intenum", "float-one", "float", "decimal", "zero", "minus-one"])
def test_numbers_keep_their_type(cache: ShardedSQLiteCache, value: Any) -> None:
    cache.set("x", value)
    got = cache.get("x")
    assert got == value and type(got) is type(value)


def test_incr_of_a_missing_or_non_numeric_value(cache: ShardedSQLiteCache) -> None:
    with pytest.raises(ValueError):
        cache.incr("missing")
    cache.set("text", "abc")
    with pytest.raises(TypeError):
        cache.incr("text")
    assert cache.get("text") == "abc"


# -- serializers ------------------------------------------------------------------------


PLAIN = {
    "str": "héllo", "bytes": b"\x00\xff", "int": 7, "big": 2**62, "float": 1.25,
    "none": None, "true": True, "list": [1, "a", [2.5, None]], "dict": {"k": {"n": [1]}},
    "empty": {},
}


def test_msgpack_round_trips_plain_data(make_cache: Callable[..., ShardedSQLiteCache]) -> None:
    cache = make_cache({"SERIALIZER": "msgpack"})
    for key, value in PLAIN.items():
        cache.set(key, value)
    assert {key: cache.get(key) for key in PLAIN} == PLAIN
    assert cache.get_many(list(PLAIN)) == PLAIN
    assert cache.get("bytes") == b"\x00\xff" and isinstance(cache.get("str"), str)
    cache.set("tuple", (1, 2))
    assert cache.get("tuple") == [1, 2]  # msgpack has one array type
    assert row(cache, "dict")[0] == 2


def test_msgpack_reads_back_dicts_keyed_by_tuples(
    make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    """msgpack packs a tuple key as an array, and read back as a list it cannot be
    a dict key: unless tuples are restored, set takes the value, every get is a
    miss (``errors`` +1), and add of the key is refused until it expires."""
    cache = make_cache({"SERIALIZER": "msgpack"})
    value = {(1, 2): "a", "plain": [1, (2, 3)], "nested": {((1, "x"), b"k"): {(3,): [4]}}}
    cache.set("k", value)
    assert cache.get("k") == {(1, 2): "a", "plain": [1, [2, 3]],
                              "nested": {((1, "x"), b"k"): {(3,): [4]}}}
    assert cache.get_many(["k"]) == {"k": cache.get("k")}
    assert cache.add("k", "other") is False
    assert cache.stats()["errors"] == 0


def test_msgpack_cannot_pack_arbitrary_objects(
    make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    cache = make_cache({"SERIALIZER": "msgpack"})
    with pytest.raises(TypeError):
        cache.set("k", Decimal("1"))
    assert cache.get("k") is None


def test_custom_serializer_by_dotted_path(make_cache: Callable[..., ShardedSQLiteCache]) -> None:
    cache = make_cache({"SERIALIZER": "tests.sqlite.helpers.JsonSerializer"})
    value = {"b": [1, 2], "a": "x"}
    cache.set("k", value)
    assert cache.get("k") == value
    kind, _, blob, _ = row(cache, "k")
    assert kind == 3
    assert blob[TAG_SIZE:] == b'{"a": "x", "b": [1, 2]}'  # our dumps(), behind the tag
    with pytest.raises(TypeError):  # json's own error
        cache.set("k", {1, 2})
    assert cache.get("k") == value


# -- stats --------------------------------------------------------------------------------


def test_stats_count_hits_misses_sets_deletes(cache: ShardedSQLiteCache) -> None:
    assert set(cache.stats().values()) == {0}
    cache.set("a", 1)
    cache.set("b", "two")
    cache.set_many({"c": 3, "d": 4})
    assert cache.add("a", 9) is False
    assert cache.add("e", 5) is True
    assert cache.get("a") == 1
    assert cache.get("missing") is None
    assert cache.get_many(["b", "c", "nope1", "nope2"]) == {"b": "two", "c": 3}
    assert cache.delete("a") is True
    assert cache.delete("a") is False
    cache.delete_many(["b", "c", "never"])
    stats = cache.stats()
    assert (stats["sets"], stats["hits"], stats["misses"], stats["deletes"]) == (5, 3, 3, 3)
    assert stats["give_ups"] == stats["lock_waits"] == stats["errors"] == 0


def test_stats_are_per_instance(make_cache: Callable[..., ShardedSQLiteCache]) -> None:
    first, second = make_cache(), make_cache()
    first.set("k", 1)
    assert second.get("k") == 1
    assert first.stats()["sets"] == 1 and first.stats()["hits"] == 0
    assert second.stats()["sets"] == 0 and second.stats()["hits"] == 1


# -- persistence and files ----------------------------------------------------------------


def test_new_instance_on_the_same_location_reads_earlier_values(
    make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    first = make_cache({"SHARDS": 4})
    data: dict[str, Any] = {f"k{i}": [i, "x" * i] for i in range(50)}
    first.set_many(data)
    first.set("n", 10)
    first.set("short", "v", timeout=100)
    first.close_connections()
    again = make_cache({"SHARDS": 4})
    assert again.get_many(list(data)) == data
    assert again.incr("n") == 11
    assert time.time() + 90 < row(again, "short")[3] <= time.time() + 101
    assert again.entry_count() == 52


@pytest.fixture
def open_umask() -> Iterator[None]:
    """A umask that hides nothing: privacy must come from the backend itself."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def test_directory_and_files_are_private(
    open_umask: None, cache_dir: Path, make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    cache = make_cache({"MAX_ENTRIES": 5, "CULL_FREQUENCY": 2})
    cache.set_many({f"k{i}": i for i in range(20)})  # culls: cull.lock exists too
    for i in range(20):
        cache.set(f"x{i}", "v")
    assert stat.S_IMODE(cache_dir.stat().st_mode) == 0o700
    names = {p.name for p in cache_dir.iterdir()}
    assert {"manifest.json", "counts.mmap", "cull.lock"} <= names
    assert {f"shard-00{i}.sqlite3" for i in range(8)} <= names
    assert any(n.endswith("-wal") for n in names) and any(n.endswith("-shm") for n in names)
    modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in cache_dir.iterdir()}
    assert modes == {name: "0o600" for name in names}


# -- batch operations -------------------------------------------------------------------


def test_batch_operations_across_shards(cache: ShardedSQLiteCache) -> None:
    data = {f"key-{i}": {"i": i} for i in range(100)}
    assert len({shard_of(cache, k) for k in data}) == cache._store.n
    assert cache.set_many(data) == []
    assert cache.get_many([*data, "absent"]) == data
    cache.delete_many([f"key-{i}" for i in range(0, 100, 2)])
    assert cache.get_many(list(data)) == {f"key-{i}": {"i": i} for i in range(1, 100, 2)}
    # Versions are part of the key.
    cache.set_many({"v": "one"}, version=1)
    cache.set_many({"v": "two"}, version=2)
    assert cache.get_many(["v"], version=2) == {"v": "two"}
    cache.delete_many(["v"], version=1)
    assert cache.get("v", version=1) is None and cache.get("v", version=2) == "two"


@pytest.mark.parametrize("key", ["ключ", "键", "emoji-\U0001f511", "a:b", "x" * 240])
def test_any_valid_django_key_round_trips(cache: ShardedSQLiteCache, key: str) -> None:
    cache.set(key, {"k": key})
    assert cache.get(key) == {"k": key}
    assert cache.get_many([key]) == {key: {"k": key}}
    assert cache.delete(key) is True


def test_set_many_with_timeout_zero_deletes(cache: ShardedSQLiteCache) -> None:
    cache.set_many({"a": 1, "b": 2})
    assert cache.set_many({"a": 10, "b": 20}, timeout=0) == []
    assert cache.get_many(["a", "b"]) == {}


def test_batches_larger_than_one_statement(
    make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    """More keys than one statement binds (500), all in one shard."""
    cache = make_cache({"SHARDS": 1, "MAX_ENTRIES": None})
    data = {f"k{i}": i for i in range(1234)}
    assert cache.set_many(data) == []
    assert cache.get_many(list(data)) == data
    cache.delete_many(list(data))
    assert cache.entry_count() == 0
    assert cache.stats()["deletes"] == 1234


def test_batches_use_one_statement_or_transaction_per_shard(
    make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    cache = make_cache({"MAX_ENTRIES": None})
    data = {f"key-{i}": f"v{i}" for i in range(100)}
    touched = len({shard_of(cache, k) for k in data})
    statements: list[str] = []
    for i in range(cache._store.n):
        cache._store.pool.get(i).set_trace_callback(statements.append)
    cache.set_many(data)
    assert sum(s.startswith("BEGIN IMMEDIATE") for s in statements) == touched
    statements.clear()
    assert cache.get_many(list(data)) == data
    assert sum(s.startswith("SELECT key, kind") for s in statements) == touched
    statements.clear()
    cache.delete_many(list(data))
    assert sum(s.startswith("BEGIN IMMEDIATE") for s in statements) == touched


def test_clear_empties_every_shard(cache: ShardedSQLiteCache) -> None:
    cache.set_many({f"k{i}": i for i in range(100)})
    cache.clear()
    assert cache.entry_count() == 0
    assert cache.get_many([f"k{i}" for i in range(100)]) == {}
    cache.set("after", 1)
    assert cache.get("after") == 1
