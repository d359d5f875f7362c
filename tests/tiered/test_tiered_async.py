"""TieredCache's async writes of many keys answer what the sync ones answer, and
``aget_many`` answers in the order asked: Django's defaults loop over
``aset``/``adelete`` and return ``[]``/None whatever the L2 says, and answering
from the L1 first would put its hits first."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from djcachebench.backends.tiered import TieredCache

from .helpers import SQLITE, locmem_tiered


def _over_one_shard(tmp_path: Path) -> TieredCache:
    return TieredCache("", {"OPTIONS": {"L2": {
        "BACKEND": SQLITE, "LOCATION": str(tmp_path / "s"),
        "OPTIONS": {"SHARDS": 1, "LOCK_TIMEOUT": 0.02, "RETRIES": 0}}}})


def test_aset_many_returns_the_keys_the_l2_failed_to_write(tmp_path: Path) -> None:
    cache = _over_one_shard(tmp_path)
    cache.set("a", "old")
    holder = sqlite3.connect(next((tmp_path / "s").glob("shard-*.sqlite3")), timeout=0,
                             isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # another process writing, for longer than the bound
        assert cache.set_many({"a": 1, "b": 2}) == ["a", "b"]
        assert asyncio.run(cache.aset_many({"a": 1, "b": 2})) == ["a", "b"]
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert cache.get("a") is None and cache.get("b") is None  # a failed set leaves no value
    assert asyncio.run(cache.aset_many({"a": 1, "b": 2})) == []
    assert cache.get_many(["a", "b"]) == {"a": 1, "b": 2}


def test_adelete_many_returns_what_delete_many_returns(tmp_path: Path) -> None:
    cache = locmem_tiered(tmp_path)
    cache.set_many({"a": 1, "b": 2})
    assert cache.get("a") == 1  # in the L1
    returned = asyncio.run(cache.adelete_many(["a", "b"]))
    assert returned == cache.delete_many(["a"])  # None for Django's own L2s
    assert cache.get_many(["a", "b"]) == {}


def test_aget_many_answers_in_the_order_asked(tmp_path: Path) -> None:
    cache = locmem_tiered(tmp_path)
    writer = locmem_tiered(tmp_path, L1_MAX_ENTRIES=99)  # another process
    writer.set_many({"a": 1, "b": 2, "c": 3})
    assert cache.get("b") == 2 and cache.get("c") == 3  # "b" and "c" now in this L1
    got = asyncio.run(cache.aget_many(["a", "b", "c", "absent"]))
    assert list(got.items()) == [("a", 1), ("b", 2), ("c", 3)]
    assert list(cache.get_many(["a", "b", "c"])) == ["a", "b", "c"]
