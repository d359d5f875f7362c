"""Targets and the runner: every definition, skips and failures with their reasons."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from django.core.cache.backends.locmem import LocMemCache

from djcachebench.bench import server_pool
from djcachebench.bench.progress import Progress
from djcachebench.bench.runner import RunOptions, run_targets
from djcachebench.bench.servers import RedisServer
from djcachebench.bench.targets import (
    KEY_LIMIT,
    Target,
    TargetEnv,
    TargetError,
    load_targets,
    select_targets,
)
from djcachebench.bench.workload import REFERENCE

ALL = ["locmem", "filebased", "db", "memcached", "redis", "diskcache",
       "sqlite-floor", "sqlite", "tiered", "tiered-redis", "tiered-redis-cluster"]  # fmt: skip
SMALL = RunOptions(scenario=REFERENCE.with_overrides(procs=2, ops=200, warmup=20))


def quiet() -> Progress:
    return Progress(live=False, stream=io.StringIO())


def caches_of(name: str, tmp_path: Path) -> dict[str, Any]:
    env = TargetEnv(tmp_path, {"memcached": "127.0.0.1:1", "redis": "redis://127.0.0.1:2/0"})
    (target,) = select_targets(load_targets(), [name])
    return target.django_settings(env)["CACHES"]["default"]


def test_every_target_of_the_issue_is_defined() -> None:
    assert [t.name for t in load_targets()] == ALL


@pytest.mark.parametrize("name", ["locmem", "filebased", "db"])
def test_django_backends_have_the_key_limit(name: str, tmp_path: Path) -> None:
    assert caches_of(name, tmp_path)["OPTIONS"] == KEY_LIMIT == {
        "MAX_ENTRIES": 1000, "CULL_FREQUENCY": 10
    }  # fmt: skip


def test_our_backends_and_their_l2(tmp_path: Path) -> None:
    sqlite = caches_of("sqlite", tmp_path)
    assert sqlite == {
        "BACKEND": "djcachebench.backends.sqlite.ShardedSQLiteCache",
        "LOCATION": str(tmp_path / "sqlite"),
        "OPTIONS": KEY_LIMIT,
    }
    tiered = caches_of("tiered", tmp_path)
    assert tiered["BACKEND"] == "djcachebench.backends.tiered.TieredCache"
    assert tiered["OPTIONS"]["L2"] == sqlite
    tiered_redis = caches_of("tiered-redis", tmp_path)
    assert tiered_redis["OPTIONS"]["L2"] == caches_of("redis", tmp_path)
    assert caches_of("redis", tmp_path)["LOCATION"] == "redis://127.0.0.1:2/0"
    assert caches_of("memcached", tmp_path)["LOCATION"] == "127.0.0.1:1"


def test_targets_without_a_key_limit_say_so() -> None:
    notes = {t.name: t.note for t in load_targets()}
    for name in ("diskcache", "memcached", "redis"):
        assert "no key-count limit" in notes[name]


def test_unknown_target_name_is_an_error() -> None:
    with pytest.raises(TargetError, match=r"unknown target\(s\) \['nope'\]; available: locmem"):
        select_targets(load_targets(), ["locmem", "nope"])


def test_missing_module_skips_with_the_reason() -> None:
    target = Target("ghost", "needs a module", caches=lambda env: {}, modules=("no_such_mod_xyz",))
    results = run_targets([target], SMALL, quiet())
    assert results.backends == []
    (skip,) = results.skipped
    assert (skip.name, skip.status) == ("ghost", "skipped")
    assert skip.reason.startswith("module not importable: no_such_mod_xyz")


def test_missing_backend_class_skips_with_the_reason() -> None:
    target = Target(
        "ghost", "no such class", caches=lambda env: {"BACKEND": "django.core.cache.Nope"}
    )
    (skip,) = run_targets([target], SMALL, quiet()).skipped
    assert (
        skip.reason
        == "module not importable: django.core.cache.Nope (django.core.cache has no 'Nope')"
    )


class RefusingCache(LocMemCache):
    """A cache that raises for values over 250 bytes, as pylibmc does over 1 MB."""

    def set(self, key: Any, value: Any, *args: Any, **kwargs: Any) -> None:
        if len(value) > 250:
            raise OverflowError("value too large")
        super().set(key, value, *args, **kwargs)

    def set_many(self, data: Any, *args: Any, **kwargs: Any) -> list[Any]:
        for key, value in data.items():
            self.set(key, value)
        return []


@pytest.mark.slow
def test_calls_that_raise_are_counted_as_errors_not_timed() -> None:
    refusing = Target(
        "refusing",
        "refuses values over 250 bytes",
        caches=lambda env: {"BACKEND": f"{__name__}.RefusingCache", "LOCATION": "r"},
    )
    results = run_targets([refusing], SMALL, quiet())
    assert not results.skipped
    (backend,) = results.backends
    sets = backend.actions["set"]
    assert sets.errors > 0 and sets.count > 0  # the small values went in
    assert backend.actions["get"].errors == 0
    assert backend.ops == sum(s.count for s in backend.actions.values())
    set_note, prefill_note = backend.notes
    assert set_note.startswith(f"set: {sets.errors:,} of {sets.count + sets.errors:,} calls raised")
    assert "OverflowError x" in set_note
    assert prefill_note.startswith("pre-fill: ")
    assert "values refused (OverflowError x" in prefill_note


class MissingRedis(RedisServer):
    binary_name = "redis-server-not-installed"


def test_server_that_cannot_start_gives_a_clear_skip_reason(monkeypatch: Any) -> None:
    monkeypatch.setitem(server_pool.SERVER_CLASSES, "redis", MissingRedis)
    targets = select_targets(load_targets(), ["redis"])
    results = run_targets(targets, SMALL, quiet())
    (skip,) = results.skipped
    assert skip.name == "redis" and skip.status == "skipped"
    assert skip.reason == (
        "server unavailable: redis-server-not-installed not found on PATH: "
        "apt-get install redis-server"
    )


@pytest.mark.slow
def test_a_failing_worker_fails_its_target_and_the_run_goes_on() -> None:
    # DatabaseCache without `createcachetable`: every worker's first call raises.
    broken = Target(
        "broken-db",
        "no cache table",
        caches=lambda env: {"BACKEND": "django.core.cache.backends.db.DatabaseCache",
                            "LOCATION": "missing_table"},
        settings=lambda env: {"DATABASES": {"default": {
            "ENGINE": "django.db.backends.sqlite3", "NAME": str(env.workdir / "db.sqlite3")}}},
    )  # fmt: skip
    locmem = select_targets(load_targets(), ["locmem"])
    results = run_targets([broken, *locmem], SMALL, quiet())
    (skip,) = results.skipped
    assert skip.status == "failed"
    assert skip.reason.startswith("worker 0 raised ")
    assert "no such table: missing_table" in skip.reason
    assert [b.name for b in results.backends] == ["locmem"]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_workers_run_under_spawn_and_forkserver(method: str) -> None:
    options = RunOptions(scenario=SMALL.scenario, start_method=method)
    results = run_targets(select_targets(load_targets(), ["filebased"]), options, quiet())
    (backend,) = results.backends
    assert backend.ops == 2 * 200
    assert sum(s.count for s in backend.actions.values()) == 400
    assert backend.wall_s > 0
    assert results.run["start_method"] == method


@pytest.mark.slow
@pytest.mark.servers
def test_servers_are_stopped_after_the_run(monkeypatch: Any) -> None:
    started: list[RedisServer] = []

    class RecordingRedis(RedisServer):
        def start(self) -> RedisServer:
            started.append(self)
            return super().start()  # type: ignore[return-value]

    monkeypatch.setitem(server_pool.SERVER_CLASSES, "redis", RecordingRedis)
    results = run_targets(select_targets(load_targets(), ["redis"]), SMALL, quiet())
    if results.skipped and "not found on PATH" in results.skipped[0].reason:
        pytest.skip(results.skipped[0].reason)
    assert [b.name for b in results.backends] == ["redis"]
    (server,) = started
    assert server.process is None  # stopped by PID in the runner's finally


@pytest.mark.servers
def test_each_target_run_starts_on_an_emptied_server() -> None:
    import redis

    from djcachebench.bench.runner import ServerPool, _flush_servers

    target = select_targets(load_targets(), ["redis"])[0]
    pool = ServerPool()
    try:
        assert pool.need(target) is None
        server = pool.servers["redis"]
        client = redis.Redis(host=server.host, port=server.port)
        client.mset({f"left-over-{i}": b"x" for i in range(1000)})
        _flush_servers(pool, target)
        assert client.dbsize() == 0
    finally:
        pool.stop()


@pytest.mark.slow
@pytest.mark.servers
def test_a_server_gone_before_its_target_fails_that_target_and_keeps_the_others(
    monkeypatch: Any,
) -> None:
    class GoneRedis(RedisServer):
        def flush(self, timeout: float = 5.0) -> None:
            raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setitem(server_pool.SERVER_CLASSES, "redis", GoneRedis)
    targets = select_targets(load_targets(), ["redis", "locmem"])
    results = run_targets(targets, SMALL, quiet())
    if results.skipped and "not found on PATH" in results.skipped[0].reason:
        pytest.skip(results.skipped[0].reason)
    (failed,) = results.skipped
    assert failed.name == "redis" and failed.status == "failed"
    assert failed.reason.startswith("its redis server did not answer before the run")
    assert [b.name for b in results.backends] == ["locmem"]


def test_a_target_that_cannot_hold_the_keys_is_skipped_with_the_reason() -> None:
    locmem = select_targets(load_targets(), ["locmem"])
    scenario = REFERENCE.with_overrides(procs=1, ops=10, warmup=0, keys=10_000_000)
    results = run_targets(locmem, RunOptions(scenario=scenario), quiet())
    (skip,) = results.skipped
    assert skip.status == "skipped" and "per-process dict" in skip.reason
    assert not results.backends
