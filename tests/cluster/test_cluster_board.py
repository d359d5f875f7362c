"""A host that is not fresh serves nothing from the value board either."""

from __future__ import annotations

import time
from pathlib import Path

from djcachebench.backends.tiered import TieredCache
from djcachebench.bench.servers import RedisServer
from djcachebench.coherence.cluster.link import STALE_AFTER
from djcachebench.tiered.cluster import cluster_link

REDIS = "django.core.cache.backends.redis.RedisCache"


def _cache(tmp_path: Path, host: str, redis: RedisServer, l1: int) -> TieredCache:
    return TieredCache("", {"OPTIONS": {
        "L2": {"BACKEND": REDIS, "LOCATION": redis.location},
        "COHERENCE": "cluster",
        "GENERATION_PATH": str(tmp_path / host / "generations.mmap"),
        "L1_MAX_ENTRIES": l1,  # another configuration: its own L1, as another process
    }})


def test_a_degraded_host_serves_no_board_value(tmp_path: Path,
                                              redis_server: RedisServer) -> None:
    a = _cache(tmp_path, "a", redis_server, 101)
    reader = _cache(tmp_path, "b", redis_server, 102)
    writer = _cache(tmp_path, "b", redis_server, 103)  # another process of host b
    links = [cluster_link(c.generation_table) for c in (a, reader)]
    deadline = time.monotonic() + 10
    while not all(c.generation_table.serving() for c in (a, reader)):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    a.set("k", "v0")
    assert reader.get("k") == "v0" and reader.get("k") == "v0"  # in b's L1
    links[1].stop()  # host b's subscriber leaves: b misses what follows, and knows it
    writer.set("k", "v1")  # host b's own write: on its board
    a.set("k", "v2")  # acknowledged; host b never hears of it
    time.sleep(STALE_AFTER + 0.1)
    assert not reader.generation_table.serving()
    assert reader.get("k") == "v2"  # from the L2: not v1 from the board
    links[0].stop()
