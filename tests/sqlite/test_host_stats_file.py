"""The host-wide counters file under damage, and the command's and collector's faces.

A counters file cut, overwritten, deleted, replaced by a directory or made
writable by others never fails a cache call: the counts go on in the
process, the report says "unavailable", and a file that can be had again
is used again.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.hoststats import publish
from djcachebench.hoststats.file import StatsFileError, read_totals

from .helpers import caches_entry

pytestmark = pytest.mark.django_db(databases=[])


def traffic(cache: ShardedSQLiteCache, n: int = 20) -> None:
    """``n`` sets and ``n`` hits, each answered as it should be."""
    for i in range(n):
        cache.set(f"k{i}", i)
        assert cache.get(f"k{i}") == i


def stats_path(cache: ShardedSQLiteCache) -> Path:
    return Path(cache.location) / "stats.mmap"


@pytest.fixture
def cache(make_cache: Callable[..., ShardedSQLiteCache]) -> ShardedSQLiteCache:
    made = make_cache({"SHARDS": 2})
    traffic(made)
    publish.flush_all()
    return made


def test_a_file_cut_to_nothing_gets_its_header_again(cache: ShardedSQLiteCache) -> None:
    os.truncate(stats_path(cache), 0)
    assert read_totals(str(stats_path(cache))) is None  # nothing to read: not an error
    traffic(cache)
    publish.flush_all()
    totals = read_totals(str(stats_path(cache)))
    # What the cut took is lost; what came after it is there.
    assert totals is not None and totals.counters["hits"] >= 20


def test_a_file_cut_short_gets_its_length_back(cache: ShardedSQLiteCache) -> None:
    path = stats_path(cache)
    os.truncate(path, 2000)  # the header and names stay, the rows go
    traffic(cache)
    publish.flush_all()
    assert path.stat().st_size > 2000
    totals = read_totals(str(path))
    assert totals is not None and totals.counters["hits"] >= 20


def test_an_overwritten_file_is_unavailable_and_never_fails_a_call(
        cache: ShardedSQLiteCache, caplog: pytest.LogCaptureFixture) -> None:
    path = stats_path(cache)
    with open(path, "r+b") as f:
        f.write(b"not a counters file" * 10)
    with caplog.at_level(logging.WARNING, "djcachebench.stats"):
        traffic(cache)
        publish.flush_all()
        report = cache.host_stats()
    assert "host-wide stats unavailable" in caplog.text
    assert report["counters"] is None and "header" in report["problem"]
    assert report["entries"] == 20
    with pytest.raises(StatsFileError):
        read_totals(str(path))
    # Deleted, it is made again at the next flush, with this process's counts.
    path.unlink()
    traffic(cache)
    publish.flush_all()
    totals = read_totals(str(path))
    assert totals is not None and totals.counters["hits"] == 60


def test_a_deleted_file_is_made_again_with_this_processs_counts(
        cache: ShardedSQLiteCache) -> None:
    stats_path(cache).unlink()
    traffic(cache)
    publish.flush_all()
    totals = read_totals(str(stats_path(cache)))
    assert totals is not None and totals.counters["hits"] == 40


@pytest.mark.parametrize("damage", ["directory", "group-writable"])
def test_a_file_that_cannot_be_trusted_is_unavailable(cache: ShardedSQLiteCache,
                                                      damage: str) -> None:
    path = stats_path(cache)
    if damage == "directory":
        path.unlink()
        path.mkdir()
    else:
        path.chmod(0o666)
    traffic(cache)
    publish.flush_all()
    report = cache.host_stats()
    assert report["counters"] is None and report["problem"]
    traffic(cache)  # still a working cache


def test_the_file_is_private(cache: ShardedSQLiteCache) -> None:
    assert stats_path(cache).stat().st_mode & 0o777 == 0o600


# -- the command and the collector ------------------------------------------------


def site_caches(location: Path) -> dict:
    return {
        "default": caches_entry(location, {"SHARDS": 2}),
        "tiered": {"BACKEND": "djcachebench.backends.tiered.TieredCache",
                   "OPTIONS": {"L2": "default"}},
        "local": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    }


def run(*args: str) -> str:
    from io import StringIO

    out = StringIO()
    call_command("cachestats", *args, stdout=out)
    return out.getvalue()


def test_the_command_refuses_an_unknown_alias_or_format_with_status_2(tmp_path: Path) -> None:
    with override_settings(CACHES=site_caches(tmp_path / "c")):
        with pytest.raises(CommandError, match="no cache alias 'nope'") as alias:
            run("nope")
        with pytest.raises(CommandError, match="allowed: text, json, prometheus") as fmt:
            run("--format", "xml")
    assert alias.value.returncode == fmt.value.returncode == 2


def test_the_collector_yields_what_the_command_prints(tmp_path: Path) -> None:
    from django.core.cache import caches

    from djcachebench.metrics import register

    with override_settings(CACHES=site_caches(tmp_path / "c")):
        caches["tiered"].set("a", 1)
        assert caches["tiered"].get("a") == 1
        registry = CollectorRegistry()
        register(registry=registry)
        scraped = generate_latest(registry).decode()
        printed = run("--format", "prometheus")
    families = {f.name: f for f in text_string_to_metric_families(scraped)}
    assert families == {f.name: f for f in text_string_to_metric_families(printed)}
    hits = {s.labels["alias"]: s.value for s in families["djcachebench_hits"].samples}
    assert hits["tiered"] >= 1 and "local" not in hits
    assert families["djcachebench_entries"].type == "gauge"
    assert families["djcachebench_sets"].type == "counter"


def test_the_collector_names_the_extra_when_prometheus_client_is_missing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from djcachebench.metrics import DjcachebenchCollector

    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.setitem(sys.modules, "prometheus_client.core", None)
    with pytest.raises(ImportError, match=r"djcachebench\[prometheus\]"):
        DjcachebenchCollector()
