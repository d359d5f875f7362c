"""Memory and disk figures: what each measure reads, against real files and servers."""

from __future__ import annotations

from pathlib import Path

import pytest

from djcachebench.bench.footprint import (
    count_entries,
    disk_usage,
    median_footprint,
    per_entry,
    private_bytes,
    rss_bytes,
    server_memory,
)
from djcachebench.bench.servers import MemcachedServer, RedisServer


def test_disk_usage_counts_every_file_and_the_wal_apart(tmp_path: Path) -> None:
    assert disk_usage(tmp_path) is None  # nothing on disk: a server or memory backend
    (tmp_path / "shard-0.sqlite").write_bytes(b"x" * 10_000)
    (tmp_path / "shard-0.sqlite-wal").write_bytes(b"w" * 5_000)
    (tmp_path / "values").mkdir()
    (tmp_path / "values" / "v1").write_bytes(b"v" * 3)
    usage = disk_usage(tmp_path)
    assert usage is not None
    assert usage["files"] == 3
    assert usage["apparent_bytes"] == 15_003
    assert usage["wal_bytes"] == 5_000
    assert usage["bytes"] >= 15_003 - 4096  # allocated blocks (a filesystem may pack tails)


def test_rss_grows_with_what_the_process_keeps() -> None:
    before = rss_bytes()
    assert before is not None and before > 0
    kept = bytearray(64 << 20)
    kept[::4096] = b"x" * len(kept[::4096])  # touch every page
    after = rss_bytes()
    assert after is not None and after - before >= 60 << 20
    del kept


def test_private_pages_leave_out_a_shared_file_mapping(tmp_path: Path) -> None:
    import mmap

    path = tmp_path / "table"
    path.write_bytes(b"\0" * (64 << 20))
    rss0, private0 = rss_bytes(), private_bytes()
    assert rss0 is not None and private0 is not None
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as mapped:
        total = sum(mapped[i] for i in range(0, len(mapped), 4096))  # touch every page
        rss1, private1 = rss_bytes(), private_bytes()
    assert total == 0 and rss1 is not None and private1 is not None
    assert rss1 - rss0 >= 60 << 20  # the mapping's pages count in RSS...
    assert private1 - private0 < 8 << 20  # ...but not as the process's own


class _Dict:
    """A cache with get_many/has_key over a dict: counting must see what is there."""

    def __init__(self, keys: set[str]) -> None:
        self.keys = keys

    def get_many(self, keys: list[str]) -> dict[str, int]:
        return {k: 1 for k in keys if k in self.keys}

    def has_key(self, key: str) -> bool:
        return key in self.keys


def test_entries_are_counted_exactly_or_estimated_from_a_sample() -> None:
    present = {str(i) for i in range(0, 1_000, 2)}
    assert count_entries(_Dict(present), str, 1_000, 100, 0) == (500, 1_000, False)
    assert count_entries(_Dict(present), str, 1_000, 1 << 20, 0) == (500, 1_000, False)
    many = {str(i) for i in range(0, 1_000_000, 4)}
    entries, probed, estimated = count_entries(_Dict(many), str, 1_000_000, 100, 0)
    assert estimated and probed == 20_000
    assert 240_000 < entries < 260_000


def test_runs_are_summarised_per_figure_by_the_median() -> None:
    runs = [
        {"entries": 10, "disk": {"bytes": 300}, "rss_growth_bytes": [1, 9], "server": None},
        {"entries": 30, "disk": {"bytes": 100}, "rss_growth_bytes": [3, 7], "server": None},
        {"entries": 20, "disk": {"bytes": 200}, "rss_growth_bytes": [2, 8], "server": None},
    ]
    assert median_footprint(runs) == {
        "entries": 20,
        "disk": {"bytes": 200},
        "rss_growth_bytes": [2, 8],
        "server": None,
    }
    assert per_entry(median_footprint(runs)) == {"disk": 10.0, "server": None, "rss": 0.1}


@pytest.mark.servers
def test_server_memory_reads_redis_and_memcached(
    redis_server: RedisServer, memcached_server: MemcachedServer
) -> None:
    import redis

    client = redis.Redis(host=redis_server.host, port=redis_server.port)
    client.flushall()
    before = server_memory("redis", redis_server.port, redis_server.pid)
    client.mset({f"k{i}": b"v" * 1000 for i in range(1000)})
    after = server_memory("redis", redis_server.port, redis_server.pid)
    assert after["items"] == 1000 and before["items"] == 0
    # The data set, not its growth: FLUSHALL may free the keys of earlier tests
    # lazily (lazyfree), so "before" can still count some of them.
    assert after["dataset_bytes"] >= 1000 * 1000
    assert after["rss_bytes"] and after["rss_bytes"] > after["memory_bytes"] // 2
    client.flushall()

    import pylibmc

    mc = pylibmc.Client([memcached_server.location], binary=True)
    mc.flush_all()
    mc.set_multi({f"k{i}": b"v" * 1000 for i in range(100)})
    stats = server_memory("memcached", memcached_server.port, memcached_server.pid)
    assert stats["items"] == 100
    assert stats["memory_bytes"] >= 100 * 1000
