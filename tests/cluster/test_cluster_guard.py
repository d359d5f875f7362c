"""What a host does when it cannot vouch for its own L1: it serves no L1 answer of
any kind, and it still tells the other hosts of its writes.

So ``has_key`` does not answer from the L1 of a host whose subscriber has stopped
(after another host's delete), and a write through a table whose check failed
(its directory removed, say) is still published.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import Any

from django.core.cache.backends.redis import RedisCache

from djcachebench.backends.tiered import TieredCache
from djcachebench.bench.servers import RedisServer
from djcachebench.coherence import open_table
from djcachebench.coherence.cluster import link_table
from djcachebench.coherence.table import CHECK_EVERY, GenerationTable
from djcachebench.tiered.cluster import cluster_link


def _until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_has_key_is_not_answered_from_the_l1_of_a_host_that_is_not_fresh(
        tmp_path: Path, redis_server: RedisServer) -> None:
    redis_server.flush()
    cache = TieredCache("", {"OPTIONS": {
        "L2": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
               "LOCATION": redis_server.location},
        "COHERENCE": "cluster", "GENERATION_PATH": str(tmp_path / "g.mmap")}})
    _until(lambda: cache.stats()["cluster_host_fresh"])
    cache.set("k", "v")
    assert cache.has_key("k")
    hits = cache.stats()["l1_hits"]
    assert cache.get("k") == "v" and cache.stats()["l1_hits"] == hits + 1  # an L1 entry
    link = cluster_link(cache.generation_table)
    assert link is not None
    link.stop()  # the subscriber stops: the host is degraded, no message applied
    _until(lambda: not cache.stats()["cluster_host_fresh"])
    other_host = RedisCache(redis_server.location, {})
    assert other_host.delete("k")  # its message would reach nobody here
    time.sleep(2 * CHECK_EVERY)
    assert cache.has_key("k") is False
    assert asyncio.run(cache.ahas_key("k")) is False
    assert ("k" in cache) is False
    other_host.close()


def _linked_pair(tmp_path: Path, url: str, base: str) -> tuple[GenerationTable, GenerationTable,
                                                                Any, Any]:
    a = open_table(str(tmp_path / "a" / "g.mmap"), 256)
    b = open_table(str(tmp_path / "b" / "g.mmap"), 256)
    return a, b, link_table(a, url, base), link_table(b, url, base)


def test_a_write_through_a_table_that_fails_its_check_is_still_published(
        tmp_path: Path, redis_server: RedisServer) -> None:
    a, b, link_a, link_b = _linked_pair(tmp_path, redis_server.location, "test:unchecked")
    try:
        _until(lambda: a.guard() and b.guard())
        shutil.rmtree(tmp_path / "a")  # a /tmp cleaner: the table's file is gone
        time.sleep(2 * CHECK_EVERY)
        assert not a.check()
        held = b.token("k")
        a.stamp("k")
        link_a.flush()
        _until(lambda: not b.is_current(None, held))
        held = b.token("j")
        assert a.stamp_through(a.locate("j"), a.token("j"), 1, None, "j") is None
        link_a.flush()
        _until(lambda: not b.is_current(None, held))
    finally:
        link_a.stop()
        link_b.stop()
