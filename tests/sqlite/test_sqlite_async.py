"""The async twins have the guarantees of the sync methods.

Pinned (backends/sqlite.py "async twins"): Django's default ``aincr`` is
``aget`` then ``aset``: tasks interleave between the two and lose increments,
and the ``aset`` replaces the key's expiry with the default timeout. Here
``aincr``/``adecr`` run the atomic ``incr`` in one thread hop, so 50 tasks of
20 ``aincr`` each leave exactly 1,000 and the expiry set before. The batch
twins give the sync results (``aset_many`` reports the keys it could not
store), and the others (``aadd``, ``atouch``, ``aget_or_set``, ...) keep
their sync counterparts' semantics.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from djcachebench.backends.sqlite import ShardedSQLiteCache

from .helpers import raw_shard, shard_path

TASKS = 50
EACH = 20


def expiry_on_disk(cache: ShardedSQLiteCache, key: str) -> float | None:
    with raw_shard(shard_path(cache, key)) as conn:
        return conn.execute("SELECT expires FROM cache WHERE key = ?",
                            (cache.make_key(key),)).fetchone()[0]


def run_tasks(factory: Callable[[], Any], count: int) -> None:
    async def main() -> None:
        await asyncio.gather(*(factory() for _ in range(count)))

    asyncio.run(main())


def test_aincr_from_many_tasks_loses_nothing_and_keeps_the_expiry(
    cache: ShardedSQLiteCache
) -> None:
    cache.set("n", 0, timeout=1000)
    expires = expiry_on_disk(cache, "n")

    async def task() -> None:
        for _ in range(EACH):
            await cache.aincr("n")

    run_tasks(task, TASKS)
    assert cache.get("n") == TASKS * EACH
    assert expiry_on_disk(cache, "n") == expires


def test_adecr_and_big_numbers_keep_the_expiry(cache: ShardedSQLiteCache) -> None:
    cache.set("n", 2**70, timeout=1000)  # past 64 bits: the read-modify-write path
    expires = expiry_on_disk(cache, "n")

    async def task() -> None:
        for _ in range(EACH):
            await cache.adecr("n", 2)

    run_tasks(task, 10)
    assert cache.get("n") == 2**70 - 2 * 10 * EACH
    assert expiry_on_disk(cache, "n") == expires


def test_aincr_of_a_missing_key_raises_value_error(cache: ShardedSQLiteCache) -> None:
    async def main() -> None:
        try:
            await cache.aincr("missing")
        except ValueError:
            return
        raise AssertionError("aincr of a missing key must raise ValueError")

    asyncio.run(main())
    assert cache.get("missing") is None


def test_async_twins_give_the_sync_results(cache: ShardedSQLiteCache) -> None:
    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        out["aset_many"] = await cache.aset_many({"a": 1, "b": "two"}, timeout=100)
        out["aget_many"] = await cache.aget_many(["a", "b", "absent"])
        out["ahas_key"] = (await cache.ahas_key("a"), await cache.ahas_key("absent"))
        out["aadd"] = (await cache.aadd("a", 9), await cache.aadd("c", 3))
        out["atouch"] = (await cache.atouch("a", 50), await cache.atouch("absent", 50))
        out["aget_or_set"] = (await cache.aget_or_set("a", 7),
                              await cache.aget_or_set("d", lambda: "made"))
        await cache.adelete_many(["a", "b"])
        out["after"] = await cache.aget_many(["a", "b", "c", "d"])
        return out

    assert asyncio.run(main()) == {
        "aset_many": [],
        "aget_many": {"a": 1, "b": "two"},
        "ahas_key": (True, False),
        "aadd": (False, True),
        "atouch": (True, False),
        "aget_or_set": (1, "made"),
        "after": {"c": 3, "d": "made"},
    }


def test_aset_many_reports_the_keys_it_could_not_store(
    make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    """A shard held by another writer: the sync method lists the keys, so must the twin."""
    cache = make_cache({"LOCK_TIMEOUT": 0.05, "RETRIES": 0})
    cache.set("blocked", 0)
    holder = raw_shard(shard_path(cache, "blocked"))
    conn = holder.__enter__()
    try:
        conn.execute("BEGIN IMMEDIATE")
        failed = asyncio.run(cache.aset_many({"blocked": 1}))
    finally:
        conn.execute("ROLLBACK")
        holder.__exit__(None, None, None)
    assert failed == ["blocked"]
    assert cache.get("blocked") is None  # the value it failed to replace is not served
