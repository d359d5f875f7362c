"""A row whose columns another program rewrote with values of another SQL type.

After ``UPDATE cache SET expires = 'abc'`` (or ``stored``, or ``size`` of a
value kept in a file), get, get_many, has_key, touch, delete and incr of the key
must not raise ``TypeError``, and a get_many that includes the key must keep the
other keys' answers. The failure table (docs/settings.md) promises a miss
(``store/statements.py``: the numbers of a row are read back as numbers).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.backends.tiered import TieredCache

from .helpers import shard_path

SQLITE = "djcachebench.backends.sqlite.ShardedSQLiteCache"
VALUES = {"small": "v", "number": 5, "pickled": {"a": [1, 2]}, "large": "z" * 40_000}
ALTERED = [("expires", "abc"), ("expires", b"\x01"), ("stored", "abc"), ("stored", b"\x01"),
           ("stored", 1.5), ("size", "abc"), ("size", b"x"), ("size", 2.5),
           ("kind", "x"), ("file", 7), ("value", 12), ("value", 1.5), ("blob", "abc")]


def _alter(cache: ShardedSQLiteCache, key: str, column: str, value: Any) -> None:
    conn = sqlite3.connect(shard_path(cache, key), isolation_level=None)
    try:
        conn.execute(f"UPDATE cache SET {column} = ? WHERE key = ?",
                     (value, cache.make_key(key)))
    finally:
        conn.close()


@pytest.mark.parametrize(("column", "value"), ALTERED)
def test_an_altered_row_is_a_miss_and_never_raises(tmp_path: Path, column: str,
                                                   value: Any) -> None:
    cache = ShardedSQLiteCache(str(tmp_path / "c"), {"OPTIONS": {"SHARDS": 1}})
    for key, stored in VALUES.items():
        cache.set(key, stored)
        cache.set("other", "kept")
        _alter(cache, key, column, value)
        got = cache.get(key, "MISS")
        assert got in ("MISS", stored), (key, got)  # never another value
        many = cache.get_many([key, "other"])
        assert many.get("other") == "kept"
        assert many.get(key, stored) == stored
        # The answers agree with get: a miss cannot be touched or counted on.
        present = cache.has_key(key)
        assert present == (got != "MISS")
        assert cache.touch(key, 100) == present
        if not present and not cache.add(key, "fresh"):
            # A live row whose value does not verify blocks add (documented,
            # docs/settings.md, failure table); set replaces it.
            assert column in ("kind", "file", "value", "blob", "size")
            cache.set(key, "fresh")
        if not present:
            assert cache.get(key) == "fresh"
        cache.delete(key)
        assert cache.get(key) is None
        cache.set(key, stored)
        assert cache.get(key) == stored


@pytest.mark.parametrize(("column", "value"), ALTERED)
def test_counters_sweeps_culls_and_clear_survive_an_altered_row(tmp_path: Path, column: str,
                                                                value: Any) -> None:
    cache = ShardedSQLiteCache(str(tmp_path / "c"),
                               {"OPTIONS": {"SHARDS": 1, "MAX_ENTRIES": 30,
                                            "CULL_FREQUENCY": 3}})
    cache.set("n", 1)
    _alter(cache, "n", column, value)
    try:
        assert cache.incr("n") == 2  # the row was whole after all (kind, blob)
    except ValueError:
        assert cache.get("n") is None  # a miss: Django's ValueError for a missing key
    for i in range(200):  # sweeps and culls walk past the row
        cache.set(f"k{i}", i, timeout=0.001 if i % 2 else None)
    assert cache.get("k198") == 198
    cache.clear()
    assert cache.get("n") is None


def test_tiered_reads_an_altered_row_of_its_l2_as_a_miss(tmp_path: Path) -> None:
    tiered = TieredCache("", {"OPTIONS": {"L2": {"BACKEND": SQLITE,
                                                 "LOCATION": str(tmp_path / "c"),
                                                 "OPTIONS": {"SHARDS": 1}}}})
    store = ShardedSQLiteCache(str(tmp_path / "c"), {"OPTIONS": {"SHARDS": 1}})
    store.set("victim", "v")
    store.set("good", "g")
    _alter(store, "victim", "expires", "abc")
    assert tiered.get("victim") is None
    assert tiered.get_many(["victim", "good"]) == {"good": "g"}
