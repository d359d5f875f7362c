"""Scenarios and op lists: deterministic for a seed, faithful to the mix."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from djcachebench.bench.paths import scenarios_dir
from djcachebench.bench.workload import (
    DELETE,
    GET,
    REFERENCE,
    SET,
    Scenario,
    ScenarioError,
    generate_ops,
    load_scenario,
    prefill_items,
)


def test_same_seed_and_worker_give_the_same_ops() -> None:
    scenario = REFERENCE.with_overrides(ops=2_000, warmup=100)
    assert generate_ops(scenario, 7, 3) == generate_ops(scenario, 7, 3)


def test_workers_and_seeds_draw_different_streams() -> None:
    scenario = REFERENCE.with_overrides(ops=500, warmup=0)
    ops = generate_ops(scenario, 0, 0)
    assert ops != generate_ops(scenario, 0, 1)
    assert ops != generate_ops(scenario, 1, 0)
    # Worker i uses Random(seed + i), as documented: (seed 0, worker 1) == (seed 1, worker 0).
    assert generate_ops(scenario, 0, 1) == generate_ops(scenario, 1, 0)


def test_op_list_follows_the_reference_scenario() -> None:
    scenario = REFERENCE.with_overrides(ops=50_000, warmup=1_000)
    ops = generate_ops(scenario, 0, 0)
    assert len(ops) == 51_000
    counts = Counter(code for code, _, _ in ops)
    assert counts[GET] / len(ops) == pytest.approx(0.90, abs=0.01)
    assert counts[SET] / len(ops) == pytest.approx(0.09, abs=0.01)
    assert counts[DELETE] / len(ops) == pytest.approx(0.01, abs=0.003)
    keys = {key for _, key, _ in ops}
    assert keys <= {str(i).encode() for i in range(1_100)}
    assert len(keys) > 1_000
    sizes = [len(value) for code, _, value in ops if code == SET and value is not None]
    assert min(sizes) >= 1 and max(sizes) <= 495
    assert all(value is None for code, _, value in ops if code != SET)


def test_prefill_sets_every_key_once() -> None:
    items = list(prefill_items(REFERENCE, 0))
    assert [key for key, _ in items] == [str(i).encode() for i in range(1_100)]
    assert all(1 <= len(value) <= 495 for _, value in items)
    assert items == list(prefill_items(REFERENCE, 0))


def test_reference_toml_is_the_builtin_reference() -> None:
    assert load_scenario("reference") == REFERENCE
    assert REFERENCE.procs == 8 and REFERENCE.ops == 100_000
    assert REFERENCE.fractions() == {"get": 0.9, "set": 0.09, "delete": 0.01}


@pytest.mark.parametrize(
    ("name", "mix"),
    [("read-heavy", {"get": 0.95, "set": 0.05, "delete": 0.0}),
     ("write-heavy", {"get": 0.4, "set": 0.5, "delete": 0.1})],
)  # fmt: skip
def test_shipped_scenarios_load(name: str, mix: dict[str, float]) -> None:
    scenario = load_scenario(name)
    assert scenario.name == name
    assert scenario.fractions() == pytest.approx(mix)
    assert {p.stem for p in scenarios_dir().glob("*.toml")} >= {name, "reference"}


def test_scenario_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"no scenario 'nope'; available: .*reference"):
        load_scenario("nope")
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\nprocz = 3\n')
    with pytest.raises(ScenarioError, match=r"unknown scenario field\(s\) \['procz'\]"):
        load_scenario(bad)
    with pytest.raises(ScenarioError, match="unknown action"):
        Scenario(name="x", mix={"get": 1, "incr": 1})
    with pytest.raises(ScenarioError, match="value_max"):
        Scenario(name="x", value_min=10, value_max=5)


def test_overrides_ignore_none() -> None:
    changed = REFERENCE.with_overrides(procs=2, ops=None)
    assert (changed.procs, changed.ops) == (2, REFERENCE.ops)
