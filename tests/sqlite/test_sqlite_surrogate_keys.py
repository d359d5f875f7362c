"""Keys with a lone surrogate work in every operation, as in LocMemCache.

Pinned (store/codec.py ``sql_key``): Django accepts any ``str`` key, including
one that is not valid UTF-8 (``"\\udc80"``); LocMemCache stores it. The
sqlite3 module cannot bind such a ``str``, so it is stored as the BLOB of its
``surrogatepass`` bytes; routing and the integrity tag already use those
bytes. Every operation must accept it and give LocMemCache's answer, the key
must never meet another key's row, and the paths that read keys back from SQL
(batch deletes, culling, expiry sweeps, coherence stamps) must hand back the
same ``str``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from django.core.cache.backends.locmem import LocMemCache

from djcachebench.backends.sqlite import ShardedSQLiteCache

KEYS = ["\udc80", "a\ud800b", "\udfff\u00e9", "x\ud83d"]  # lone halves, alone or mixed


@pytest.mark.parametrize("key", KEYS, ids=["low", "high-in-ascii", "low-then-latin", "high-end"])
def test_every_operation_accepts_a_lone_surrogate(cache: ShardedSQLiteCache, key: str) -> None:
    locmem = LocMemCache("surrogates", {})
    for c in (locmem, cache):  # the reference first: the same calls, the same answers
        c.set(key, "v")
        assert c.get(key) == "v"
        assert c.has_key(key)
        assert c.add(key, "other") is False
        assert c.touch(key, 100) is True
        c.set(key, 5)
        assert c.incr(key) == 6
        assert c.decr(key, 2) == 4
        c.set(key, 2**70)  # not a 64-bit SQL integer: the read-modify-write path
        assert c.incr(key) == 2**70 + 1
        c.set_many({key: "many", "plain": "p"})
        assert c.get_many([key, "plain", "absent"]) == {key: "many", "plain": "p"}
        assert c.delete(key) is True
        assert c.get(key, "miss") == "miss"
        assert c.delete(key) is False
        assert c.add(key, "added") is True
        c.delete_many([key, "plain"])
        assert c.get_many([key, "plain"]) == {}
        assert c.get_or_set(key, "default") == "default"


def test_surrogate_keys_are_distinct_from_every_other_key(cache: ShardedSQLiteCache) -> None:
    """The stored BLOB never equals a TEXT key, even one spelling the same bytes."""
    lone = "\udc80"
    lookalike = lone.encode("utf-8", "surrogatepass").decode("latin-1")
    keys = [lone, "\ud800", lookalike, "", "\ufffd", "\\udc80"]
    cache.set_many({k: f"value of {k!r}" for k in keys})
    assert cache.get_many(keys) == {k: f"value of {k!r}" for k in keys}
    assert cache.delete(lone) is True
    assert cache.get_many(keys) == {k: f"value of {k!r}" for k in keys if k != lone}


def test_culling_and_sweeps_handle_surrogate_keys(
    make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    """Culling selects, deletes and stamps keys read back from SQL."""
    cache = make_cache({"MAX_ENTRIES": 10, "CULL_FREQUENCY": 2})
    cache.coherence_table.watch()  # culled keys are stamped: str keys, as written
    keys = [f"k{i}\udc80" for i in range(40)]
    for key in keys:
        cache.set(key, key)
    assert cache.entry_count() <= 10
    assert cache.get(keys[-1]) == keys[-1]  # the newest survive
    cache.set_many({f"e{i}\udc80": i for i in range(20)}, timeout=0.05)
    time.sleep(0.1)
    cache.set("trigger\udc80", 1)  # removes expired rows first
    assert all(cache.get(f"e{i}\udc80") is None for i in range(20))


def test_a_surrogate_key_is_stamped_when_watched(cache: ShardedSQLiteCache) -> None:
    table = cache.coherence_table
    table.watch()
    made = cache.make_key("\udc80")
    before = table.token(made)
    cache.set("\udc80", "v")
    after_set = table.token(made)
    assert after_set != before
    cache.delete_many(["\udc80"])
    assert table.token(made) != after_set
