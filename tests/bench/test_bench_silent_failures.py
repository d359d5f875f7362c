"""Failures a cache hides from its caller are in the results and the report.

A ShardedSQLiteCache that gives up on a busy shard returns from ``set`` as if
it had stored the value; only its ``stats()`` knows (``give_ups``,
``voided``). The harness reads these counters from ``stats()`` for every
backend, not only a TieredCache's counter names, or the published figures
count every such write as a success. The shard here is really locked, by a
second connection, as another process would hold it.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.bench import cache_stats
from djcachebench.bench.cache_stats import median_runs, merge_workers, snapshot, worker_delta
from djcachebench.bench.report import render_markdown, render_text
from djcachebench.bench.results import BackendResult, Results
from djcachebench.bench.stats import ActionStats


def locked_set(tmp_path: Path) -> dict[str, Any] | None:
    """One worker's figures around a ``set`` that gives up on a locked shard."""
    cache = ShardedSQLiteCache(str(tmp_path / "c"), {"OPTIONS": {
        "SHARDS": 1, "LOCK_TIMEOUT": 0.05, "RETRIES": 1, "RETRY_BACKOFF": 0.01}})  # fmt: skip
    cache.set("k", b"old")
    before = snapshot(cache)
    (shard,) = (tmp_path / "c").glob("shard-*.sqlite3")
    holder = sqlite3.connect(shard, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        assert cache.set("k", b"new") is None  # returns normally: nothing raised
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    return worker_delta(before, snapshot(cache))


def backend_with(stats: dict[str, Any] | None, errors: int = 0) -> BackendResult:
    get = ActionStats(count=100, miss=40, errors=errors, p50=1000, p90=2000, p99=3000,
                      p999=4000, p9999=5000, max=6000, total=100_000)  # fmt: skip
    return BackendResult("sqlite", {"get": get}, wall_s=1.0, ops=100, cache_stats=stats)


def results_of(*backends: BackendResult) -> Results:
    return Results(machine={}, scenario={"name": "t", "mix": {"get": 1.0}, "keys": 10,
                                         "value_min": 1, "value_max": 2, "prefill": True},
                   run={"procs": 1, "ops": 100, "warmup": 0, "seed": 0,
                        "start_method": "spawn"},
                   backends=list(backends))  # fmt: skip


def test_a_sqlite_give_up_is_kept_in_the_figures(tmp_path: Path) -> None:
    delta = locked_set(tmp_path)
    assert delta is not None
    assert delta["give_ups"] == 1 and delta["voided"] == 1
    merged = merge_workers([(0, delta), (0, delta)])
    assert merged is not None
    assert merged["give_ups"] == 2 and merged["voided"] == 2
    assert "l1_share" not in merged  # not a TieredCache: no TieredCache counters table


def test_the_summary_shows_give_ups_and_flags_the_target(tmp_path: Path) -> None:
    delta = locked_set(tmp_path)
    results = results_of(backend_with(merge_workers([(0, delta)])))
    report = render_markdown(results)
    summary = report.split("## Summary", 1)[1].split("\n## ", 1)[0]
    assert "| Gave up |" in summary
    assert "give ups 1, voided 1" in summary
    assert "| flagged |" in summary and "| ok |" not in summary
    assert "## TieredCache counters" not in report
    assert "GAVE UP: give ups 1" in render_text(results)


def test_a_cache_without_failure_counters_shows_a_dash_and_zero_is_zero() -> None:
    report = render_markdown(results_of(backend_with(None)))
    assert "| 40.0% |" in report  # the get miss rate
    row = next(line for line in report.splitlines() if line.startswith("| sqlite |"))
    assert row.endswith("| - | ok |")
    clean = {"give_ups": 0, "voided": 0, "errors": 0, "tampered": 0, "corruptions": 0}
    row = next(line for line in render_markdown(results_of(backend_with(clean))).splitlines()
               if line.startswith("| sqlite |"))  # fmt: skip
    assert row.endswith("| 0 | ok |")


class FakeL2:
    def __init__(self) -> None:
        self.counts = {"give_ups": 0, "voided": 0, "errors": 0}

    def stats(self) -> dict[str, int]:
        return dict(self.counts)


class FakeTiered:
    """Only what the harness reads of a TieredCache: ``stats()`` and its L2."""

    def __init__(self) -> None:
        self.l2 = FakeL2()

    def stats(self) -> dict[str, int]:
        return {"l1_hits": 0, "l1_misses": 0, "l2_hits": 0, "l2_misses": 0}


def test_a_tiered_caches_l2_give_ups_are_kept_with_a_prefix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The fakes' stats() only read a dict: declared read-only, as the real classes are.
    fakes = {f"{__name__}.{cls.__qualname__}" for cls in (FakeL2, FakeTiered)}
    monkeypatch.setattr(cache_stats, "READ_ONLY_STATS", cache_stats.READ_ONLY_STATS | fakes)
    cache = FakeTiered()
    before = snapshot(cache)
    cache.l2.counts.update(give_ups=3, voided=3)
    delta = worker_delta(before, snapshot(cache))
    assert delta is not None and delta["l2_give_ups"] == 3 and delta["l2_voided"] == 3
    assert "give_ups" not in delta


def test_a_real_tiered_cache_shows_its_sqlite_l2s_counters(tmp_path: Path) -> None:
    from tests.tiered.helpers import sqlite_tiered

    taken = snapshot(sqlite_tiered(tmp_path))
    assert taken is not None and taken["l2_give_ups"] == 0 and taken["l2_voided"] == 0


def test_repeats_sum_the_give_ups_instead_of_a_median_of_zeros() -> None:
    runs = [{"give_ups": 0, "voided": 0}, {"give_ups": 5, "voided": 5}, {"give_ups": 0,
                                                                          "voided": 0}]
    merged = median_runs(runs)
    assert merged is not None and merged["give_ups"] == 5 and merged["voided"] == 5
