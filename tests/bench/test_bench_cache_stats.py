"""What a TieredCache counts about itself, measured by the harness (``cache_stats``).

The runs are real: ``djcachebench bench`` in a subprocess, worker processes,
a real redis-server for the cluster target. The merge rules (per-process
counters summed, a host's figures taken once per host) are checked on the
figures themselves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.cache.backends.locmem import LocMemCache

from djcachebench.bench.cache_stats import merge_workers, worker_delta
from djcachebench.bench.progress import Progress
from djcachebench.bench.report import render_markdown, render_text
from djcachebench.bench.results import BackendResult, Results
from djcachebench.bench.runner import RunOptions, run_targets
from djcachebench.bench.stats import ActionStats
from djcachebench.bench.targets import Target
from djcachebench.bench.workload import REFERENCE

CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
REFERENCE_RESULTS = (
    Path(__file__).resolve().parents[2] / "bench/results/2026-11-23-reference/results.json"
)


def bench(out: Path, *args: str) -> dict[str, Any]:
    """Run ``djcachebench bench ... --out out`` as a user does; its results.json."""
    proc = subprocess.run(
        [sys.executable, "-m", "djcachebench", "bench", *args, "--out", str(out), "--no-plot"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads((out / "results.json").read_text())  # type: ignore[no-any-return]


def backend(data: dict[str, Any], name: str) -> dict[str, Any]:
    ran = {b["name"]: b for b in data["backends"]}
    assert name in ran, data["skipped"]
    return ran[name]


def assert_every_get_counted_once(result: dict[str, Any]) -> dict[str, Any]:
    """Each measured get ends as exactly one L1 answer or one L2 read.

    A value-board answer is counted as an L1 hit (or absence) *and* in
    ``board_hits``, so the board's count is not added again.
    """
    stats = result["cache_stats"]
    assert stats is not None
    gets = result["actions"]["get"]["count"] + result["actions"]["get"]["errors"]
    answered = stats["l1_hits"] + stats["l1_misses"]
    reads = stats["l2_hits"] + stats["l2_misses"]
    assert answered + reads == gets
    assert 0 < stats["l1_share"] < 1
    assert stats["l1_share"] == pytest.approx(answered / gets)
    assert stats["board_hits"] <= answered + reads
    for key in ("invalidations", "unserved", "l1_bypassed", "published"):
        assert stats[key] >= 0, key
    return stats  # type: ignore[no-any-return]


@pytest.mark.slow
def test_tiered_results_carry_its_counters_and_others_none(tmp_path: Path) -> None:
    data = bench(tmp_path, "--procs", "2", "--ops", "300", "--backends", "sqlite,tiered")
    stats = assert_every_get_counted_once(backend(data, "tiered"))
    assert stats["workers"] == 2
    assert stats["published"] > 0  # its sets put their values on the board
    assert not any(key.startswith("cluster_") for key in stats)  # one host, no link
    # A ShardedSQLiteCache records only its silent-failure counters (none here).
    sqlite_stats = backend(data, "sqlite")["cache_stats"]
    assert sqlite_stats["give_ups"] == 0 and "l1_hits" not in sqlite_stats

    report = (tmp_path / "report.md").read_text()
    section = report.split("## TieredCache counters", 1)[1].split("\n## ", 1)[0]
    assert "### tiered\n" in section and "### sqlite" not in section
    assert f"| L1 share of gets | {stats['l1_share']:.1%} |" in section
    assert "Propagation" not in section


@pytest.mark.slow
@pytest.mark.servers
def test_cluster_target_reports_propagation_per_simulated_host(tmp_path: Path) -> None:
    data = bench(tmp_path, "--procs", "4", "--ops", "300", "--backends", "tiered-redis-cluster")
    skipped = {s["name"]: s["reason"] for s in data["skipped"]}
    if not CI and "not found on PATH" in skipped.get("tiered-redis-cluster", ""):
        pytest.skip(skipped["tiered-redis-cluster"])
    stats = assert_every_get_counted_once(backend(data, "tiered-redis-cluster"))
    assert stats["cluster_hosts"] == 2
    assert [(h["host"], h["workers"]) for h in stats["cluster_per_host"]] == [(0, 2), (1, 2)]
    assert stats["cluster_gaps"] == 0
    assert stats["cluster_invalidations_sent"] > 0
    for key in ("cluster_delay_ms_p50_at_most", "cluster_delay_ms_p99_at_most",
                "cluster_delay_ms_mean", "cluster_delay_ms_max"):  # fmt: skip
        assert stats[key] is not None, key
        # The worst host's figure, not a sum over hosts or processes.
        assert stats[key] == max(h[key] for h in stats["cluster_per_host"]), key
    assert stats["cluster_delay_ms_p50_at_most"] <= stats["cluster_delay_ms_p99_at_most"]
    assert stats["cluster_degraded_seconds"] >= 0

    section = (tmp_path / "report.md").read_text().split("## TieredCache counters", 1)[1]
    assert "| Propagation p99 (worst host) | ≤ " in section
    assert "| Gaps (lost messages: all L1 dropped) | 0 |" in section


class FailingStatsCache(LocMemCache):
    """A cache whose ``stats()`` raises, and is not declared read-only: the run
    must not call it, nor notice it."""

    def stats(self) -> dict[str, int]:
        raise RuntimeError("stats broke")


@pytest.mark.slow
def test_an_undeclared_failing_stats_records_nothing_and_fails_nothing() -> None:
    target = Target(
        "failing-stats",
        "stats() raises",
        caches=lambda env: {"BACKEND": f"{__name__}.FailingStatsCache", "LOCATION": "f"},
    )
    options = RunOptions(scenario=REFERENCE.with_overrides(procs=2, ops=200, warmup=20))
    results = run_targets([target], options, Progress(live=False))
    assert not results.skipped
    (result,) = results.backends
    assert result.ops == 400 and result.cache_stats is None


def test_a_hosts_figures_are_taken_once_per_host_not_per_process() -> None:
    def worker(sent: int, applied: tuple[int, int], p99: float) -> dict[str, Any]:
        """One worker's two reads: ``applied`` is the host's counter at each."""
        before = {"l1_hits": 0, "l1_misses": 0, "l2_hits": 0, "l2_misses": 0,
                  "cluster_invalidations_sent": 0, "cluster_invalidations_applied": applied[0],
                  "cluster_gaps": 0, "cluster_delay_ms_p99_at_most": 0.5}  # fmt: skip
        after = {**before, "l1_hits": 30, "l2_hits": 10, "cluster_invalidations_sent": sent,
                 "cluster_invalidations_applied": applied[1],
                 "cluster_delay_ms_p99_at_most": p99}  # fmt: skip
        delta = worker_delta(before, after)
        assert delta is not None
        return delta

    merged = merge_workers([
        (0, worker(sent=5, applied=(100, 140), p99=2.0)),
        (1, worker(sent=7, applied=(7, 18), p99=8.0)),
        (0, worker(sent=6, applied=(110, 151), p99=2.0)),  # started and ended later
        (1, worker(sent=8, applied=(7, 18), p99=8.0)),
    ])  # fmt: skip
    assert merged is not None
    assert merged["l1_hits"] == 120 and merged["l2_hits"] == 40
    assert merged["l1_share"] == 0.75
    assert merged["cluster_invalidations_sent"] == 26  # each process's own: summed
    # Each host's once, from its first worker's start to its last one's end.
    assert [h["cluster_invalidations_applied"] for h in merged["cluster_per_host"]] == [51, 11]
    assert merged["cluster_invalidations_applied"] == 51 + 11
    assert merged["cluster_delay_ms_p99_at_most"] == 8.0  # the worst host
    assert [h["cluster_delay_ms_p99_at_most"] for h in merged["cluster_per_host"]] == [2.0, 8.0]
    assert "host_ends" not in merged  # the workers' bookkeeping stays out of the file
    # One worker without figures: a partial sum would understate every counter.
    assert merge_workers([(0, merged), (0, None)]) is None
    assert worker_delta({"l1_hits": 1}, None) is None
    assert worker_delta({"l1_hits": "x"}, {"l1_hits": 2}) is None


def counted(name: str, l1_hits: int, p99: float) -> BackendResult:
    get = ActionStats.from_samples(list(range(1_000, 1_100)), miss=0)
    stats = {"workers": 2, "l1_hits": l1_hits, "l1_misses": 0, "l2_hits": 100 - l1_hits,
             "l2_misses": 0, "l1_share": l1_hits / 100, "cluster_gaps": 0,
             "cluster_delay_ms_p99_at_most": p99}  # fmt: skip
    return BackendResult(name, {"get": get}, wall_s=1.0, ops=100, cache_stats=stats)


def test_repeats_keep_each_runs_counters_and_report_the_median(tmp_path: Path) -> None:
    runs = [counted("t", 90, 4.095), counted("t", 60, 1.023), counted("t", 80, 2.047)]
    result = BackendResult.from_runs(runs)
    assert result.cache_stats is not None
    assert result.cache_stats["l1_share"] == 0.8
    assert result.cache_stats["cluster_delay_ms_p99_at_most"] == 2.047
    assert [r.cache_stats["l1_hits"] for r in result.runs] == [90, 60, 80]  # type: ignore[index]

    results = Results(machine={}, scenario=REFERENCE.to_dict(),
                      run={"procs": 2, "ops": 50, "warmup": 0, "seed": 0,
                           "start_method": "spawn", "repeat": 3},
                      backends=[result])  # fmt: skip
    loaded = Results.load(results.save(tmp_path / "results.json"))
    assert loaded == results
    report = render_markdown(loaded)
    assert "| Figure | Median | Runs |" in report
    assert "| L1 share of gets | 80.0% | 90.0% 60.0% 80.0% |" in report
    assert "| Propagation p99 (worst host) | ≤ 2.05 ms | ≤ 4.09 ms ≤ 1.02 ms ≤ 2.05 ms |" in report
    # The terminal's line shows the same medians (a derived figure's too).
    assert "t: L1 share 80.0%, L2 reads 20, " in render_text(loaded)


def test_results_written_before_the_counters_still_load_and_render() -> None:
    if not REFERENCE_RESULTS.exists():
        pytest.skip(f"{REFERENCE_RESULTS} is not in this checkout")
    data = json.loads(REFERENCE_RESULTS.read_text())
    assert all("cache_stats" not in b for b in data["backends"])  # written before them
    results = Results.load(REFERENCE_RESULTS)
    assert results.backends and all(b.cache_stats is None for b in results.backends)
    assert all(r.cache_stats is None for b in results.backends for r in b.runs)
    report = render_markdown(results)
    assert "## Memory and disk" in report and "## TieredCache counters" not in report
    assert "TieredCache counters" not in render_text(results)
    again = Results.from_dict(results.to_dict())
    assert [b.cache_stats for b in again.backends] == [None] * len(results.backends)
