"""Reports and charts that answer the question: every series told apart, a
per-process cache marked, percentiles the sample cannot support flagged or left
out, and figures in units people read."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from djcachebench.bench.chart_style import series_style
from djcachebench.bench.formats import format_bytes, format_percentile
from djcachebench.bench.report import render_markdown, render_text, table_rows
from djcachebench.bench.results import BackendResult, Results
from djcachebench.bench.runner import RunOptions, new_results
from djcachebench.bench.stats import ActionStats, min_samples, supported
from djcachebench.bench.workload import REFERENCE


def test_sixteen_series_get_sixteen_colours_and_sixteen_markers() -> None:
    styles = [series_style(i) for i in range(16)]
    assert len({s.color for s in styles}) == 16
    assert len({s.marker for s in styles}) == 16
    assert series_style(0, per_process=True).linestyle != series_style(0).linestyle


def test_a_percentile_needs_ten_calls_beyond_it() -> None:
    assert [min_samples(q) for q in (50, 90, 99, 99.9)] == [20, 100, 1_000, 10_000]
    assert not supported(90, 6) and supported(50, 20) and supported(100, 1)
    assert format_percentile(12_300, 90, 6) == "12.3µs*"
    assert format_percentile(12_300, 50, 6_000) == "12.3µs"


@pytest.mark.parametrize(
    ("n", "signed", "text"),
    [(1023 * 1024, False, "1023 KiB"), (1024 * 1024 - 300, False, "1 MiB"),
     (-3 * 1024 * 1024, True, "-3 MiB"), (12_900, True, "+12.6 KiB"), (999, False, "999 B"),
     (0, True, "0 B")],
)  # fmt: skip
def test_bytes_read_without_exponents_and_changes_carry_their_sign(
    n: int, signed: bool, text: str
) -> None:
    assert format_bytes(n, signed) == text


def six_deletes() -> Results:
    results = new_results(RunOptions(scenario=REFERENCE, command=["djcachebench", "bench"]))
    for name, per_process in (("locmem", True), ("redis", False)):
        actions = {
            "get": ActionStats.from_samples(list(range(1_000, 3_000)), miss=100),
            "delete": ActionStats.from_samples([5_000, 6_000, 7_000, 8_000, 9_000, 90_000], 1),
        }
        results.backends.append(
            BackendResult(name, actions, wall_s=1.0, ops=2_006,
                          footprint={"rss_growth_bytes": [-2 * 1024 * 1024, 1023 * 1024]})
        )  # fmt: skip
        results.targets[name] = {"description": name, "note": "", "per_process": per_process}
    return results


def test_six_delete_calls_flag_p90_and_p99_and_the_report_says_why() -> None:
    results = six_deletes()
    delete = dict((row[0], row) for row in table_rows(results.backends[1]))["delete"]
    median, p90, p99, max_ = delete[6:10]
    assert median.endswith("*") and p90.endswith("*") and p99.endswith("*")  # 6 < 20
    assert max_ == "90µs"
    get = dict((row[0], row) for row in table_rows(results.backends[1]))["get"]
    assert get[6:9] == ["2µs", "2.8µs", "2.98µs"]  # 2,000 gets: p99 needs only 1,000
    markdown = render_markdown(results)
    assert "too few calls for this percentile" in markdown
    assert "| locmem (per-process) |" in markdown and "## locmem (per-process)" in markdown
    assert "e+0" not in markdown and "e+0" not in render_text(results)
    assert "-2 MiB, +1023 KiB" in markdown  # RSS changes: signed, labelled as changes
    assert "RSS change/worker" in markdown


def test_charts_leave_out_thin_percentiles_and_draw_the_hit_rate(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from djcachebench.bench.plot import plot_results

    path = six_deletes().save(tmp_path / "results.json")
    names = {p.name for p in plot_results(path)}
    assert {"hit-rate.png", "throughput.png", "delete-percentiles.png"} <= names


def drawn(monkeypatch: pytest.MonkeyPatch, draw: Any, results: Results, *args: Any) -> Any:
    """The matplotlib figure ``draw`` saved (kept from plot._finish, which closes it)."""
    from djcachebench.bench import plot

    figures = []
    finish = plot._finish

    def keep(fig: Any, results: Results, path: Path) -> Path:
        figures.append(fig)
        return finish(fig, results, path)

    monkeypatch.setattr(plot, "_finish", keep)
    draw(results, *args)
    (figure,) = figures
    return figure


def budget_run() -> Results:
    """The subtitle of a first run on a server: a budget and a long CPU name."""
    results = six_deletes()
    results.run["budget_s"] = 25
    results.machine["cpu_model"] = "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz"
    return results


@pytest.mark.parametrize("chart", ["plot_percentiles", "plot_action"])
def test_a_chart_title_fits_inside_its_figure(
    chart: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from djcachebench.bench import plot

    fig = drawn(monkeypatch, getattr(plot, chart), budget_run(), "get", tmp_path / "c.png")
    title = fig.axes[0].title
    box = title.get_window_extent(FigureCanvasAgg(fig).get_renderer())  # closed: a new canvas
    assert "Xeon" in title.get_text()
    assert box.x0 >= 0 and box.x1 <= fig.bbox.width


def test_the_legend_lists_only_the_percentiles_drawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    from djcachebench.bench.plot import plot_action

    def legend(action: str) -> list[str]:
        fig = drawn(monkeypatch, plot_action, six_deletes(), action, tmp_path / "c.png")
        return [t.get_text() for t in fig.axes[0].get_legend().get_texts()]

    assert legend("delete") == ["max"]  # six calls: not even a median
    assert legend("get") == ["p50", "p90", "p99", "max"]  # 2,000 gets: no p99.9


def test_the_throughput_chart_explains_only_the_marks_it_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    from djcachebench.bench.plot import plot_throughput

    results = six_deletes()
    redis = results.backends[1]
    redis.actions["get"] = replace(redis.actions["get"], stale=5)
    stale = drawn(monkeypatch, plot_throughput, results, tmp_path / "t.png")
    label = stale.axes[0].get_xlabel()
    assert "in red" in label and "FAILED" not in label
    redis.failures.append("get: wrong values")
    failed = drawn(monkeypatch, plot_throughput, results, tmp_path / "t.png")
    assert "FAILED" in failed.axes[0].get_xlabel()
