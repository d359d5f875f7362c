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
        Scenario(name="x", mix={"get": 1, "touch": 1})
    with pytest.raises(ScenarioError, match="value_max"):
        Scenario(name="x", value_min=10, value_max=5)


def test_overrides_ignore_none() -> None:
    changed = REFERENCE.with_overrides(procs=2, ops=None)
    assert (changed.procs, changed.ops) == (2, REFERENCE.ops)


def test_reference_op_lists_are_what_they_always_were() -> None:
    # Digests of the op list and pre-fill the generator made before keys and
    # values became configurable: the published reference results ran these.
    import hashlib
    import pickle

    ops = generate_ops(REFERENCE.with_overrides(ops=5_000, warmup=100), 0, 1)
    prefill = list(prefill_items(REFERENCE, 0))
    assert hashlib.sha256(pickle.dumps(ops)).hexdigest() == (
        "518e820217724d2ea4bfa79dcf7c62610011e09ddd7066e5b549c17949be0049"
    )
    assert hashlib.sha256(pickle.dumps(prefill)).hexdigest() == (
        "fbe31b1f5fc82dc88660c83132c8527875b01694eb7c80ec0b9370127d3052a6"
    )


SHIPPED = {
    "reference": {"get": 0.9, "set": 0.09, "delete": 0.01},
    "read-heavy": {"get": 0.95, "set": 0.05, "delete": 0.0},
    "mixed": {"get": 0.7, "set": 0.2, "delete": 0.1},
    "write-heavy": {"get": 0.4, "set": 0.5, "delete": 0.1},
    "api-json": {"get": 0.9, "set": 0.09, "delete": 0.01},
    "html-pages": {"get": 0.9, "set": 0.09, "delete": 0.01},
    "large-values": {"get": 0.9, "set": 0.09, "delete": 0.01},
    "many-keys": {"get": 0.9, "set": 0.09, "delete": 0.01},
    "counters": {"get": 0.15, "set": 0.05, "incr": 0.8},
}


def test_every_shipped_scenario_loads_with_its_mix() -> None:
    from djcachebench.bench.workload import scenario_names

    assert set(scenario_names()) == set(SHIPPED)
    for name, mix in SHIPPED.items():
        scenario = load_scenario(name)
        assert scenario.name == name and scenario.description
        assert scenario.fractions() == pytest.approx(mix), name
        # New scenarios use str keys, as Django code does; the reference keeps bytes.
        assert scenario.key_type == ("bytes" if name == "reference" else "str"), name


def test_the_value_and_key_scenarios_say_what_they_are() -> None:
    api = load_scenario("api-json")
    assert (api.value_kind, api.value_dist, api.value_max) == ("dict", "fixed", 10_000)
    html = load_scenario("html-pages")
    assert html.value_kind == "str" and 50_000 <= html.value_min <= html.value_max <= 70_000
    large = load_scenario("large-values")
    assert (large.value_kind, large.value_dist) == ("bytes", "log-uniform")
    assert (large.value_min, large.value_max) == (100_000, 10_000_000)
    from djcachebench.bench.values import mean_size

    # Full, it fits in memory and on disk many times over on a 24 GB machine.
    assert large.keys * mean_size(large.value_dist, large.value_min, large.value_max) < 300e6
    many = load_scenario("many-keys")
    assert (many.keys, many.key_popularity, many.zipf_s) == (1_000_000, "zipf", 1.0)
    assert 50 <= many.value_min <= 100 <= many.value_max <= 150
    counters = load_scenario("counters")
    assert counters.value_kind == "int" and counters.fractions()["incr"] == 0.8


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_op_lists_of_every_scenario_are_deterministic(name: str) -> None:
    scenario = load_scenario(name).with_overrides(ops=300, warmup=0, keys=5_000)
    ops = generate_ops(scenario, 2, 1)
    assert ops == generate_ops(scenario, 2, 1)
    assert ops != generate_ops(scenario, 3, 1)
    key_type = bytes if scenario.key_type == "bytes" else str
    assert all(isinstance(key, key_type) for _, key, _ in ops)
    values = [value for code, _, value in ops if code == SET]
    assert values and all(value is not None for value in values)


def test_counters_incr_and_int_values() -> None:
    from djcachebench.bench.workload import INCR

    scenario = load_scenario("counters").with_overrides(ops=5_000, warmup=0)
    ops = generate_ops(scenario, 0, 0)
    counts = Counter(code for code, _, _ in ops)
    assert counts[INCR] / len(ops) == pytest.approx(0.8, abs=0.02)
    assert DELETE not in counts
    assert all(isinstance(v, int) for code, _, v in ops if code == SET)
    assert all(isinstance(v, int) for _, v in prefill_items(scenario, 0))


def test_many_keys_ops_reach_the_tail_and_the_prefill_is_bounded() -> None:
    scenario = load_scenario("many-keys").with_overrides(ops=20_000, warmup=0)
    ops = generate_ops(scenario, 0, 0)
    indexes = Counter(int(key) for _, key, _ in ops)
    assert indexes.most_common(1)[0][0] == 0
    assert max(indexes) > 10_000  # the long tail is reached
    limited = list(prefill_items(scenario, 0, limit=2_000))
    assert [k for k, _ in limited[-3:]] == ["2", "1", "0"]  # the most popular written last
    assert len(limited) == 2_000


def test_new_fields_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="incr needs value_kind = 'int'"):
        Scenario(name="x", mix={"get": 1, "incr": 1})
    with pytest.raises(ScenarioError, match="value_dist 'fixed' needs value_min == value_max"):
        Scenario(name="x", value_dist="fixed", value_min=1, value_max=2)
    with pytest.raises(ScenarioError, match="zipf_s must be > 0"):
        Scenario(name="x", key_popularity="zipf", zipf_s=0)
    with pytest.raises(ScenarioError, match="value_kind must be one of"):
        Scenario(name="x", value_kind="xml")
    with pytest.raises(ScenarioError, match="key_popularity must be one of"):
        Scenario(name="x", key_popularity="pareto")
    toml = tmp_path / "mine.toml"
    toml.write_text(
        'name = "mine"\nkeys = 50\nkey_popularity = "zipf"\nzipf_s = 1\n'
        'value_kind = "rows"\nvalue_dist = "fixed"\nvalue_min = 2_000\nvalue_max = 2_000\n'
        "[mix]\nget = 1\nset = 1\n"
    )
    mine = load_scenario(toml)
    assert (mine.zipf_s, mine.value_kind, mine.fractions()) == (
        1.0, "rows", {"get": 0.5, "set": 0.5}
    )  # fmt: skip


def test_value_size_override() -> None:
    fixed = REFERENCE.with_value_size(100, 100)
    assert (fixed.value_dist, fixed.value_min, fixed.value_max) == ("fixed", 100, 100)
    spread = fixed.with_value_size(10, 20)
    assert (spread.value_dist, spread.value_min, spread.value_max) == ("uniform", 10, 20)
    large = load_scenario("large-values").with_value_size(1_000, 5_000)
    assert large.value_dist == "log-uniform"


def test_key_limit_of_a_caches_entry() -> None:
    from djcachebench.bench.worker import key_limit

    assert key_limit({"OPTIONS": {"MAX_ENTRIES": 1000}}) == 1000
    assert key_limit({"OPTIONS": {"L2": {"OPTIONS": {"MAX_ENTRIES": 50}}}}) == 50
    assert key_limit({"OPTIONS": {"L2": "disk"}}) is None
    assert key_limit({"BACKEND": "x"}) is None
