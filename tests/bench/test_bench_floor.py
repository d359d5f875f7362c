"""The sqlite-floor instrument: the few calls the harness makes behave as a cache's."""

from __future__ import annotations

from pathlib import Path

from djcachebench.bench.floor import SHARDS, BareSQLiteCache


def test_get_set_delete_clear_and_sharing_through_the_files(tmp_path: Path) -> None:
    one = BareSQLiteCache(str(tmp_path / "bare"), {})
    other = BareSQLiteCache(str(tmp_path / "bare"), {})  # another process, in effect
    keys = [b"key%d" % i for i in range(50)]
    for key in keys:
        one.set(key, key * 2)
    assert len(list((tmp_path / "bare").glob("bare-*.sqlite3"))) == SHARDS
    assert [other.get(k) for k in keys] == [k * 2 for k in keys]
    one.set(keys[0], b"new")
    assert other.get(keys[0]) == b"new"
    assert other.delete(keys[0]) is True
    assert one.delete(keys[0]) is False
    assert one.get(keys[0], "absent") == "absent"
    other.clear()
    assert all(one.get(k) is None for k in keys)


def test_values_sqlite_cannot_bind_are_pickled_and_set_many_writes_all(tmp_path: Path) -> None:
    import datetime as dt
    from decimal import Decimal

    cache = BareSQLiteCache(str(tmp_path / "bare"), {})
    rows = [{"id": 1, "at": dt.datetime(2024, 1, 1), "price": Decimal("1.50")}]
    cache.set("rows", rows)
    cache.set("blob", b"\x80\x05raw")  # looks like a pickle, is not one
    cache.set("count", 41)
    assert cache.get("rows") == rows
    assert cache.get("blob") == b"\x80\x05raw"
    assert cache.incr("count") == 42 and cache.get("count") == 42
    data = {f"k{i}": {"n": i} if i % 2 else f"v{i}" for i in range(500)}
    assert cache.set_many(data) == []
    assert all(cache.get(k) == v for k, v in data.items())
