"""What is read back is what was written, or nothing.

Pinned (docs/architecture.md "Values and integrity"): every serialized value carries a keyed BLAKE2b
tag over the cache key and the payload. A value altered in the shard file,
copied from another key, written under another ``INTEGRITY_KEY`` or by
another serializer reads as a miss, is counted in ``stats()["tampered"]``,
and is never handed to the unpickler (so write access to the cache directory
is not code execution). On the way in, a value the serializer cannot encode
raises the serializer's own error and leaves the cache as it was.
"""

from __future__ import annotations

import pickle
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.serializers import RAW_BYTES, SERIALIZED, SHA_MIN, TAG_SIZE, Sealer

from .helpers import raw_shard, shard_path

VALUE = {"answer": 42, "items": ["a", "b"]}  # not an int: stored serialized and sealed


def stored_row(cache: ShardedSQLiteCache, key: str) -> tuple[int, Any] | None:
    """``(kind, value)`` of the row of Django key ``key``, read with plain sqlite3."""
    with raw_shard(shard_path(cache, key)) as conn:
        return conn.execute("SELECT kind, value FROM cache WHERE key = ?",
                            (cache.make_key(key),)).fetchone()


def overwrite(cache: ShardedSQLiteCache, key: str, **columns: Any) -> None:
    """Change columns of the row of ``key`` behind the cache's back."""
    sets = ", ".join(f"{name} = ?" for name in columns)
    with raw_shard(shard_path(cache, key)) as conn:
        cur = conn.execute(f"UPDATE cache SET {sets} WHERE key = ?",
                           (*columns.values(), cache.make_key(key)))
        assert cur.rowcount == 1


class TouchOnUnpickle:
    """Unpickling this object creates ``path``: proof that a payload was unpickled."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.path,))


def live_payload(marker: Path, control: Path) -> bytes:
    """A pickle that creates ``marker`` when loaded; checked to be live on ``control``."""
    assert not control.exists()
    pickle.loads(pickle.dumps(TouchOnUnpickle(control)))
    assert control.exists(), "the payload must really act when unpickled"
    return pickle.dumps(TouchOnUnpickle(marker))


# -- altered bytes ---------------------------------------------------------------------


@pytest.mark.parametrize("where", [0, TAG_SIZE - 1, TAG_SIZE, -1],
                         ids=["tag-first", "tag-last", "payload-first", "payload-last"])
def test_flipped_byte_reads_as_a_miss_and_is_counted(
    cache: ShardedSQLiteCache, where: int
) -> None:
    cache.set("k", VALUE)
    _, blob = stored_row(cache, "k")
    damaged = bytearray(blob)
    damaged[where] ^= 0x01
    overwrite(cache, "k", value=bytes(damaged))
    before = cache.stats()["tampered"]
    assert cache.get("k", "default") == "default"
    assert cache.stats()["tampered"] == before + 1
    # The row stays (it may be another key's value, see the rotation tests):
    # every read of it is a miss and is counted; a set replaces it.
    assert stored_row(cache, "k") is not None
    assert cache.get("k") is None
    assert cache.stats()["tampered"] == before + 2
    cache.set("k", "new")
    assert cache.get("k") == "new"


def test_a_row_read_before_is_checked_again_once_altered(cache: ShardedSQLiteCache) -> None:
    """Verified rows are remembered (codec.py): only the exact bytes, for that key."""
    cache.set("k", VALUE)
    cache.set("other", VALUE)
    assert cache.get("k") == VALUE and cache.get("k") == VALUE  # the second from the memo
    _, blob = stored_row(cache, "k")
    overwrite(cache, "other", value=blob)  # bytes verified for "k", not for "other"
    assert cache.get("other", "default") == "default"
    damaged = bytearray(blob)
    damaged[-1] ^= 0x01
    overwrite(cache, "k", value=bytes(damaged))
    assert cache.get("k", "default") == "default"
    assert cache.stats()["tampered"] == 2


def test_blob_copied_from_another_key_reads_as_a_miss(cache: ShardedSQLiteCache) -> None:
    """The tag binds the cache key: a valid value moved to another key is refused."""
    cache.set("src", "the source value")
    cache.set("dst", "the destination value")
    _, blob = stored_row(cache, "src")
    overwrite(cache, "dst", value=blob)
    assert cache.get("dst", "default") == "default"
    assert cache.stats()["tampered"] == 1
    assert cache.get("src") == "the source value"


def test_tampered_value_is_never_unpickled(cache: ShardedSQLiteCache, tmp_path: Path) -> None:
    """A pickle that would create a file, behind a tag of the right length, stays inert."""
    marker = tmp_path / "unpickled"
    payload = live_payload(marker, tmp_path / "control")
    for key in ("get", "get_many", "incr", "get_or_set"):
        cache.set(key, VALUE)
        overwrite(cache, key, value=b"\x00" * TAG_SIZE + payload)
    assert cache.get("get", "default") == "default"
    assert cache.get_many(["get_many"]) == {}
    with pytest.raises(ValueError):
        cache.incr("incr")
    # get_or_set sees a miss and returns the default; its add() does not replace
    # the live row (unverified rows block add), and its second get is a miss too.
    assert cache.get_or_set("get_or_set", "fresh") == "fresh"
    assert not marker.exists()
    assert cache.stats()["tampered"] == 5


def test_wrong_tag_with_the_real_payload_is_refused(
    cache: ShardedSQLiteCache, tmp_path: Path
) -> None:
    """Replacing the tag but keeping a well-formed payload is still a miss."""
    cache.set("k", VALUE)
    _, blob = stored_row(cache, "k")
    overwrite(cache, "k", value=bytes(TAG_SIZE) + blob[TAG_SIZE:])
    assert cache.get("k") is None
    assert cache.stats()["tampered"] == 1


@pytest.mark.parametrize("value", [b"", b"short", "text instead of bytes", 3.5],
                         ids=["empty", "shorter-than-tag", "text", "real"])
def test_stored_value_of_the_wrong_shape_is_a_miss(cache: ShardedSQLiteCache, value: Any) -> None:
    cache.set("k", VALUE)
    overwrite(cache, "k", value=value)
    assert cache.get("k", "default") == "default"
    assert cache.stats()["tampered"] == 1


def test_kind_changed_to_another_serializer_is_a_miss(cache: ShardedSQLiteCache) -> None:
    """A blob relabelled as msgpack is not decoded by the wrong codec."""
    cache.set("k", VALUE)
    overwrite(cache, "k", kind=2)
    assert cache.get("k") is None
    assert cache.stats()["tampered"] == 1


def test_blob_relabelled_as_integer_is_a_miss(cache: ShardedSQLiteCache) -> None:
    cache.set("k", VALUE)
    overwrite(cache, "k", kind=0)
    assert cache.get("k") is None
    assert cache.stats()["tampered"] == 1


def test_integer_row_given_a_blob_is_a_miss(cache: ShardedSQLiteCache, tmp_path: Path) -> None:
    """Integers are sealed 8 bytes; a pickle slipped into an integer row (and one
    marked as an unsealed integer of an earlier version) is refused."""
    marker = tmp_path / "unpickled"
    cache.set("n", 7)
    assert stored_row(cache, "n")[0] == 6
    overwrite(cache, "n", value=live_payload(marker, tmp_path / "control"))
    assert cache.get("n") is None
    overwrite(cache, "n", kind=0)
    assert cache.get("n") is None
    assert not marker.exists()
    assert cache.stats()["tampered"] == 2


def test_untampered_values_are_not_counted(cache: ShardedSQLiteCache) -> None:
    cache.set_many({f"k{i}": VALUE for i in range(50)})
    assert cache.get_many([f"k{i}" for i in range(50)]) == {f"k{i}": VALUE for i in range(50)}
    assert cache.stats()["tampered"] == 0


# -- INTEGRITY_KEY and SERIALIZER ----------------------------------------------------


def test_cache_with_another_integrity_key_reads_old_values_as_misses(
    make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    writer = make_cache({"INTEGRITY_KEY": "first-integrity-key-0123456789"})
    writer.set_many({f"k{i}": f"v{i}" for i in range(20)})
    writer.set("n", 5)
    same = make_cache({"INTEGRITY_KEY": "first-integrity-key-0123456789"})
    assert same.get("k3") == "v3"

    other = make_cache({"INTEGRITY_KEY": b"second-integrity-key-0123456789"})
    assert other.get_many([f"k{i}" for i in range(20)]) == {}
    assert other.get("k3") is None
    assert other.stats()["tampered"] == 21  # rows are left in place: k3 counted twice
    # Integers are sealed too (a cached user id is as much worth forging).
    assert other.get("n") is None
    assert same.get("n") == 5


def test_integrity_key_differs_from_the_secret_key_default(
    make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    """Values sealed with the SECRET_KEY-derived key do not verify under an explicit key."""
    make_cache().set("k", VALUE)
    explicit = make_cache({"INTEGRITY_KEY": "an-explicit-integrity-key"})
    assert explicit.get("k") is None
    assert explicit.stats()["tampered"] == 1


def test_switching_serializer_reads_old_values_as_misses(
    make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    make_cache({"SERIALIZER": "pickle"}).set("k", ["a", 1])
    assert make_cache({"SERIALIZER": "msgpack"}).get("k", "default") == "default"


def test_touch_agrees_with_get_on_a_row_this_cache_cannot_read(
    make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    """``touch`` of a row that ``get`` and ``has_key`` read as a miss (written by
    another serializer or under another integrity key, or altered on disk)
    answers False and leaves the row as it was, rather than extending its life:
    whoever can read the row still finds it with its own expiry."""
    pickled = make_cache({"SERIALIZER": "pickle", "INTEGRITY_KEY": "integrity-key-one-0123"})
    other_serializer = make_cache({"SERIALIZER": "msgpack",
                                   "INTEGRITY_KEY": "integrity-key-one-0123"})
    other_key = make_cache({"SERIALIZER": "pickle", "INTEGRITY_KEY": "integrity-key-two-0123"})
    pickled.set("list", ["a", 1], 30)
    pickled.set("altered", VALUE, 30)
    overwrite(pickled, "altered", value=b"\x00" * TAG_SIZE + pickle.dumps(VALUE))
    for reader, key in [(other_serializer, "list"), (other_key, "list"),
                        (pickled, "altered"), (other_key, "altered")]:
        assert reader.get(key, "miss") == "miss" and not reader.has_key(key)
        assert reader.touch(key, 3600) is False, key
    with raw_shard(shard_path(pickled, "list")) as conn:
        expires = conn.execute("SELECT expires FROM cache WHERE key = ?",
                               (pickled.make_key("list"),)).fetchone()[0]
    assert expires < time.time() + 60  # not moved to an hour
    assert pickled.touch("list", 3600) is True and pickled.get("list") == ["a", 1]
    assert other_serializer.touch("missing", 10) is False


def test_bytes_and_str_survive_a_change_of_serializer(
    make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    """bytes and str are stored as they are (codec.py), not through the serializer."""
    make_cache({"SERIALIZER": "pickle"}).set_many({"b": b"\x00raw", "s": "t\u00e9xt"})
    assert make_cache({"SERIALIZER": "msgpack"}).get_many(["b", "s"]) == {
        "b": b"\x00raw", "s": "t\u00e9xt"}


# -- bytes and str stored raw ------------------------------------------------------------


@pytest.mark.parametrize("value", [b"", b"\x80\x00bytes", "", "caf\u00e9 \ud800 \U0001f600"],
                         ids=["empty-bytes", "bytes", "empty-str", "str-with-surrogate"])
def test_bytes_and_str_round_trip_as_raw_rows(cache: ShardedSQLiteCache, value: Any) -> None:
    cache.set("k", value)
    kind, _ = stored_row(cache, "k")
    assert kind == (4 if isinstance(value, bytes) else 5)
    for _ in range(2):  # the second read comes through the memo of verified rows
        got = cache.get("k")
        assert got == value and type(got) is type(value)
    assert cache.has_key("k") and not cache.add("k", value)


def test_raw_bytes_relabelled_as_a_pickle_are_never_unpickled(
    cache: ShardedSQLiteCache, tmp_path: Path
) -> None:
    """Anyone's bytes may be cached; relabelled as pickle they must not run, even after
    this process has verified (and remembered) them as bytes."""
    marker = tmp_path / "unpickled"
    payload = live_payload(marker, tmp_path / "control")
    cache.set("k", payload)  # e.g. an uploaded file's content
    assert cache.get("k") == payload
    overwrite(cache, "k", kind=1)
    assert cache.get("k", "default") == "default"
    assert not marker.exists()
    assert cache.stats()["tampered"] == 1


def test_str_relabelled_as_bytes_is_a_miss(cache: ShardedSQLiteCache) -> None:
    cache.set("k", "text")
    assert cache.get("k") == "text"
    overwrite(cache, "k", kind=4)
    assert cache.get("k", "default") == "default"
    assert cache.stats()["tampered"] == 1


# -- values that cannot be serialized --------------------------------------------------


def unpicklable_values() -> list[Any]:
    return [lambda: 1, threading.Lock(), sqlite3.connect(":memory:"), (x for x in ())]


@pytest.mark.parametrize("value", unpicklable_values(),
                         ids=["lambda", "lock", "connection", "generator"])
def test_unserializable_value_raises_from_set_and_keeps_the_old_value(
    cache: ShardedSQLiteCache, value: Any
) -> None:
    with pytest.raises(Exception) as expected:
        pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
    cache.set("k", "previous")
    with pytest.raises(type(expected.value)):
        cache.set("k", value)
    with pytest.raises(type(expected.value)):
        cache.set("k", value, timeout=0)  # would delete: must not, since it fails
    with pytest.raises(type(expected.value)):
        cache.add("new", value)
    assert cache.get("k") == "previous"
    assert not cache.has_key("new")
    assert cache.stats()["sets"] == 1


@pytest.mark.parametrize("value", unpicklable_values(),
                         ids=["lambda", "lock", "connection", "generator"])
def test_unserializable_value_in_set_many_stores_nothing(
    cache: ShardedSQLiteCache, value: Any
) -> None:
    """set_many is all or nothing for serializer errors, on every shard."""
    old = {f"k{i}": f"old{i}" for i in range(20)}
    cache.set_many(old)
    batch: dict[str, Any] = {f"k{i}": f"new{i}" for i in range(20)}
    batch["k10"] = value
    batch["fresh"] = "fresh"
    with pytest.raises(Exception) as expected:
        pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
    with pytest.raises(type(expected.value)):
        cache.set_many(batch)
    with pytest.raises(type(expected.value)):
        cache.set_many(batch, timeout=0)
    assert cache.get_many(list(batch)) == old


def test_msgpack_cannot_pack_an_object_and_keeps_the_old_value(
    make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    cache = make_cache({"SERIALIZER": "msgpack"})
    cache.set("k", {"plain": "data"})
    with pytest.raises(TypeError):
        cache.set("k", object())
    with pytest.raises(TypeError):
        cache.set_many({"k": "new", "other": {1, 2}})
    assert cache.get("k") == {"plain": "data"}
    assert cache.get("other") is None


def test_tampered_row_is_not_there_for_has_key_but_blocks_add(
    cache: ShardedSQLiteCache
) -> None:
    """``has_key`` agrees with ``get`` (a row that fails its tag is a miss), but a
    live row blocks ``add`` whether or not it verifies: it may be the value of a
    process sealing with another key, and ``add`` is used as a lock."""
    for key in ("a", "b"):
        cache.set(key, "original")
        _, blob = stored_row(cache, key)
        damaged = bytearray(blob)
        damaged[-1] ^= 0x01
        overwrite(cache, key, value=bytes(damaged))
    assert cache.has_key("a") is False
    assert cache.stats()["tampered"] == 1
    assert stored_row(cache, "a") is not None  # left in place, like get() does
    assert cache.add("b", "fresh") is False
    assert cache.add("b", "fresh", timeout=0) is False  # Django: fails on a live row
    assert cache.get("b") is None
    overwrite(cache, "b", expires=1.0)  # once it has expired, add replaces it
    assert cache.add("b", "fresh") is True
    assert cache.get("b") == "fresh"
    assert cache.add("b", "again") is False


# -- the two tags ----------------------------------------------------------------


def test_long_payloads_carry_hmac_sha256_and_short_ones_blake2b() -> None:
    """SHA-256 from SHA_MIN bytes up (about half BLAKE2b's cost on a long row);
    BLAKE2b below, where it is cheaper."""
    sealer = Sealer(b"k" * 32)
    long, short = b"L" * SHA_MIN, b"S" * (SHA_MIN - 1)
    assert sealer.seal("key", long)[:TAG_SIZE] == sealer.tag_large("key", long, SERIALIZED)
    assert sealer.seal("key", short)[:TAG_SIZE] == sealer.tag("key", short, SERIALIZED)
    for payload in (long, short):
        sealed = sealer.seal("key", payload, RAW_BYTES)
        assert sealer.open("key", sealed, RAW_BYTES) == payload
        assert sealer.open("key", sealed, SERIALIZED) is None  # relabelled
        assert sealer.open("other", sealed, RAW_BYTES) is None  # moved to another key
        altered = sealed[:-1] + bytes([sealed[-1] ^ 1])
        assert sealer.open("key", altered, RAW_BYTES) is None
        assert Sealer(b"j" * 32).open("key", sealed, RAW_BYTES) is None  # another key


def test_a_long_row_sealed_with_blake2b_before_the_switch_still_verifies() -> None:
    """Rows written by format 4 (BLAKE2b at every length) stay readable after the
    upgrade; a forged one is refused under both tags."""
    sealer = Sealer(b"k" * 32)
    payload = b"P" * (SHA_MIN * 3)
    old = sealer.tag("key", payload, SERIALIZED) + payload
    assert sealer.open("key", old) == payload
    assert sealer.open("key", bytes(TAG_SIZE) + payload) is None


def test_rows_whose_text_is_not_utf8_are_one_miss_and_still_culled(
    make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    """Defect: a row whose value or key is TEXT that is not UTF-8 (written by
    another program, or altered) made the sqlite3 module raise while fetching,
    failing the whole statement: a get_many of that shard answered nothing, and
    the scans of culling and the sweep failed, so a one-shard cache grew past
    MAX_ENTRIES without end. Such a row is now one miss, and culled like any."""
    cache = make_cache({"SHARDS": 1, "MAX_ENTRIES": 30, "CULL_FREQUENCY": 3})
    cache.set_many({f"k{i}": f"v{i}" for i in range(5)})
    path = shard_path(cache, "k0")
    planted = b":1:planted\xff"
    with raw_shard(path) as conn:
        conn.execute("UPDATE cache SET value = CAST(X'FFFE41' AS TEXT), blob = NULL "
                     "WHERE key = ?", (cache.make_key("k0"),))
        conn.execute("INSERT INTO cache (key, expires, stored, created, kind, value, size) "
                     "SELECT CAST(? AS TEXT), NULL, 0, 0, kind, value, size FROM cache "
                     "WHERE key = ?", (planted, cache.make_key("k1")))
    assert cache.get("k0") is None
    assert cache.get_many(["k0", "k1", "k2"]) == {"k1": "v1", "k2": "v2"}
    assert cache.has_key("k2") and not cache.has_key("k0")
    for i in range(100):
        cache.set(f"n{i}", i)
    assert cache.get("n99") == 99
    with raw_shard(path) as conn:
        assert conn.execute("SELECT count(*) FROM cache").fetchone()[0] <= 31
        assert conn.execute("SELECT count(*) FROM cache WHERE key = CAST(? AS TEXT)",
                            (planted,)).fetchone()[0] == 0  # the oldest row: culled first
    cache.clear()
    with raw_shard(path) as conn:
        assert conn.execute("SELECT count(*) FROM cache").fetchone()[0] == 0


def test_released_file_names_that_are_not_utf8_are_collected(
    make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    """The same class for the names of released value files: a batch of names
    that are TEXT but not UTF-8 must be removed from the list, not read again
    for ever (a full batch of them made collection loop)."""
    from djcachebench.store.values import COLLECT_BATCH

    cache = make_cache({"SHARDS": 1})
    cache.set("k", "v")
    path = shard_path(cache, "k")
    with raw_shard(path) as conn:
        conn.executemany("INSERT INTO garbage (name, since) VALUES (CAST(? AS TEXT), 0)",
                         [(b"bad\xff" + str(i).encode(),) for i in range(COLLECT_BATCH + 5)])
    done = threading.Event()

    def reclaim() -> None:
        cache._store.reclaim()
        done.set()

    threading.Thread(target=reclaim, daemon=True).start()
    assert done.wait(30), "collection did not finish"
    with raw_shard(path) as conn:
        assert conn.execute("SELECT count(*) FROM garbage").fetchone()[0] == 0
    assert cache.get("k") == "v"


def test_the_sweep_goes_past_a_key_that_is_not_utf8(
    make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    """The sweep walks a shard's keys SWEEP_LIMIT at a time from the last key it
    saw. A key that is TEXT but not UTF-8 ending a step, bound back as a BLOB,
    sorted after every TEXT key: the next step found nothing and the sweep
    started over, so it never reached the keys after it."""
    import time

    from djcachebench.store.core import SWEEP_LIMIT

    cache = make_cache({"SHARDS": 1, "MAX_ENTRIES": None})
    before = SWEEP_LIMIT - 1
    cache.set_many({f"a{i:04d}": "live" for i in range(before)})
    cache.set_many({f"b{i:04d}": "soon gone" for i in range(40)}, timeout=0.2)
    path = shard_path(cache, "a0000")
    with raw_shard(path) as conn:  # sorts after every a-key, before every b-key
        conn.execute("INSERT INTO cache (key, expires, stored, created, kind, value, size) "
                     "VALUES (CAST(? AS TEXT), NULL, 0, 0, 4, x'00', 1)",
                     (b":1:a\xff",))
    time.sleep(0.3)
    store = cache._store
    for _ in range(3):
        store.run(0, store._sweep, 0)
    with raw_shard(path) as conn:
        assert conn.execute("SELECT count(*) FROM cache WHERE key LIKE ':1:b%'"
                            ).fetchone()[0] == 0
