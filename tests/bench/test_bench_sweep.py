"""``djcachebench sweep``: one parameter over a list, every target at each value."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from djcachebench.bench.cli import main
from djcachebench.bench.results import ResultsError
from djcachebench.bench.sweep import Sweep, parse_vary, point_scenario
from djcachebench.bench.workload import REFERENCE


def test_vary_parses_names_and_sizes() -> None:
    assert parse_vary("procs=1,2,4") == ("procs", [1, 2, 4])
    assert parse_vary("value-size=100,10k,64KiB") == ("value_size", [100, 10_000, 65_536])
    assert parse_vary("keys=1k,100k") == ("keys", [1_000, 100_000])
    assert parse_vary("threads=1,10,100") == ("threads", [1, 10, 100])
    assert parse_vary("tasks=1,10,100,1k") == ("tasks", [1, 10, 100, 1_000])
    for bad in ("colour=1,2", "procs=1", "procs", "keys=1,x"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_vary(bad)


def test_each_point_changes_only_its_parameter() -> None:
    assert point_scenario(REFERENCE, "procs", 4).procs == 4
    assert point_scenario(REFERENCE, "keys", 5_000).keys == 5_000
    sized = point_scenario(REFERENCE, "value_size", 10_000)
    assert (sized.value_min, sized.value_max, sized.value_dist) == (10_000, 10_000, "fixed")
    assert point_scenario(REFERENCE, "procs", 4).mix == REFERENCE.mix


@pytest.mark.slow
@pytest.mark.servers
def test_sweep_of_procs_writes_a_file_that_round_trips(tmp_path: Path) -> None:
    code = main(["sweep", "--vary", "procs=1,2", "--scenario", "reference", "--ops", "300",
                 "--backends", "locmem,sqlite,redis", "--out", str(tmp_path)])  # fmt: skip
    assert code == 0
    path = tmp_path / "sweep.json"
    data = json.loads(path.read_text())
    assert data["kind"] == "sweep" and data["parameter"] == "procs"
    assert [p["results"]["run"]["procs"] for p in data["points"]] == [1, 2]
    loaded = Sweep.load(path)
    assert loaded.to_dict() == data  # the file is the whole sweep: nothing lost or added
    assert loaded.backends() == ["locmem", "redis", "sqlite"]
    for procs, results in zip(loaded.values, loaded.points, strict=True):
        for backend in results.backends:
            assert backend.actions["get"].count + backend.actions["get"].errors > 0
            assert backend.ops == procs * 300
    assert (tmp_path / "sweep.png").stat().st_size > 10_000
    assert "| 2 |" in (tmp_path / "sweep.md").read_text()
    data["kind"] = "results"
    path.write_text(json.dumps(data))
    with pytest.raises(ResultsError, match="not a sweep"):
        Sweep.load(path)
