"""The harness reads a cache's statistics only through calls known to change nothing.

diskcache's ``DjangoCache.stats()`` switches its hit/miss statistics on (and
with ``enable=False`` writes the setting off): after it, every get is also a
write to diskcache's Settings table. The harness must leave every target as
it found it, so ``stats()`` is called only on the classes declared in
``cache_stats.READ_ONLY_STATS``; these tests pin that list, that nothing else
is called, and that a real harness run leaves a diskcache's settings as found.
"""

from __future__ import annotations

import importlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from django.core.cache.backends.locmem import LocMemCache

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.backends.tiered import TieredCache
from djcachebench.bench.cache_stats import (
    L2_FAILURE_COUNTERS,
    READ_ONLY_STATS,
    read_only_stats,
    snapshot,
)
from djcachebench.bench.progress import Progress
from djcachebench.bench.runner import RunOptions, run_targets
from djcachebench.bench.targets import Target
from djcachebench.bench.workload import REFERENCE

diskcache = pytest.importorskip("diskcache")
SQLITE = "djcachebench.backends.sqlite.ShardedSQLiteCache"


class CountingStatsCache(LocMemCache):
    """A cache whose ``stats()`` is not declared read-only: it must never be called."""

    calls: list[str] = []

    def stats(self) -> dict[str, int]:
        self.calls.append("stats")
        return {"give_ups": 0}


class OverridingSQLiteCache(ShardedSQLiteCache):
    """A subclass of a declared class that overrides ``stats()``: not trusted."""

    calls: list[str] = []

    def stats(self) -> dict[str, int]:
        self.calls.append("stats")
        return super().stats()


def diskcache_settings(directory: Path) -> list[dict[str, Any]]:
    """Every shard's Settings table, read with sqlite3 (not through diskcache)."""
    shards = sorted(directory.glob("*/cache.db"))
    assert shards, f"no diskcache shard under {directory}"
    out = []
    for path in shards:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            out.append(dict(con.execute("SELECT key, value FROM Settings").fetchall()))
        finally:
            con.close()
    return out


def files_state(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``root``: its bytes and modification time."""
    return {
        str(p): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_the_declared_read_only_stats_are_the_classes_own_methods() -> None:
    for dotted in READ_ONLY_STATS:
        module, _, name = dotted.rpartition(".")
        klass = getattr(importlib.import_module(module), name)
        assert callable(vars(klass).get("stats")), dotted
    assert {f"{c.__module__}.{c.__qualname__}" for c in (ShardedSQLiteCache, TieredCache)} \
        == READ_ONLY_STATS


def test_a_stats_not_declared_read_only_is_never_called() -> None:
    cache = CountingStatsCache("counting", {})
    CountingStatsCache.calls.clear()
    assert snapshot(cache) is None
    assert CountingStatsCache.calls == []


def test_a_subclass_that_overrides_a_declared_stats_is_not_trusted(tmp_path: Path) -> None:
    cache = OverridingSQLiteCache(str(tmp_path / "c"), {})
    OverridingSQLiteCache.calls.clear()
    assert read_only_stats(cache) is None
    assert snapshot(cache) is None
    assert OverridingSQLiteCache.calls == []
    # A subclass that keeps the declared method is read as the declared class is.
    plain = type("KeepsStats", (ShardedSQLiteCache,), {})(str(tmp_path / "d"), {})
    assert snapshot(plain) == {"give_ups": 0, "voided": 0, "errors": 0, "tampered": 0,
                               "corruptions": 0}


@pytest.mark.parametrize("kind", ["sqlite", "tiered"])
def test_reading_a_declared_stats_changes_no_file_and_no_counter(
    tmp_path: Path, kind: str
) -> None:
    location = tmp_path / "store"
    cache: Any
    if kind == "sqlite":
        cache = ShardedSQLiteCache(str(location), {})
    else:
        # Its generation table is the L2's own, in ``location``.
        cache = TieredCache("", {"OPTIONS": {"L2": {"BACKEND": SQLITE, "LOCATION": str(location)}}})
    for i in range(20):
        cache.set(f"k{i}", i)
        cache.get(f"k{i}")
    before = files_state(tmp_path)
    first = snapshot(cache)
    assert first is not None
    assert snapshot(cache) == first  # reading counted nothing
    assert files_state(tmp_path) == before


@pytest.mark.parametrize("statistics", [0, 1])
def test_a_snapshot_leaves_diskcaches_statistics_setting_as_found(
    tmp_path: Path, statistics: int
) -> None:
    from diskcache import DjangoCache

    setup = DjangoCache(str(tmp_path), {"OPTIONS": {"statistics": statistics}})
    setup.set("k", 1)
    setup.close()
    cache = DjangoCache(str(tmp_path), {})  # as a target opens it: no OPTIONS
    before = diskcache_settings(tmp_path)
    assert snapshot(cache) is None  # not available: nothing of diskcache's is read
    cache.get("k")
    cache.get("absent")
    cache.close()
    after = diskcache_settings(tmp_path)
    assert [s["statistics"] for s in after] == [statistics] * len(after)
    if not statistics:  # nothing switched on: the gets were counted nowhere
        assert after == before


@pytest.mark.slow
@pytest.mark.parametrize("statistics", [0, 1])
def test_a_harness_run_leaves_a_diskcache_targets_statistics_as_found(
    tmp_path: Path, statistics: int
) -> None:
    from diskcache import DjangoCache

    directory = tmp_path / "diskcache"
    setup = DjangoCache(str(directory), {"OPTIONS": {"statistics": statistics}})
    setup.close()
    before = diskcache_settings(directory)
    target = Target(
        "diskcache-here",
        "diskcache.DjangoCache in a directory the test keeps",
        caches=lambda env: {"BACKEND": "diskcache.DjangoCache", "LOCATION": str(directory)},
    )
    options = RunOptions(scenario=REFERENCE.with_overrides(procs=2, ops=300, warmup=30))
    results = run_targets([target], options, Progress(live=False))
    assert not results.skipped
    (result,) = results.backends
    assert result.ops == 600 and result.cache_stats is None
    after = diskcache_settings(directory)
    assert [s["statistics"] for s in after] == [s["statistics"] for s in before]
    hits = sum(s["hits"] + s["misses"] for s in after)
    # Off, diskcache counted none of the run's gets; on, it counted them (the
    # harness neither switched it on nor off).
    assert (hits > 0) == bool(statistics)


def test_a_declared_stats_that_raises_records_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: ShardedSQLiteCache) -> dict[str, int]:
        raise RuntimeError("stats broke")

    monkeypatch.setattr(ShardedSQLiteCache, "stats", broken)
    assert snapshot(ShardedSQLiteCache(str(tmp_path / "c"), {})) is None


def test_a_snapshot_of_a_tiered_cache_leaves_its_diskcache_l2s_statistics_off(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "l2"
    cache = TieredCache("", {"OPTIONS": {
        "L2": {"BACKEND": "diskcache.DjangoCache", "LOCATION": str(directory)},
        "GENERATION_PATH": str(tmp_path / "generations.mmap"),
    }})
    cache.set("k", 1)
    before = diskcache_settings(directory)
    stats = snapshot(cache)
    assert stats is not None  # the TieredCache's own counters; nothing of its L2's
    assert not any(key in stats for key in L2_FAILURE_COUNTERS)
    cache.l2.get("k")  # a read through the L2 itself: counted nowhere
    after = diskcache_settings(directory)
    assert after == before and {s["statistics"] for s in after} == {0}
