"""What a cache answers is checked: wrong values and all-failing actions fail a target.

A cache that answers every get with the same bytes and stores nothing must
not come out as the fastest backend with no misses; one whose every set
raises must not show a 0 ns set. These run real worker processes (and a real
memcached) and read the figures the harness wrote.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import pytest
from django.core.cache.backends.locmem import LocMemCache

from djcachebench.bench.progress import Progress
from djcachebench.bench.report import render_markdown, render_text
from djcachebench.bench.results import Results
from djcachebench.bench.runner import RunOptions, run_targets
from djcachebench.bench.stats import ActionStats, format_ns
from djcachebench.bench.targets import Target, load_targets, select_targets
from djcachebench.bench.values import KINDS, build_pool
from djcachebench.bench.workload import REFERENCE, SET, Scenario, generate_ops

# Names added with the checks are imported in the tests, so that each test
# fails on the code before them by its assertions, not at collection.
NO_LATENCY = "\u2013"


class GarbageCache(LocMemCache):
    """Answers b"garbage" for every key and stores nothing (the attack's WrongValueCache)."""

    def get(self, key: Any, default: Any = None, version: Any = None) -> Any:
        return b"garbage"

    def get_many(self, keys: Any, version: Any = None) -> dict[Any, Any]:
        return {key: b"garbage" for key in keys}

    def set(self, *args: Any, **kwargs: Any) -> None:
        return None


class SwappingCache(LocMemCache):
    """Stores faithfully but answers a get of key K with key K+1's value, when it has one."""

    def get(self, key: Any, default: Any = None, version: Any = None) -> Any:
        other = key[:-1] + bytes([key[-1] ^ 1]) if isinstance(key, bytes) else key + "x"
        return super().get(other, default, version)


def _quiet() -> Progress:
    return Progress(live=False, stream=io.StringIO())


SMALL = RunOptions(scenario=REFERENCE.with_overrides(procs=2, ops=300, warmup=10))


def _target(name: str, cls: type) -> Target:
    return Target(name, name, caches=lambda env: {"BACKEND": f"{__name__}.{cls.__name__}",
                                                  "LOCATION": name})  # fmt: skip


@pytest.mark.slow
def test_wrong_values_are_counted_reported_and_fail_the_target(tmp_path: Path) -> None:
    locmem = select_targets(load_targets(), ["locmem"])
    targets = [_target("garbage", GarbageCache), _target("swapping", SwappingCache), *locmem]
    results = run_targets(targets, SMALL, _quiet())
    by_name = {b.name: b for b in results.backends}
    garbage, swapping, good = by_name["garbage"], by_name["swapping"], by_name["locmem"]
    gets = garbage.actions["get"]
    # Nothing it holds is an entry; every get "hit", and every answer was wrong.
    assert garbage.footprint is not None and garbage.footprint["entries"] == 0
    assert gets.miss == 0 and gets.wrong == gets.count > 0
    assert any("wrong values" in why for why in garbage.failures)
    # Another key's value is no more right than garbage.
    assert swapping.actions["get"].wrong > 0 and swapping.failures
    assert good.actions["get"].wrong == 0 and not good.failures
    assert good.footprint is not None and good.footprint["entries"] > 0
    from djcachebench.bench.cli import failed_targets

    path = results.save(tmp_path / "results.json")
    saved = Results.load(path)
    assert saved.backends[0].actions["get"].wrong == gets.wrong
    assert sorted(failed_targets(saved)) == ["garbage", "swapping"]
    summary = render_markdown(saved).split("## Summary", 1)[1].split("\n\n")[1]
    header = [c.strip() for c in summary.splitlines()[0].strip("|").split("|")]

    def cells(name: str) -> dict[str, str]:
        row = next(line for line in summary.splitlines() if line.startswith(f"| {name} "))
        return dict(zip(header, (c.strip() for c in row.strip("|").split("|")), strict=True))

    assert cells("garbage")["Wrong"] == f"{gets.wrong:,}"
    assert cells("garbage")["Status"] == "**FAILED**"
    assert cells("garbage")["Stale"] == "0"
    assert cells("locmem")["Wrong"] == "0" and cells("locmem")["Status"] == "ok"
    assert cells("locmem")["Stale"] == f"{good.actions['get'].stale:,}"
    assert "FAILED: get: " in render_text(saved)


def test_fingerprints_survive_the_serializers_and_tell_values_apart() -> None:
    from djcachebench.bench.verify import fingerprint
    from djcachebench.serializers import load_serializer

    serializers = [load_serializer("pickle"), load_serializer("msgpack")]
    for kind in KINDS:
        pool = build_pool(kind, "uniform", 2_000, 3_000, 4, 0)
        prints = {fingerprint(kind, v) for v in pool}
        assert len(prints) == len(set(map(repr, pool))), kind
        for value in pool:
            for serializer in serializers:
                try:
                    back = serializer.loads(serializer.dumps(value))
                except TypeError:
                    continue  # msgpack refuses Decimal rows: a set error, not a get
                assert fingerprint(kind, back) == fingerprint(kind, value), (kind, serializer)
        assert fingerprint(kind, b"garbage") not in prints
        assert fingerprint(kind, 42) not in prints or kind == "int"


def test_expected_values_are_per_key() -> None:
    from djcachebench.bench.verify import expected, fingerprint

    scenario = Scenario(name="t", procs=2, ops=400, warmup=0, keys=30, value_pool=0)
    ops = [op for w in range(2) for op in generate_ops(scenario, 0, w) if op[0] == SET]
    keys = {key for _, key, _ in ops}
    allowed = expected(scenario, 0, keys, None)
    for _, key, value in ops:
        assert fingerprint("bytes", value) in allowed[key]
    (_, key_a, value_a), other = ops[0], next(op for op in ops if op[1] != ops[0][1])
    assert fingerprint("bytes", value_a) not in allowed[other[1]] - allowed[key_a]
    assert fingerprint("bytes", pickle.loads(pickle.dumps(value_a))) in allowed[key_a]


def test_an_action_without_samples_has_no_latency() -> None:
    stats = ActionStats.from_samples([], miss=0, errors=7)
    assert (stats.p50, stats.p99, stats.max, stats.p9999) == (None, None, None, None)
    data = stats.to_dict()
    assert data["p50_ns"] is None and data["errors"] == 7
    assert ActionStats.from_dict(data) == stats
    assert format_ns(stats.p50) == NO_LATENCY  # type: ignore[arg-type]
    assert stats.latency_points() == [] and stats.percentile_points() == []


@pytest.mark.slow
@pytest.mark.servers
def test_a_target_whose_every_set_raises_is_failed_not_fastest(tmp_path: Path) -> None:
    # memcached refuses 2 MB items (pylibmc.TooBig on every set; every get misses).
    scenario = REFERENCE.with_overrides(procs=1, ops=60, warmup=5, keys=20)
    options = RunOptions(scenario=scenario.with_value_size(2_000_000, 2_000_000))
    results = run_targets(select_targets(load_targets(), ["memcached"]), options, _quiet())
    if results.skipped:
        pytest.skip(results.skipped[0].reason)
    (memcached,) = results.backends
    sets = memcached.actions["set"]
    assert sets.count == 0 and sets.errors > 0
    assert sets.p50 is None and sets.p99 is None and sets.max is None
    from djcachebench.bench.cli import failed_targets

    assert any(why.startswith("set: every call raised") for why in memcached.failures)
    saved = Results.load(results.save(tmp_path / "results.json"))
    assert failed_targets(saved) == ["memcached"]
    lines = render_markdown(saved).splitlines()
    row = next(r for r in lines if r.startswith("| memcached "))
    header = next(r for r in lines if r.startswith("| Backend ") and "set p50" in r)
    cells = dict(zip([c.strip() for c in header.strip("|").split("|")],
                     [c.strip() for c in row.strip("|").split("|")], strict=True))
    assert [cells["set p50"], cells["set p99"]] == [NO_LATENCY, NO_LATENCY]
    assert cells["Status"] == "**FAILED**"
    assert "0ns" not in row
    pytest.importorskip("matplotlib")
    from djcachebench.bench.plot import plot_throughput, throughput_mark

    assert throughput_mark(saved.backends[0]) == "FAILED"
    assert plot_throughput(saved, tmp_path / "throughput.png").stat().st_size > 0


@pytest.mark.slow
def test_a_cache_that_keeps_nothing_fails_its_target() -> None:
    """Django's DummyCache (every get a miss, nothing stored) must not be ranked
    fastest, status ok: every get missing although the workload pre-filled and
    set its keys is not a cache's figure."""
    dummy = Target("dummy", "dummy", caches=lambda env: {
        "BACKEND": "django.core.cache.backends.dummy.DummyCache"})
    results = run_targets([dummy, *select_targets(load_targets(), ["locmem"])], SMALL, _quiet())
    by_name = {b.name: b for b in results.backends}
    gets = by_name["dummy"].actions["get"]
    assert gets.count > 0 and gets.miss == gets.count
    assert any("kept nothing" in why for why in by_name["dummy"].failures)
    assert not by_name["locmem"].failures
