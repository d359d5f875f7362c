"""Fixtures of the ShardedSQLiteCache tests (``tests/sqlite/``): a cache directory and
caches on it, closed at teardown. Helper functions are in ``tests/sqlite/helpers.py``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache

from .helpers import new_cache


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    """A LOCATION that does not exist yet (the backend creates it)."""
    return tmp_path / "cache"


@pytest.fixture
def make_cache(cache_dir: Path) -> Iterator[Callable[..., ShardedSQLiteCache]]:
    """Factory of caches on ``cache_dir`` (or another location); closes them at teardown."""
    made: list[ShardedSQLiteCache] = []

    def make(options: dict[str, Any] | None = None, location: Path | str | None = None,
             **params: Any) -> ShardedSQLiteCache:
        cache = new_cache(cache_dir if location is None else location, options, **params)
        made.append(cache)
        return cache

    yield make
    for cache in made:
        with contextlib.suppress(Exception):
            cache.close_connections()


@pytest.fixture
def cache(make_cache: Callable[..., ShardedSQLiteCache]) -> ShardedSQLiteCache:
    """A cache with the default options (8 shards, MAX_ENTRIES 300)."""
    return make_cache()
