"""A failing L2: errors surface as the L2 reports them; L1 is never filled from them."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any, ClassVar

import pytest
from django.core.cache.backends.locmem import LocMemCache

from djcachebench.backends.tiered import TieredCache


class FlakyCache(LocMemCache):
    """LocMemCache that raises ConnectionError from the operations named in ``failing``."""

    failing: ClassVar[set[str]] = set()
    # A subclass is not trusted by TieredCache unless it says how it fails:
    # this one raises on every failure, and stores values by pickling them.
    tiered_returns_what_was_set = True

    def tiered_failure_count(self) -> int:
        return 0

    def _maybe_fail(self, op: str) -> None:
        if op in self.failing:
            raise ConnectionError(f"L2 down during {op}")

    def get(self, *args: Any, **kwargs: Any) -> Any:
        self._maybe_fail("get")
        return super().get(*args, **kwargs)

    def get_many(self, *args: Any, **kwargs: Any) -> Any:
        self._maybe_fail("get_many")
        return super().get_many(*args, **kwargs)

    def set(self, *args: Any, **kwargs: Any) -> Any:
        super().set(*args, **kwargs)  # fails *after* writing: the worst case
        self._maybe_fail("set")

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        self._maybe_fail("delete")
        return super().delete(*args, **kwargs)


def flaky_tiered(tmp_path: Path, **options: Any) -> TieredCache:
    opts = {"L2": {"BACKEND": f"{__name__}.FlakyCache", "LOCATION": str(tmp_path)},
            "GENERATION_PATH": str(tmp_path / "g"), **options}
    return TieredCache("", {"OPTIONS": opts})


@pytest.fixture
def flaky(tmp_path: Path) -> Any:
    FlakyCache.failing = set()
    yield flaky_tiered(tmp_path)
    FlakyCache.failing = set()


def test_failed_read_raises_and_fills_nothing(flaky: TieredCache, tmp_path: Path) -> None:
    flaky_tiered(tmp_path, L1_MAX_ENTRIES=99).set("k", "v")  # another process's write
    FlakyCache.failing = {"get", "get_many"}
    with pytest.raises(ConnectionError, match="during get"):
        flaky.get("k")
    with pytest.raises(ConnectionError, match="during get_many"):
        flaky.get_many(["k"])
    assert flaky.stats()["l1_entries"] == 0
    FlakyCache.failing = set()
    assert flaky.get("k") == "v"
    assert flaky.stats()["l1_entries"] == 1


def test_failed_write_still_drops_the_l1_entry(flaky: TieredCache) -> None:
    flaky.set("k", "old")
    flaky.get("k")
    assert flaky.stats()["l1_hits"] == 1
    FlakyCache.failing = {"set"}
    with pytest.raises(ConnectionError):
        flaky.set("k", "new")  # the L2 may hold "new" now: L1 must not answer "old"
    FlakyCache.failing = set()
    assert flaky.get("k") == "new"
    assert flaky.stats()["l1_hits"] == 1 and flaky.stats()["l2_hits"] == 1


def test_failed_delete_still_drops_the_l1_entry(flaky: TieredCache) -> None:
    flaky.set("k", "v")
    flaky.get("k")
    FlakyCache.failing = {"delete", "get"}
    with pytest.raises(ConnectionError):
        flaky.delete("k")
    with pytest.raises(ConnectionError):
        flaky.get("k")  # not served from L1: the read goes to the (failing) L2


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_django_redis_down_is_reported_as_django_redis_reports_it(tmp_path: Path) -> None:
    pytest.importorskip("django_redis")
    # django-redis re-raises the redis client's own error unless IGNORE_EXCEPTIONS.
    from redis.exceptions import ConnectionError as RedisConnectionError

    location = f"redis://127.0.0.1:{_closed_port()}/0"
    common = {"GENERATION_PATH": str(tmp_path / "g")}
    strict = TieredCache("", {"OPTIONS": {**common, "L2": {
        "BACKEND": "django_redis.cache.RedisCache", "LOCATION": location,
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1}}}})
    with pytest.raises(RedisConnectionError):
        strict.get("k")
    with pytest.raises(RedisConnectionError):
        strict.set("k", "v")
    lenient = TieredCache("", {"OPTIONS": {**common, "L2": {
        "BACKEND": "django_redis.cache.RedisCache", "LOCATION": location,
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "IGNORE_EXCEPTIONS": True}}}})
    assert lenient.get("k", "dflt") == "dflt"  # django-redis turns it into a miss
    assert lenient.stats()["misses"] == 1 and lenient.stats()["l1_entries"] == 0


# -- failures an L2 hides: no cached absence, no write-through ---------------------


class MaskingCache(LocMemCache):
    """An L2 unknown to TieredCache that, like many, turns failures into misses."""

    def get(self, key: Any, default: Any = None, version: Any = None) -> Any:
        if "get" in FlakyCache.failing:
            return default  # "it failed, call it a miss"
        return super().get(key, default, version)


def test_unknown_l2_gets_neither_cached_absence_nor_write_through(tmp_path: Path) -> None:
    opts = {"L2": {"BACKEND": f"{__name__}.MaskingCache", "LOCATION": str(tmp_path)},
            "GENERATION_PATH": str(tmp_path / "g")}
    c = TieredCache("", {"OPTIONS": opts})
    c.set("k", "v")
    assert c.get("nope") is None and c.get("nope") is None
    assert c.get("k") == "v"
    s = c.stats()
    assert (s["l1_misses"], s["l2_misses"], s["l1_hits"], s["l2_hits"]) == (0, 2, 0, 1)


def test_sqlite_give_up_is_not_cached_as_absence(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from djcachebench.store.retry import ShardLockTimeout
    from tests.tiered.helpers import sqlite_tiered

    c = sqlite_tiered(tmp_path)
    c.set("k", "v")
    reader = sqlite_tiered(tmp_path, L1_MAX_ENTRIES=99)  # another process: L1 is cold
    store = reader.l2._store

    def locked(key: str, *_: Any) -> Any:
        store.stats.give_ups += 1  # what the engine counts when it gives up
        raise ShardLockTimeout("shard-000.sqlite3", 0.25)

    monkeypatch.setattr(reader.l2._store, "get", locked)
    monkeypatch.setattr(reader.l2._store, "get_with_expiry", locked)
    assert reader.get("k") is None  # reported as the backend reports it: a miss
    monkeypatch.undo()
    assert reader.get("k") == "v", "the masked failure must not have been cached as absence"


def test_msgpack_l2_gets_no_write_through(tmp_path: Path) -> None:
    from tests.tiered.helpers import SQLITE

    opts = {"L2": {"BACKEND": SQLITE, "LOCATION": str(tmp_path / "s"),
                   "OPTIONS": {"SERIALIZER": "msgpack"}}}
    c = TieredCache("", {"OPTIONS": opts})
    c.set("t", (1, 2))
    assert c.get("t") == [1, 2]  # what the L2 gives back, not the tuple that was set
    assert c.get("t") == [1, 2]
    assert c.stats()["l2_hits"] == 1 and c.stats()["l1_hits"] == 1
