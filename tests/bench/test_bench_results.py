"""results.json: versioned, round-trips exactly; report and charts read only it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from djcachebench.bench.report import COLUMNS, render_markdown, render_text, write_report
from djcachebench.bench.results import (
    SCHEMA_VERSION,
    BackendResult,
    Results,
    ResultsError,
    Skipped,
    machine_info,
    oversubscription_warning,
)
from djcachebench.bench.runner import RunOptions, new_results
from djcachebench.bench.stats import ActionStats
from djcachebench.bench.workload import REFERENCE


def sample_results() -> Results:
    results = new_results(RunOptions(scenario=REFERENCE, seed=3, command=["djcachebench", "bench"]))
    results.warnings = [oversubscription_warning(8, 2) or ""]
    for i, name in enumerate(["locmem", "redis", "db"]):
        scale = 10**i
        actions = {
            action: ActionStats.from_samples(
                [scale * k for k in range(1_000, 1_000 + n)], miss=n // 10
            )
            for action, n in (("get", 900), ("set", 90), ("delete", 10))
        }
        results.backends.append(BackendResult(name, actions, wall_s=1.5 * scale, ops=1_000))
        results.targets[name] = {"description": name, "note": "", "settings": {"CACHES": {}}}
    results.skipped.append(Skipped("sqlite", "module not importable: djcachebench.backends.sqlite"))
    results.skipped.append(Skipped("tiered", "worker 0 raised Boom", "failed"))
    return results


def test_round_trip_is_exact(tmp_path: Path) -> None:
    results = sample_results()
    path = results.save(tmp_path / "results.json")
    loaded = Results.load(path)
    assert loaded == results
    assert loaded.to_dict() == json.loads(path.read_text())


def test_file_carries_schema_machine_and_skips(tmp_path: Path) -> None:
    data = json.loads(sample_results().save(tmp_path / "r.json").read_text())
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["created"].endswith("Z")
    machine = data["machine"]
    for key in ("cpu_count", "cpu_model", "platform", "python", "django", "sqlite", "packages"):
        assert machine[key], key
    assert set(machine["packages"]) >= {"diskcache", "django-redis", "redis", "pylibmc", "msgpack"}
    assert data["run"] == {
        "procs": 8, "threads": 1, "tasks": 0, "ops": 100_000, "warmup": 1_000, "seed": 3,
        "start_method": "spawn", "repeat": 1, "budget_s": None,
    }  # fmt: skip
    get = data["backends"][0]["actions"]["get"]
    assert set(get) == {
        "count", "miss", "errors", "wrong", "stale", "p50_ns", "p90_ns", "p99_ns", "p99_9_ns",
        "p99_99_ns", "max_ns", "total_ns",
    }  # fmt: skip
    assert data["backends"][1]["ops_per_s"] == pytest.approx(1_000 / 15, abs=0.1)
    assert data["skipped"][0] == {
        "name": "sqlite",
        "reason": "module not importable: djcachebench.backends.sqlite",
        "status": "skipped",
    }


def test_other_schema_versions_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    data = sample_results().to_dict()
    data["schema_version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(ResultsError, match=r"schema_version 99 is not supported .*reads 1, 2"):
        Results.load(path)
    path.write_text("{not json")
    with pytest.raises(ResultsError, match="cannot read"):
        Results.load(path)


def test_oversubscription_warning() -> None:
    assert oversubscription_warning(2, 2) is None
    warning = oversubscription_warning(8, 2)
    assert warning and "8 worker processes share 2 CPU core(s)" in warning
    assert machine_info()["usable_cpus"] >= 1


def test_reports_show_every_column_skip_and_warning(tmp_path: Path) -> None:
    results = sample_results()
    text = render_text(results)
    for column in COLUMNS:
        assert column in text
    assert "ops/s" in text and "wall time" in text
    assert "SKIPPED sqlite: module not importable" in text
    assert "FAILED tiered: worker 0 raised Boom" in text
    assert "WARNING: 8 worker processes share 2 CPU core(s)" in text

    path = results.save(tmp_path / "results.json")
    report = write_report(path, ["get.png", "throughput.png"]).read_text()
    assert report == render_markdown(Results.load(path), ["get.png", "throughput.png"])
    header = "| Action | Count | Miss | Errors | Wrong | Stale | Median | P90 | P99 | Max | Total |"
    assert header in report
    assert "> **Warning:** 8 worker processes" in report
    assert "- **sqlite** (skipped): module not importable" in report
    assert "![get](get.png)" in report
    assert "## Summary" in report


def test_charts_are_drawn_from_the_file(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from djcachebench.bench.plot import plot_results

    path = sample_results().save(tmp_path / "results.json")
    charts = plot_results(path)
    assert sorted(c.name for c in charts) == [
        "delete-percentiles.png", "delete.png", "get-percentiles.png", "get.png",
        "hit-rate.png", "set-percentiles.png", "set.png", "throughput.png"
    ]  # fmt: skip
    for chart in charts:
        assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_distribution_chart_points_are_hdrhistogram_style() -> None:
    from djcachebench.bench.plot import distribution

    stats = ActionStats.from_samples(list(range(1, 100_001)), miss=0)  # 1..100,000 ns
    points = distribution(stats)
    # x = 1/(1 - q): p50, p90, p99, p99.9, p99.99 are 2, 10, 100, 1,000, 10,000.
    assert [x for x, _ in points] == [2, 10, 100, 1_000, 10_000]
    assert [us for _, us in points] == [50, 90, 99, 99.9, 99.99]  # nearest rank, in µs
    old = ActionStats.from_dict({k: v for k, v in stats.to_dict().items() if k != "p99_99_ns"})
    assert len(distribution(old)) == 4  # a schema-1 file has no p99.99


def test_the_code_revision_is_the_packages_not_djcachebench_roots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$DJCACHEBENCH_ROOT lends target definitions, not code: a wheel's run is not
    labelled with that checkout's commit as its code."""
    import subprocess

    from djcachebench.bench.results import git_revision

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), *args], capture_output=True,
                              text=True, check=True).stdout.strip()  # fmt: skip

    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x")
    other = git("rev-parse", "--short=12", "HEAD")
    own = git_revision()
    monkeypatch.setenv("DJCACHEBENCH_ROOT", str(tmp_path))
    assert git_revision() == own and (own is None or not own.startswith(other))
