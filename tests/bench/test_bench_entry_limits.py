"""A scenario's entry limit reaches every target that has one, and the report says so.

The reference keeps its caches at 1,000 keys; ``many-keys`` declares
``max_entries = "keys"`` so that locmem, sqlite and tiered hold every key,
as diskcache, redis and memcached do. The limit is scenario data, applied
by each target's definition through ``TargetEnv.key_limit()``.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from djcachebench.bench.progress import Progress
from djcachebench.bench.report import describe_entry_limits, entry_limit, render_markdown
from djcachebench.bench.runner import RunOptions, run_targets
from djcachebench.bench.targets import KEY_LIMIT, TargetEnv, load_targets, select_targets
from djcachebench.bench.workload import REFERENCE, ScenarioError, load_scenario

SERVERS = {"memcached": "127.0.0.1:1", "redis": "redis://127.0.0.1:2/0"}
#: The targets with Django's MAX_ENTRIES (directly or on their inline L2).
BOUNDED = {"locmem", "filebased", "db", "sqlite", "tiered"}


def test_the_reference_keeps_its_thousand_key_limit() -> None:
    assert REFERENCE.max_entries == KEY_LIMIT["MAX_ENTRIES"] == 1000
    assert load_scenario("reference").entry_limit() == 1000


def test_many_keys_gives_room_for_every_key_and_follows_a_keys_override() -> None:
    many = load_scenario("many-keys")
    assert many.max_entries == "keys"
    assert many.entry_limit() == 2_000_000
    assert many.with_overrides(keys=20_000).entry_limit() == 40_000


@pytest.mark.parametrize("bad", [0, -5, "all", True, 1.5])
def test_a_bad_max_entries_is_refused_with_its_name(bad: object) -> None:
    with pytest.raises(ScenarioError, match="max_entries"):
        REFERENCE.with_overrides(max_entries=bad)


@pytest.mark.parametrize("limit", [1000, 123_456])
def test_every_bounded_target_takes_the_scenarios_limit(tmp_path: Path, limit: int) -> None:
    env = TargetEnv(tmp_path, SERVERS, max_entries=limit)
    limits = {t.name: entry_limit(t.django_settings(env)["CACHES"]["default"])
              for t in load_targets()}  # fmt: skip
    assert {name for name, got in limits.items() if got is not None} == BOUNDED
    assert {limits[name] for name in BOUNDED} == {limit}


def test_a_many_keys_run_holds_every_key_in_sqlite_and_says_so(tmp_path: Path) -> None:
    # 3,000 keys: with the reference's limit sqlite would hold at most 1,000.
    scenario = load_scenario("many-keys").with_overrides(keys=3_000, procs=2, ops=200, warmup=20)
    (target,) = select_targets(load_targets(), ["sqlite"])
    options = RunOptions(scenario=scenario)
    results = run_targets([target], options, Progress(live=False, stream=io.StringIO()))
    (backend,) = results.backends
    settings = results.targets["sqlite"]["settings"]["CACHES"]["default"]
    assert settings["OPTIONS"]["MAX_ENTRIES"] == 6_000
    # Every key pre-filled; only the ops' few deletes may have removed some.
    assert backend.footprint is not None
    assert backend.footprint["entries"] >= 3_000 - backend.actions["delete"].count
    line = describe_entry_limits(results)
    assert line.startswith("`MAX_ENTRIES` 6,000: sqlite (room for every key")
    assert line in render_markdown(results)
