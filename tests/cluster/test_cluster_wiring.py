"""COHERENCE='cluster' set in OPTIONS alone links a TieredCache to the other hosts:
no call beyond Django's own construction (the link is attached when the table
opens), a write on one host ends the other host's L1 entry, and stats() shows
the cross-host counters."""

from __future__ import annotations

import time
from pathlib import Path

from djcachebench.backends.tiered import TieredCache
from djcachebench.bench.servers import RedisServer
from djcachebench.tiered.cluster import cluster_link

REDIS = "django.core.cache.backends.redis.RedisCache"


def _host(tmp_path: Path, name: str, redis: RedisServer) -> TieredCache:
    return TieredCache("", {"OPTIONS": {
        "L2": {"BACKEND": REDIS, "LOCATION": redis.location},
        "COHERENCE": "cluster",
        "GENERATION_PATH": str(tmp_path / name / "generations.mmap"),
        "L1_MAX_ENTRIES": 100 + len(name),  # another configuration: its own L1
    }})


def _until(condition: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline
        time.sleep(0.005)


def test_options_alone_link_the_hosts(tmp_path: Path, redis_server: RedisServer) -> None:
    a, b = _host(tmp_path, "a", redis_server), _host(tmp_path, "bb", redis_server)
    links = [cluster_link(c.generation_table) for c in (a, b)]
    assert all(link is not None for link in links)
    try:
        _until(lambda: all(c.generation_table.serving() for c in (a, b)))
        a.set("k", "v1")
        _until(lambda: b.get("k") == "v1" and b.get("k") == "v1"
               and b.stats()["l1_hits"] >= 1)  # b keeps it in its L1
        a.set("k", "v2")  # returns once its invalidation was handed to redis
        _until(lambda: b.get("k") == "v2", timeout=2.0)
        stats = b.stats()
        assert stats["cluster_invalidations_applied"] >= 1
        assert a.stats()["cluster_invalidations_sent"] >= 2
    finally:
        for link in links:
            link.stop()  # type: ignore[union-attr]
