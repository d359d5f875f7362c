"""Which adapter (``djcachebench/tiered/l2/``) answers for an L2.

A backend's exact class gets its family's adapter; a subclass gets the generic
one (or its family's ``descendant``, which keeps only what belongs to the
store), unless it declares the capabilities ``tiered_failure_count()`` and
``tiered_returns_what_was_set`` itself. Real backends, real servers.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pytest
from django.core.cache.backends.db import DatabaseCache
from django.core.cache.backends.dummy import DummyCache
from django.core.cache.backends.filebased import FileBasedCache
from django.core.cache.backends.locmem import LocMemCache
from django.core.cache.backends.memcached import PyLibMCCache
from django.core.cache.backends.redis import RedisCache

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.backends.tiered import TieredCache
from djcachebench.tiered.l2 import adapter_class, adapter_for
from djcachebench.tiered.l2.database import DatabaseAdapter, DatabaseDescendant
from djcachebench.tiered.l2.diskcache import DiskCacheAdapter
from djcachebench.tiered.l2.filebased import FileBasedAdapter, FileBasedDescendant
from djcachebench.tiered.l2.generic import GenericAdapter
from djcachebench.tiered.l2.locmem import LocMemAdapter, ProcessLocalAdapter
from djcachebench.tiered.l2.memcached import MemcachedDescendant, PyLibMCAdapter
from djcachebench.tiered.l2.nested import NestedTieredAdapter
from djcachebench.tiered.l2.redis import DjangoRedisAdapter, DjangoRedisCoreAdapter, RedisDescendant
from djcachebench.tiered.l2.sqlite import SQLiteAdapter, SQLiteDescendant
from tests.tiered.helpers import locmem_tiered


class _LocMem(LocMemCache):
    pass


class _Declaring(LocMemCache):
    """A subclass that states what the L1 needs to know of it."""

    tiered_returns_what_was_set = True

    def tiered_failure_count(self) -> int:
        return 0


class _Files(FileBasedCache):
    pass


class _Rows(DatabaseCache):
    pass


class _Redis(RedisCache):
    pass


class _Memcached(PyLibMCCache):
    pass


class _SQLite(ShardedSQLiteCache):
    pass


class _Tiered(TieredCache):
    pass


def test_each_exact_class_gets_its_family_adapter(
        tmp_path: Path, redis_server: Any, memcached_server: Any) -> None:
    from diskcache import DjangoCache
    from django_redis.cache import RedisCache as DjangoRedisCache

    built = {
        LocMemAdapter: LocMemCache("here", {}),
        ProcessLocalAdapter: DummyCache("here", {}),
        FileBasedAdapter: FileBasedCache(str(tmp_path / "files"), {}),
        DatabaseAdapter: DatabaseCache("cache_table", {}),
        DiskCacheAdapter: DjangoCache(str(tmp_path / "disk"), {}),
        SQLiteAdapter: ShardedSQLiteCache(str(tmp_path / "sqlite"), {}),
        DjangoRedisCoreAdapter: RedisCache(redis_server.location, {}),
        DjangoRedisAdapter: DjangoRedisCache(redis_server.location, {}),
        PyLibMCAdapter: PyLibMCCache(memcached_server.location, {}),
        NestedTieredAdapter: locmem_tiered(tmp_path),
    }
    for expected, l2 in built.items():
        assert type(adapter_for(l2)) is expected, type(l2)
        path = f"{type(l2).__module__}.{type(l2).__qualname__}"
        assert adapter_class(path) is expected


def test_a_subclass_gets_the_generic_answers_for_its_values(
        tmp_path: Path, redis_server: Any, memcached_server: Any) -> None:
    built = {
        ProcessLocalAdapter: _LocMem("here", {}),
        FileBasedDescendant: _Files(str(tmp_path / "files"), {}),
        DatabaseDescendant: _Rows("cache_table", {}),
        RedisDescendant: _Redis(redis_server.location, {}),
        MemcachedDescendant: _Memcached(memcached_server.location, {}),
        SQLiteDescendant: _SQLite(str(tmp_path / "sqlite"), {}),
        GenericAdapter: _Tiered("", {"OPTIONS": {"L2": {"BACKEND": LocMemCache.__module__
                                                          + ".LocMemCache",
                                                          "LOCATION": str(tmp_path / "t")},
                                                   "GENERATION_PATH": str(tmp_path / "g")}}),
    }
    for expected, l2 in built.items():
        adapter = adapter_for(l2)
        assert type(adapter) is expected, type(l2)
        assert isinstance(adapter, GenericAdapter)
        assert adapter.read_back_differs() is None
        assert adapter.inline_sender(None) is None
        if not isinstance(l2, ShardedSQLiteCache | TieredCache):  # those declare their own
            assert adapter.failure_probe() is None
            assert adapter.returns_what_was_set() is False
            assert adapter.expiry_reader() is None


def test_a_subclass_keeps_what_belongs_to_its_store(tmp_path: Path,
                                                    memcached_server: Any) -> None:
    assert adapter_for(_LocMem("here", {})).process_local
    assert adapter_for(_SQLite(str(tmp_path / "sqlite"), {})).one_host is not None
    memcached = adapter_for(_Memcached(memcached_server.location, {}))
    assert memcached.default_port == 11211
    # The server keeps whole seconds, less one on its once-a-second clock.
    assert memcached.written_expiry()(2.5, 100.0) == 101.0
    assert adapter_for(_LocMem("here", {})).written_expiry()(2.5, 100.0) == 101.0
    assert adapter_for(LocMemCache("here", {})).written_expiry()(2.5, 100.0) == 102.5


def test_a_subclass_that_declares_the_capabilities_is_taken_at_its_word() -> None:
    l2 = _Declaring("declaring", {})
    adapter = adapter_for(l2)
    assert type(adapter) is ProcessLocalAdapter  # not LocMemCache's own adapter
    assert adapter.failure_probe() == l2.tiered_failure_count
    assert adapter.returns_what_was_set() is True
    assert adapter.expiry_reader() is None  # nothing declared, nothing guessed


def test_the_exact_class_adapter_reads_what_the_backend_keeps(
        tmp_path: Path, redis_server: Any) -> None:
    redis = RedisCache(redis_server.location, {})
    redis.set("adapters-k", "v", 30)
    value, expires = adapter_for(redis).expiry_reader()("adapters-k", None, None)
    assert value == "v" and expires is not None and 0 < expires - time.time() <= 30
    locmem = LocMemCache("adapters", {})
    locmem.set("k", [1], None)
    assert adapter_for(locmem).expiry_reader()("k", None, None) == ([1], math.inf)
    redis.delete("adapters-k")


def test_a_tiered_cache_over_another_asks_the_store_beneath(tmp_path: Path) -> None:
    tiered = locmem_tiered(tmp_path)
    assert type(tiered.l2_adapter) is LocMemAdapter
    assert tiered.l2_adapter.l2 is tiered.l2
    outer = TieredCache("", {"OPTIONS": {
        "L2": {"BACKEND": "djcachebench.backends.tiered.TieredCache",
               "OPTIONS": tiered_options(tmp_path)},
        "GENERATION_PATH": str(tmp_path / "outer.mmap")}})
    assert type(outer.l2_adapter) is NestedTieredAdapter
    # Over a TieredCache, what is known of the store beneath.
    assert outer.l2_adapter.returns_what_was_set() is True


def tiered_options(tmp_path: Path) -> dict[str, Any]:
    return {"L2": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                   "LOCATION": str(tmp_path / "inner")},
            "GENERATION_PATH": str(tmp_path / "inner.mmap")}


@pytest.mark.parametrize("backend", ["not.a.Backend", ""])
def test_a_backend_that_cannot_be_imported_is_generic(backend: str) -> None:
    assert adapter_class(backend) is GenericAdapter
