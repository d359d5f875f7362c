"""A call's key and version name exactly the entry Django's ``make_key`` names.

Both backends remember something per call to skip work on the hot path:
ShardedSQLiteCache the keys it made, TieredCache its L1 entries. A memo keyed
by the call is right only while the call alone determines the final key, and
two ways break that:

- versions that are equal dict keys but make different keys (``1``, ``1.0``
  and ``True`` make ``:1:k``, ``:1.0:k`` and ``:True:k``): a memo keyed by the
  call returns version 1's value to a caller asking for version ``True``;
- a ``KEY_FUNCTION`` that reads more than its arguments (django-tenants' reads
  the current schema): a memo keyed by the call serves one tenant's value to
  another.

The differential test at the end runs seeded random sequences of the whole
API over such keys and versions against LocMemCache.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.core.cache.backends.base import BaseCache
from django.core.cache.backends.locmem import LocMemCache

from djcachebench.backends.tiered import TieredCache
from tests.sqlite.helpers import new_cache
from tests.tiered.helpers import SQLITE, locmem_tiered, sqlite_tiered

TENANT = threading.local()


def tenant_key(key: Any, key_prefix: str, version: Any) -> str:
    """A key function like django-tenants': the current tenant is part of the key."""
    return f"{getattr(TENANT, 'name', 'public')}:{key_prefix}:{version}:{key}"


class StrictLocMem(LocMemCache):
    """The oracle: LocMemCache, except that ``delete`` of an expired entry says
    False (LocMemCache says True until the entry is purged; every shared cache
    says False)."""

    def delete(self, key: Any, version: int | None = None) -> bool:
        key = self.make_and_validate_key(key, version=version)
        with self._lock:
            if self._has_expired(key):
                self._delete(key)
                return False
            return self._delete(key)


def _backends(tmp_path: Path) -> dict[str, BaseCache]:
    return {
        "sqlite": new_cache(tmp_path / "alone"),
        "tiered over sqlite": sqlite_tiered(tmp_path),
        "tiered over locmem": locmem_tiered(tmp_path),
    }


@pytest.mark.parametrize("name", ["sqlite", "tiered over sqlite", "tiered over locmem"])
@pytest.mark.parametrize("other", [True, 1.0, -0.0, False])
def test_a_version_equal_to_another_never_reads_its_entry(tmp_path: Path, name: str,
                                                          other: Any) -> None:
    cache = _backends(tmp_path)[name]
    plain = 0 if other in (-0.0, False) else 1
    assert cache.make_key("k", other) != cache.make_key("k", plain)
    for _ in range(3):  # the later rounds are answered from the memo / the L1
        cache.set("k", "plain", version=plain)
        assert cache.get("k", version=other) is None
        assert cache.get("k", version=plain) == "plain"
    cache.set("k", "other", version=other)
    for _ in range(3):
        assert cache.get("k", version=plain) == "plain"
        assert cache.get("k", version=other) == "other"
    assert cache.delete("k", version=other)
    assert cache.get("k", version=plain) == "plain"
    # A version that formats as the plain one names the same entry, as in Django.
    assert cache.get("k", version=Decimal(plain)) == "plain"


def _tenant_caches(tmp_path: Path) -> dict[str, BaseCache]:
    return {
        "sqlite": new_cache(tmp_path / "alone", KEY_FUNCTION=tenant_key),
        "tiered over sqlite": TieredCache("", {"OPTIONS": {"L2": {
            "BACKEND": SQLITE, "LOCATION": str(tmp_path / "l2"),
            "KEY_FUNCTION": tenant_key}}}),
    }


@pytest.mark.parametrize("name", ["sqlite", "tiered over sqlite"])
def test_a_key_function_that_reads_more_than_its_arguments_keeps_tenants_apart(
        tmp_path: Path, name: str) -> None:
    cache = _tenant_caches(tmp_path)[name]
    try:
        TENANT.name = "a"
        cache.set("profile", "a's profile")
        for _ in range(3):
            assert cache.get("profile") == "a's profile"
        TENANT.name = "b"
        assert cache.get("profile") is None
        assert cache.get_many(["profile"]) == {}
        assert not cache.has_key("profile")
        cache.set("profile", "b's profile")
        for _ in range(3):
            assert cache.get("profile") == "b's profile"
        TENANT.name = "a"
        assert cache.get("profile") == "a's profile"
    finally:
        del TENANT.name


def test_with_such_a_key_function_the_l1_still_answers(tmp_path: Path) -> None:
    """Indexed by the final key, the L1 keeps working (a make_key per hit)."""
    cache = _tenant_caches(tmp_path)["tiered over sqlite"]
    cache.set("profile", "public profile")
    before = cache.stats()["l1_hits"]
    for _ in range(5):
        assert cache.get("profile") == "public profile"
    assert cache.stats()["l1_hits"] - before == 5


@pytest.mark.parametrize("attribute", ["key_func", "key_prefix"])
def test_reassigning_how_keys_are_made_never_serves_the_old_rules_entries(
        tmp_path: Path, attribute: str) -> None:
    """One thread's instance changes its key rule; another thread's instance of
    the same configuration (sharing the process's L1) keeps the old one."""
    mine, theirs = sqlite_tiered(tmp_path), sqlite_tiered(tmp_path)
    theirs.set("k", "old rule's value")
    assert theirs.get("k") == "old rule's value"  # in the shared L1
    setattr(mine, attribute, tenant_key if attribute == "key_func" else "other-prefix")
    for _ in range(3):
        assert mine.get("k") is None
    mine.set("k", "new rule's value")
    for _ in range(3):
        assert theirs.get("k") == "old rule's value"
        assert mine.get("k") == "new rule's value"


def test_a_key_function_reassigned_on_the_sqlite_instance_is_used(tmp_path: Path) -> None:
    cache = new_cache(tmp_path / "c")
    cache.set("k", "default rule")
    assert cache.get("k") == "default rule"  # remembered by the key memo
    cache.key_func = tenant_key
    assert cache.get("k") is None
    assert cache.make_key("k") == "public::1:k"


@pytest.mark.parametrize("name", ["sqlite", "tiered over sqlite", "tiered over locmem"])
def test_get_many_answers_every_key_asked_for(tmp_path: Path, name: str) -> None:
    """As BaseCache.get_many: 1 and "1" make one cache key, and both get its value;
    1 and 1.0 are one dict key naming two entries, and the later one answers."""
    cache = _backends(tmp_path)[name]
    cache.set("1", "one")
    cache.set(1.0, "one point oh")
    for _ in range(2):  # the second round from the L1
        assert cache.get_many([1, "1"]) == {1: "one", "1": "one"}
        got = cache.get_many([1, 1.0])
        assert got == {1: "one point oh"}
        assert cache.get_many([1.0, 1]) == {1.0: "one"}
        assert cache.get(1.0) == "one point oh"
        assert cache.get(1) == "one"


@pytest.mark.parametrize("name", ["sqlite", "tiered over sqlite", "tiered over locmem"])
def test_get_many_answers_in_the_order_asked_with_a_copy_per_key(
        tmp_path: Path, name: str) -> None:
    """get_many answers in the order asked, not L1 hits first (``['c', 'a', 'd',
    'b']`` for d, c, b, a); keys 1 and "1" get an object each, so changing one does
    not change the other; a bad key given twice warns twice (Django warns per key
    given)."""
    cache = _backends(tmp_path)[name]
    cache.set_many({"a": 1, "b": 2, "c": 3, "d": 4})
    cache.get("a"), cache.get("c")  # L1 hits for two of them
    assert list(cache.get_many(["d", "c", "b", "a"])) == ["d", "c", "b", "a"]
    cache.set("1", {"n": 0})
    got = cache.get_many([1, "1"])
    got[1]["n"] = 99
    assert got["1"] == {"n": 0}
    import warnings

    from django.core.cache.backends.base import CacheKeyWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache.get_many(["sp ace", "sp ace"])
    assert sum(issubclass(w.category, CacheKeyWarning) for w in caught) == 2


KEYS = ["k", 1, 1.0, True, b"k", "1", "True", "1.0", 0, False, -0.0, "0", ("t",), "k2"]
VERSIONS = [None, 1, True, 1.0, "1", 2, 2.0, 0, False]
VALUES = [1, 2, True, 1.0, "s", b"b", None, [1], {"a": 1}, 2**70, -5]
TIMEOUTS = [None, 0, -1, 300, 10**10]


def _step(cache: BaseCache, rng: random.Random) -> Any:
    """One random call; its result (an exception as its type's name)."""
    key, version, value = rng.choice(KEYS), rng.choice(VERSIONS), rng.choice(VALUES)
    timeout, other = rng.choice(TIMEOUTS), rng.choice(KEYS)
    op = rng.randrange(15)
    try:
        if op == 0:
            return cache.set(key, value, version=version)
        if op == 1:
            return cache.get(key, "default", version=version)
        if op == 2:
            return sorted(map(repr, cache.get_many([key, other], version=version).items()))
        if op == 3:
            return cache.delete(key, version=version)
        if op == 4:
            return cache.has_key(key, version=version)
        if op == 5:
            return cache.add(key, value, version=version)
        if op == 6:
            return cache.incr(key, rng.choice([1, -1, 2**64]), version=version)
        if op == 7:
            return sorted(map(repr, cache.set_many({key: value, other: value},
                                                   version=version)))
        if op == 8:
            return cache.delete_many([key, other], version=version)
        if op == 9:
            return cache.touch(key, version=version)
        if op == 10:
            return cache.get_or_set(key, value, version=version)
        if op == 11:
            return cache.set(key, value, timeout=timeout, version=version)
        if op == 12:
            return cache.incr_version(key, rng.choice([1, -1]), version=version)
        if op == 13:
            return cache.touch(key, timeout=timeout, version=version)
        return cache.add(key, value, timeout=timeout, version=version)
    except Exception as exc:
        return type(exc).__name__


class Async:
    """The cache's async API with the sync one's signatures (``aget`` as ``get``)."""

    def __init__(self, cache: BaseCache) -> None:
        self._cache = cache

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._cache, "a" + name)
        return lambda *args, **kwargs: asyncio.run(method(*args, **kwargs))


@pytest.mark.parametrize("api", ["sync", "async"])
@pytest.mark.parametrize("name", ["sqlite", "tiered over sqlite", "tiered over locmem"])
def test_random_calls_answer_as_locmem_does(tmp_path: Path, name: str, api: str) -> None:
    """Seeded sequences of 300 calls over keys and versions chosen to collide
    (equal numbers of several types, str and bytes, expired entries): every
    result equals LocMemCache's, through the sync API and the async one."""
    options = {"L2": {"BACKEND": "tests.tiered.test_key_identity.StrictLocMem",
                      "LOCATION": str(tmp_path / "l2")},
               "GENERATION_PATH": str(tmp_path / "l2.generations.mmap")}
    cache = (TieredCache("", {"OPTIONS": options}) if name == "tiered over locmem"
             else _backends(tmp_path)[name])
    oracle = StrictLocMem(f"oracle-{tmp_path}", {})
    calls: Any = cache if api == "sync" else Async(cache)
    for seed in range(25 if api == "sync" else 8):
        cache.clear()
        oracle.clear()
        ours, theirs = random.Random(seed), random.Random(seed)
        for step in range(300):
            got, expected = _step(calls, ours), _step(oracle, theirs)
            assert repr(got) == repr(expected), f"seed {seed}, step {step}"


@pytest.mark.parametrize("l2", ["sqlite", "locmem"])
def test_two_l1s_over_one_l2_answer_as_one_locmem_does(tmp_path: Path, l2: str) -> None:
    """The same random calls, each made through one of two TieredCaches with
    L1s of their own (two processes, in effect) over one L2: every result
    equals one LocMemCache's, so no L1 answers with what the other overwrote."""
    def tiered(entries: int) -> TieredCache:
        if l2 == "sqlite":
            return sqlite_tiered(tmp_path, L1_MAX_ENTRIES=entries)
        return TieredCache("", {"OPTIONS": {
            "L2": {"BACKEND": "tests.tiered.test_key_identity.StrictLocMem",
                   "LOCATION": str(tmp_path / "l2")},
            "GENERATION_PATH": str(tmp_path / "l2.generations.mmap"),
            "L1_MAX_ENTRIES": entries}})

    one, other = tiered(1000), tiered(1001)  # different options: different L1s
    oracle = StrictLocMem(f"oracle-{tmp_path}", {})
    for seed in range(15):
        one.clear()
        oracle.clear()
        ours, theirs, which = random.Random(seed), random.Random(seed), random.Random(-seed)
        for step in range(400):
            cache = one if which.random() < 0.5 else other
            got, expected = _step(cache, ours), _step(oracle, theirs)
            assert repr(got) == repr(expected), f"seed {seed}, step {step}"


@pytest.mark.servers
def test_get_many_of_two_keys_making_one_over_redis_takes_neither_for_absent(
        tmp_path: Path, redis_server: Any) -> None:
    """Django's RedisCache answers get_many by cache key: of "1" and 1 (both
    ``:1:1``) it names the value after one only. TieredCache took the other for
    absent and remembered that absence in its L1: a get of "1" then answered None
    while redis held the value, until the key was written again."""
    cache = TieredCache("", {"OPTIONS": {
        "L2": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
               "LOCATION": redis_server.location, "KEY_PREFIX": f"many{os.getpid()}"},
        "GENERATION_PATH": str(tmp_path / "gen.mmap")}})
    cache.delete("other")
    cache.l2.set("1", "one")  # past the adapter: not in the L1
    for _ in range(2):
        assert cache.get_many(["1", 1, "other"]) == {"1": "one", 1: "one"}
        assert cache.get("1") == "one"
        assert cache.has_key("1")
