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
