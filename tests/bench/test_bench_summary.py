"""Repeated runs: the median and its confidence interval, per-run figures kept in the file."""

from __future__ import annotations

import io
import json
import random
import shutil
from pathlib import Path

import pytest

from djcachebench.bench.cli import main
from djcachebench.bench.progress import Progress
from djcachebench.bench.report import render_markdown, render_text
from djcachebench.bench.results import BackendResult, Results
from djcachebench.bench.runner import RunOptions, new_results, run_targets
from djcachebench.bench.stats import ActionStats, merge_samples
from djcachebench.bench.summary import binomial_tail, coverage_note, median_interval, run_order
from djcachebench.bench.targets import load_targets, select_targets
from djcachebench.bench.workload import REFERENCE

PUBLISHED = Path(__file__).parents[2] / "bench" / "results" / "2026-11-21-reference"


@pytest.mark.parametrize(
    ("n", "low", "high", "coverage"),
    [
        # The textbook table of distribution-free intervals for a median:
        # n = 20 gives the 6th and 15th values, 95.86%.
        (20, 6, 15, 1 - 2 * 0.020694732666015625),
        (9, 2, 8, 1 - 2 * 10 / 512),
        (10, 2, 9, 1 - 2 * 11 / 1024),
        (6, 1, 6, 1 - 2 / 64),
        (5, 1, 5, 1 - 2 / 32),  # the range: below 95%, and said so
        (3, 1, 3, 0.75),
        (2, 1, 2, 0.5),
    ],
)
def test_interval_of_the_median_on_known_data(n: int, low: int, high: int, coverage: float) -> None:
    values = list(range(1, n + 1))
    random.Random(n).shuffle(values)  # order of the runs does not matter
    interval = median_interval(values)
    assert (interval.low, interval.high, interval.n) == (low, high, n)
    assert interval.confidence == pytest.approx(coverage)
    assert interval.median == (n + 1) // 2  # nearest rank: an observed value


def test_binomial_tail_and_one_run() -> None:
    assert binomial_tail(5, 20) == pytest.approx(0.020694732666015625)
    assert binomial_tail(20, 20) == 1
    one = median_interval([7.5])
    assert (one.median, one.low, one.high, one.confidence) == (7.5, 7.5, 7.5, 0.0)
    assert not one.unstable
    assert "95" in coverage_note(3) and "6 runs" in coverage_note(3)
    assert coverage_note(6).startswith("6 runs: 96.9% distribution-free")
    with pytest.raises(ValueError):
        median_interval([])


def test_unstable_when_the_runs_disagree_by_more_than_ten_percent() -> None:
    steady = median_interval([100, 101, 99, 102, 98, 100])
    assert not steady.unstable
    noisy = median_interval([100, 101, 99, 102, 98, 130])  # one disturbed run
    assert noisy.unstable and noisy.median == 100
    assert noisy.to_dict()["unstable"] is True


def _run(samples: dict[str, list[int]], wall_s: float) -> BackendResult:
    actions = {a: ActionStats.from_samples(v, miss=1) for a, v in samples.items()}
    return BackendResult("x", actions, wall_s, sum(s.count for s in actions.values()))


def test_runs_are_summarised_per_figure_never_merged() -> None:
    # Run 1 fast, run 2 with a slow tail, run 3 in between.
    samples = [[10] * 95 + [20] * 5, [11] * 95 + [5_000] * 5, [12] * 95 + [30] * 5]
    runs = [_run({"get": s}, wall) for s, wall in zip(samples, (1.0, 2.0, 1.5), strict=True)]
    combined = BackendResult.from_runs(runs)
    get = combined.actions["get"]
    assert get.p50 == 11  # the median of the runs' medians 10, 11, 12
    assert get.p99 == 30  # of 20, 5000, 30: the slow run does not decide it
    # Merging the runs' samples would have given the slow run's tail instead.
    merged = ActionStats.from_samples(merge_samples(samples), 0, presorted=True)
    assert merged.p99 == 5_000
    assert combined.wall_s == 1.5
    assert combined.ops_per_s == pytest.approx(100 / 1.5)  # median of 100, 50, 66.7
    summary = combined.summary()
    assert summary["get p99"].low == 20 and summary["get p99"].high == 5_000
    assert summary["get p99"].unstable
    assert summary["ops/s"].n == 3
    assert BackendResult.from_runs(runs[:1]) is runs[0]


def test_results_keep_every_run_and_round_trip(tmp_path: Path) -> None:
    results = new_results(RunOptions(scenario=REFERENCE, repeat=3))
    runs = [_run({"get": [10 + i] * 90, "set": [50 + i] * 10}, 1.0 + i / 10) for i in range(3)]
    results.backends.append(BackendResult.from_runs(runs))
    results.targets["x"] = {"description": "x", "note": ""}
    path = results.save(tmp_path / "results.json")
    data = json.loads(path.read_text())
    backend = data["backends"][0]
    assert data["run"]["repeat"] == 3
    assert [r["wall_s"] for r in backend["runs"]] == [1.0, 1.1, 1.2]
    assert backend["summary"]["get p50"] == {
        "median": 11, "low": 10, "high": 12, "n": 3, "confidence": 0.75, "unstable": False
    }  # fmt: skip
    loaded = Results.load(path)
    assert loaded == results
    assert loaded.to_dict() == data
    text, markdown = render_text(loaded), render_markdown(loaded)
    assert "over 3 runs:" in text and "runs: 10ns 11ns 12ns" in text
    assert "| Figure | Median | Interval | Runs |" in markdown
    assert "medians of 3 interleaved runs" in markdown and "a 95% one needs 6" in markdown


def test_charts_of_repeated_runs_draw_their_intervals(tmp_path: Path) -> None:
    from djcachebench.bench.plot import plot_results

    results = new_results(RunOptions(scenario=REFERENCE, repeat=3))
    for name in ("a", "b"):
        runs = [_run({"get": list(range(1, 200 + i)), "set": [50 + i] * 10}, 1.0 + i / 10)
                for i in range(3)]  # fmt: skip
        results.backends.append(BackendResult.from_runs(runs))
        results.backends[-1].name = name
    path = results.save(tmp_path / "results.json")
    charts = {p.name for p in plot_results(path)}
    assert {"get.png", "get-percentiles.png", "set-percentiles.png", "throughput.png"} <= charts


def test_schema_1_files_are_still_read(tmp_path: Path) -> None:
    published = PUBLISHED / "results.json"
    assert json.loads(published.read_text())["schema_version"] == 1
    results = Results.load(published)
    assert results.run["repeat"] == 1
    sqlite = next(b for b in results.backends if b.name == "sqlite")
    assert sqlite.actions["get"].p9999 is None and sqlite.runs == []
    assert "1,100 bytes keys, uniform" in render_markdown(results)
    copy = tmp_path / "results.json"
    shutil.copy(published, copy)
    assert main(["plot", str(copy)]) == 0  # charts and report from an old file
    assert (tmp_path / "get.png").exists() and (tmp_path / "report.md").exists()


@pytest.mark.slow
def test_repeats_run_interleaved_in_a_balanced_order_and_keep_each_run() -> None:
    stream = io.StringIO()
    options = RunOptions(scenario=REFERENCE.with_overrides(procs=2, ops=200, warmup=10), repeat=2)
    targets = select_targets(load_targets(), ["locmem", "filebased"])
    results = run_targets(targets, options, Progress(stream=stream, live=False))
    order = [line.split(":")[0] for line in stream.getvalue().splitlines() if " ops in " in line]
    # Balanced: the second round runs in the reverse order, so no target always runs first.
    assert order == ["locmem (run 1/2)", "filebased (run 1/2)",
                     "filebased (run 2/2)", "locmem (run 2/2)"]  # fmt: skip
    assert [b.name for b in results.backends] == ["locmem", "filebased"]
    for backend in results.backends:
        assert len(backend.runs) == 2
        assert all(r.actions["get"].count + r.actions["set"].count + r.actions["delete"].count
                   == 400 for r in backend.runs)  # fmt: skip


@pytest.mark.slow
def test_cli_repeat(tmp_path: Path) -> None:
    argv = ["bench", "--backends", "locmem", "--procs", "2", "--ops", "200", "--repeat", "3",
            "--out", str(tmp_path), "--no-plot", "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    (backend,) = data["backends"]
    assert len(backend["runs"]) == 3 and backend["summary"]["ops/s"]["n"] == 3
    assert "Over 3 runs" in (tmp_path / "report.md").read_text()


def test_run_order_reverses_every_other_round() -> None:
    rounds = [run_order("ABC", index) for index in range(4)]
    assert rounds == [list("ABC"), list("CBA"), list("ABC"), list("CBA")]
    # Over an even number of rounds every item holds each position equally often.
    for item in "ABC":
        assert sorted(r.index(item) for r in rounds) in ([0, 0, 2, 2], [1, 1, 1, 1])
