"""Repeated runs keep every error, and wall, ops and ops/s come from one run.

With ``--repeat N`` the errors and wrong answers of a backend are totals, not
per-action medians, under which errors in one run of three would vanish from
the headline (and a sweep point with errors show nothing); with an even N the
wall and ops/s come from one run, not the faster middle run's and the slower
one's. The sweep's tables show the miss rate too, since a capped cache at more
keys than its limit misses most gets and looks faster for it.
"""

from __future__ import annotations

import pytest

from djcachebench.bench.report import render_markdown, render_text
from djcachebench.bench.results import BackendResult, Results
from djcachebench.bench.stats import ActionStats
from djcachebench.bench.sweep import Sweep
from djcachebench.bench.sweep import render_markdown as render_sweep


def run(wall_s: float, errors: int = 0, wrong: int = 0, miss: int = 10,
        count: int = 10_000, stale: int = 0) -> BackendResult:
    get = ActionStats(count=count, miss=miss, errors=errors, wrong=wrong, stale=stale, p50=1000,
                      p90=2000,
                      p99=3000, p999=4000, p9999=5000, max=6000, total=10_000_000)  # fmt: skip
    return BackendResult("sqlite", {"get": get}, wall_s=wall_s, ops=count)


def results_of(*backends: BackendResult, repeat: int = 1) -> Results:
    caches = {"default": {"BACKEND": "x", "OPTIONS": {"MAX_ENTRIES": 1000}}}
    return Results(machine={}, scenario={"name": "t", "mix": {"get": 1.0}, "keys": 20_000,
                                         "value_min": 1, "value_max": 2, "prefill": True},
                   run={"procs": 1, "ops": 100, "warmup": 0, "seed": 0,
                        "start_method": "spawn", "repeat": repeat},
                   targets={"sqlite": {"settings": {"CACHES": caches}}},
                   backends=list(backends))  # fmt: skip


def summary_row(results: Results) -> dict[str, str]:
    """The Summary's sqlite row, by column name (columns are added over time)."""
    lines = render_markdown(results).split("## Summary", 1)[1].strip().splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    line = next(x for x in lines if x.startswith("| sqlite |"))
    return dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True))


def test_errors_in_one_run_are_totals_and_flag_the_target() -> None:
    combined = BackendResult.from_runs([run(1.0), run(1.0, errors=7), run(1.0)])
    assert combined.actions["get"].errors == 7
    row = summary_row(results_of(combined, repeat=3))
    assert row["Errors"] == "7 of 30,007"  # errors over every run's calls
    assert row["Status"] == "flagged"


def test_wrong_answers_in_one_run_are_totals() -> None:
    combined = BackendResult.from_runs([run(1.0), run(1.0, wrong=2), run(1.0)])
    assert combined.actions["get"].wrong == 2


def test_stale_answers_in_one_run_are_totals_and_mark_the_target() -> None:
    stale = run(1.0, stale=3)
    stale.stale = ["get: 3 of 10,000 answers were stale"]
    combined = BackendResult.from_runs([run(1.0), stale, run(1.0)])
    assert combined.actions["get"].stale == 3
    assert combined.stale == ["run 2: get: 3 of 10,000 answers were stale"]
    row = summary_row(results_of(combined, repeat=3))
    assert row["Stale"] == "3" and row["Status"] == "**stale**"


def test_wall_ops_and_ops_per_s_are_one_runs_with_an_even_count() -> None:
    combined = BackendResult.from_runs([run(0.114), run(0.278)])
    assert combined.ops_per_s == pytest.approx(10_000 / 0.278)  # the lower middle
    assert combined.wall_s == 0.278  # the same run's wall, not the faster one's
    assert combined.ops / combined.wall_s == pytest.approx(combined.ops_per_s)


def test_the_summary_and_the_sweep_show_miss_rates_errors_and_limits() -> None:
    capped = results_of(run(1.0, miss=9_500))
    row = summary_row(capped)
    assert row["get miss"] == "95.0%"
    assert "get miss 95.0%" in render_text(capped)
    assert "`MAX_ENTRIES` 1,000: sqlite" in render_markdown(capped).split("## Summary")[1]
    sweep = Sweep("keys", [1_000, 20_000], [results_of(run(1.0)),
                                            results_of(run(1.0, errors=3, miss=9_500))])
    text = render_sweep(sweep)
    assert "| keys | ops/s | get miss | get p50 | get p99 | Errors |" in text
    assert "| 1,000 | 10,000 | 0.1% |" in text
    line = next(x for x in text.splitlines() if x.startswith("| 20,000 |"))
    assert "| 95.0% |" in line and "| 3 |" in line and line.endswith("| flagged |")
    assert "`MAX_ENTRIES` 1,000: sqlite" in text
