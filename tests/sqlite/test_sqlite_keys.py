"""Key making: the memo of made keys never changes a key nor swallows a warning."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
from django.core.cache.backends.base import CacheKeyWarning

from djcachebench.backends.sqlite import ShardedSQLiteCache


def test_made_keys_are_djangos(cache: ShardedSQLiteCache) -> None:
    for _ in range(2):  # the second round is served by the memo
        assert cache.make_and_validate_key("k") == ":1:k"
        assert cache.make_and_validate_key("k", version=3) == ":3:k"


def test_bytes_and_numeric_keys_are_made_as_django_makes_them(
    cache: ShardedSQLiteCache,
) -> None:
    """bytes keys are memoised (the benchmark's keys are bytes); keys that are equal
    across types (1 == 1.0 == True) must still each get Django's own made key."""
    for _ in range(2):  # the second round is served by the memo where it applies
        assert cache.make_and_validate_key(b"k") == ":1:b'k'"
        assert cache.make_and_validate_key("k") == ":1:k"
        for key, made in ((1, ":1:1"), (1.0, ":1:1.0"), (True, ":1:True")):
            assert cache.make_and_validate_key(key) == made
    cache.set(b"k", "bytes")
    cache.set("k", "str")
    assert (cache.get(b"k"), cache.get("k")) == ("bytes", "str")


def test_keys_past_the_memo_are_djangos(cache: ShardedSQLiteCache) -> None:
    """More keys than the memo holds (it empties when full): every made key, from
    the memo or made afresh, is still Django's, for str and bytes keys, with any
    prefix and version."""
    from django.core.cache.backends.base import BaseCache

    from djcachebench.keys import MEMO_SIZE

    cache.key_prefix = "site"
    keys = [f"user:{i}" for i in range(MEMO_SIZE + 500)] + [b"b%d" % i for i in range(300)]
    for version in (None, 7):
        for _ in range(2):
            for key in keys:
                assert cache.make_and_validate_key(key, version) == \
                    BaseCache.make_and_validate_key(cache, key, version)


def test_a_bad_key_warns_on_every_call(cache: ShardedSQLiteCache) -> None:
    for _ in range(3):
        with pytest.warns(CacheKeyWarning):
            cache.set("has space", 1)
        with pytest.warns(CacheKeyWarning):
            cache.get("x" * 300)
        with pytest.warns(CacheKeyWarning):
            cache.get(b"has space")


def test_prefix_and_version_changed_at_run_time_are_honoured(
    cache: ShardedSQLiteCache,
) -> None:
    cache.set("k", "one")
    assert cache.make_and_validate_key("k") == ":1:k"
    cache.key_prefix = "p"
    assert cache.make_and_validate_key("k") == "p:1:k"
    assert cache.get("k") is None
    cache.version = 2
    assert cache.make_and_validate_key("k") == "p:2:k"
    cache.key_prefix, cache.version = "", 1
    assert cache.get("k") == "one"


calls: list[Any] = []


def counting_key_func(key: str, key_prefix: str, version: int) -> str:
    calls.append(key)
    return f"{key_prefix}-{version}-{key}"


def test_a_custom_key_function_is_called_every_time(
    make_cache: Callable[..., ShardedSQLiteCache],
) -> None:
    custom = make_cache(KEY_FUNCTION=counting_key_func)
    calls.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        custom.set("k", 1)
        assert custom.get("k") == 1
        assert custom.get("k") == 1
    assert calls == ["k", "k", "k"]


def test_the_key_memo_keeps_a_sample_over_many_keys_and_grows_back(
    cache: ShardedSQLiteCache,
) -> None:
    """Before the memo judged its hit rate it filled to MEMO_SIZE over any key set;
    now a spread of keys leaves a hash sample in it, and a hot set regrows it."""
    from django.core.cache.backends.base import BaseCache

    from djcachebench import memo_policy
    from djcachebench.keys import MEMO_SIZE

    spread = [f"session:{i}" for i in range(20 * MEMO_SIZE)]
    for key in spread:
        assert cache.make_and_validate_key(key) == BaseCache.make_and_validate_key(cache, key)
    assert len(cache._key_memo) <= MEMO_SIZE // memo_policy.SAMPLE  # the sample's capacity
    hot = [f"page:{i}" for i in range(400)]  # some in the sample, whatever the hash seed
    for _ in range(4 * memo_policy.WINDOW * memo_policy.SAMPLE // len(hot)):
        for key in hot:
            assert cache.make_and_validate_key(key) == f":1:{key}"
    assert cache._key_judge.whole
    assert all((key, 1, "") in cache._key_memo for key in hot)


@pytest.mark.parametrize("key", [["a", 1], {"x": 1}, 1, 1.0, True, None, ("t",)],
                         ids=["list", "dict", "int", "float", "bool", "None", "tuple"])
def test_any_key_django_formats_is_a_key(
    cache: ShardedSQLiteCache, key: Any
) -> None:
    """Django makes a key of anything ``str()`` formats, unhashable ones included;
    a memo lookup of an unhashable key raised TypeError (f15cde6 to 3394ebd)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheKeyWarning)  # brackets and spaces
        cache.set(key, "v")
        assert cache.get(key) == "v"
        assert cache.make_and_validate_key(key) == f":1:{key}"
