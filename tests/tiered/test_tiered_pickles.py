"""A mutable value is pickled once per write and not at all per L1 fill, over
ShardedSQLiteCache: the engine hands over the verified pickle it stored or
read (``tiered_set``, ``tiered_get``), and the L1 keeps those bytes.

Why it matters: the L1 keeps a mutable value pickled (so that a caller who
mutates what it got cannot change what the next read returns); pickling it a
second time cost a write or a fill of a 10 KB dict about as much as the
engine's own work on it (docs/benchmarks.md).
"""

from __future__ import annotations

import math
import pickle
from pathlib import Path
from typing import Any

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.backends.tiered import TieredCache
from djcachebench.serializers import TAG_SIZE
from tests.sqlite.helpers import new_cache, raw_shard, shard_path

from .helpers import sqlite_tiered

PICKLINGS: list[str] = []


class Counted:
    """A mutable value that records each time it is pickled."""

    def __init__(self, items: list[int]) -> None:
        self.items = items

    def __reduce__(self) -> tuple[Any, ...]:
        PICKLINGS.append("pickled")
        return (Counted, (list(self.items),))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Counted) and other.items == self.items

    __hash__ = None  # type: ignore[assignment]


@pytest.fixture(autouse=True)
def _reset() -> None:
    PICKLINGS.clear()


@pytest.fixture
def pair(tmp_path: Path) -> tuple[TieredCache, TieredCache]:
    """Two L1s over one ShardedSQLiteCache: two processes, in one."""
    return sqlite_tiered(tmp_path), sqlite_tiered(tmp_path, L1_MAX_ENTRIES=9999)


def test_a_write_through_pickles_a_mutable_value_once(
        pair: tuple[TieredCache, TieredCache]) -> None:
    cache, _ = pair
    assert cache.write_through
    value = Counted([1, 2])
    cache.set("k", value)
    assert PICKLINGS == ["pickled"]  # by the engine; the L1 keeps its bytes
    value.items.append(3)  # the caller's object, changed after the write
    got = cache.get("k")
    assert got == Counted([1, 2]) and cache.stats()["l1_hits"] == 1
    got.items.append(4)  # what a read returned, changed
    assert cache.get("k") == Counted([1, 2])
    assert cache.stats()["l1_hits"] == 2


def test_an_l1_fill_pickles_nothing(pair: tuple[TieredCache, TieredCache]) -> None:
    cache, other = pair
    other.set("k", Counted([7]))
    PICKLINGS.clear()
    got = cache.get("k")  # from the engine, into this L1
    assert got == Counted([7]) and cache.stats()["l2_hits"] == 1
    assert PICKLINGS == []
    got.items.append(8)
    again = cache.get("k")
    assert again == Counted([7]) and cache.stats()["l1_hits"] == 1
    again.items.append(9)
    assert cache.get("k") == Counted([7])


def test_a_large_mutable_value_from_a_value_file_is_kept_as_its_pickle(
        pair: tuple[TieredCache, TieredCache]) -> None:
    cache, other = pair
    value = {"rows": [[i, "x" * 40] for i in range(2000)]}  # a pickle of ~100 KB: a file
    other.set("big", value)
    got = cache.get("big")
    assert got == value and cache.stats()["l2_hits"] == 1
    got["rows"].clear()
    assert cache.get("big") == value and cache.stats()["l1_hits"] == 1


# -- the engine's side: what it hands over, and when it hands nothing ----------------


@pytest.fixture
def engine(tmp_path: Path) -> ShardedSQLiteCache:
    return new_cache(tmp_path / "c")


@pytest.mark.parametrize("value", [{"a": [1]}, [1, 2], {"big": "y" * 50_000}, True, 2**70],
                         ids=["dict", "list", "in-a-file", "bool", "past-64-bits"])
def test_the_engine_hands_over_the_pickle_it_stored_and_read(
        engine: ShardedSQLiteCache, value: Any) -> None:
    stored = engine.tiered_set("k", value, None)
    assert type(stored) is bytes and pickle.loads(stored) == value
    got, expires, read = engine.tiered_get("k")
    assert got == value and expires == math.inf
    assert read == stored


@pytest.mark.parametrize("value", [b"raw", "text", 42], ids=["bytes", "str", "int"])
def test_a_value_stored_raw_has_no_pickle(engine: ShardedSQLiteCache, value: Any) -> None:
    assert engine.tiered_set("k", value) is None
    assert engine.tiered_get("k")[::2] == (value, None)


def test_no_pickle_for_a_miss_an_expired_write_or_another_serializer(
        engine: ShardedSQLiteCache, tmp_path: Path) -> None:
    assert engine.tiered_get("absent", "dflt") == ("dflt", None, None)
    assert engine.tiered_set("gone", {"a": 1}, 0) is None  # expires at once: not stored
    assert engine.tiered_get("gone") == (None, None, None)
    packed = new_cache(tmp_path / "m", {"SERIALIZER": "msgpack"})
    assert packed.tiered_set("k", {"a": [1]}) is None
    got, _, pickled = packed.tiered_get("k")
    assert got == {"a": [1]} and pickled is None


def test_altered_bytes_hand_over_nothing_and_are_never_unpickled(
        engine: ShardedSQLiteCache, tmp_path: Path) -> None:
    engine.tiered_set("k", {"a": 1})
    marker = tmp_path / "unpickled"
    final = engine.make_key("k")
    with raw_shard(shard_path(engine, "k")) as conn:
        (blob,) = conn.execute("SELECT value FROM cache WHERE key = ?", (final,)).fetchone()
        forged = blob[:TAG_SIZE] + pickle.dumps(_Touch(marker))
        conn.execute("UPDATE cache SET value = ? WHERE key = ?", (forged, final))
    assert engine.tiered_get("k", "dflt") == ("dflt", None, None)
    assert not marker.exists()


class _Touch:
    """Unpickling it creates ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.path,))
