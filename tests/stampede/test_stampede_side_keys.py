"""The stampede lease and the early-refresh note live beside the caller's keys,
and a caller's own key must never be taken for one of them.

Before the fix they were ``djcb-lease:<key>`` and ``djcb-xfetch:<key>`` at the
caller's version: a key a site stores because a visitor chose it (a slug, a
search term, ``get_or_set(request.GET["q"], ...)``) could be the lease of a
popular key. Then every ``get_or_set`` of that key waited the whole bound (twice
the lease) before computing it itself, for as long as the planted value lived;
and a planted note made every hit recompute. Both tests fail on the code before
the fix. Now the side keys have a version of their own, which no key the site
passes at its versions can reach (docs/architecture.md, "get_or_set without a
stampede").
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any

import pytest
from django.core.cache.backends.base import CacheKeyWarning

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.backends.tiered import TieredCache
from djcachebench.stampede import LEASE_PREFIX, XFETCH_PREFIX, side_key
from tests.tiered.helpers import SQLITE, sqlite_tiered


@pytest.fixture(params=["sqlite", "tiered"])
def cache(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    options = {"STAMPEDE_LEASE": 1, "EARLY_REFRESH": 1.0}
    if request.param == "sqlite":
        return ShardedSQLiteCache(str(tmp_path / "store"), {"OPTIONS": options})
    return sqlite_tiered(tmp_path, **options)


class Counter:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        return f"v{self.calls}"


def test_a_stored_key_named_like_a_lease_does_not_hold_get_or_set(cache: Any) -> None:
    # What a visitor's choice of key would store: the lease key's text.
    cache.get_or_set(LEASE_PREFIX + "popular", lambda: "search results", 300)
    compute = Counter()
    started = time.monotonic()
    assert cache.get_or_set("popular", compute, 300) == "v1"
    assert time.monotonic() - started < 0.5  # the bound is 2 s: it did not wait for it
    assert compute.calls == 1
    assert cache.get(LEASE_PREFIX + "popular") == "search results"  # and it is untouched


def test_a_stored_key_named_like_a_note_does_not_refresh_every_hit(cache: Any) -> None:
    compute = Counter()
    assert cache.get_or_set("popular", compute, 300) == "v1"
    # A note as early refresh writes one: computed for ages, expired long ago.
    cache.set(XFETCH_PREFIX + "popular", (1e6, 0.0), 300)
    for _ in range(5):
        assert cache.get_or_set("popular", compute, 300) == "v1"
    assert compute.calls == 1


def test_the_side_keys_are_where_side_key_says(cache: Any) -> None:
    """Early refresh notes the computation under ``side_key``, at a version of
    its own, and the lease is gone there once the value is stored."""
    cache.get_or_set("k", Counter(), 300)
    note_key, side = side_key(cache, XFETCH_PREFIX, "k")
    noted = cache.get(note_key, version=side)
    assert isinstance(noted, (tuple, list)) and len(noted) == 3
    assert cache.get(XFETCH_PREFIX + "k") is None
    lease_key, side = side_key(cache, LEASE_PREFIX, "k")
    assert cache.get(lease_key, version=side) is None


def int_version_key(key: str, key_prefix: str, version: Any) -> str:
    """A KEY_FUNCTION as many sites write one: the version formatted as a number."""
    return "%s:%d:%s" % (key_prefix, version, key)  # noqa: UP031 (the point: %d raises on str)


@pytest.mark.parametrize("where", ["sqlite", "tiered", "tiered-l2"])
def test_a_key_function_that_formats_the_version_as_a_number(
        where: str, tmp_path: Path) -> None:
    """The side keys' version is an int of their own, not a string such as
    ``1-djcb``: with such a key function every ``get_or_set`` of a missing key
    would raise TypeError."""
    func = {"KEY_FUNCTION": f"{__name__}.int_version_key", "OPTIONS": {"STAMPEDE_LEASE": 1}}
    if where == "sqlite":
        cache: Any = ShardedSQLiteCache(str(tmp_path / "store"), func)
    elif where == "tiered":
        cache = TieredCache("", {**func, "OPTIONS": {
            "STAMPEDE_LEASE": 1, "L2": {"BACKEND": SQLITE, "LOCATION": str(tmp_path / "s")}}})
    else:  # the key function is the L2's: the side keys reach it through TieredCache
        cache = TieredCache("", {"OPTIONS": {"STAMPEDE_LEASE": 1, "L2": {
            "BACKEND": SQLITE, "LOCATION": str(tmp_path / "s"), **func}}})
    compute = Counter()
    assert cache.get_or_set("k", compute, 300) == "v1"
    assert cache.get_or_set("k", compute, 300) == "v1"
    assert cache.get_or_set("j", compute, 300, version=7) == "v2"
    assert compute.calls == 2
    # And still a version of their own: no int a site uses reaches it.
    assert side_key(cache, LEASE_PREFIX, "k")[1] < -(2**31) + 1


def test_a_key_django_warns_about_warns_only_as_the_callers_key(cache: Any) -> None:
    """A key with a space makes ``get_or_set`` warn about the caller's key only,
    not about the lease and failure side keys too (``djcb-lease:sp ace``)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cache.get_or_set("sp ace", Counter(), 300) == "v1"
    messages = [str(w.message) for w in caught if issubclass(w.category, CacheKeyWarning)]
    assert messages and all("djcb" not in m for m in messages), messages
    assert all("sp ace" in m for m in messages), messages
