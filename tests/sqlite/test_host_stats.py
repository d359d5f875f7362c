"""Host-wide statistics with real processes: what one process counts, another reports.

One process serves traffic on a ShardedSQLiteCache and a TieredCache over it;
a separate process runs ``manage.py cachestats --format prometheus`` and sees
its hits. Counts reach the shared files within a flush interval, so every
check here polls (up to a generous bound) instead of timing anything.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from djcachebench.hoststats.file import read_totals

from . import stats_workers
from .helpers import SPAWN, join_all, start

POLL_FOR = 90.0  # seconds: generous, for a small shared machine


def cachestats(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``manage.py cachestats`` in a process of its own (``python -m django``)."""
    return subprocess.run([sys.executable, "-m", "django", "cachestats", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def prometheus_samples(text: str) -> dict[tuple[str, str], float]:
    """``(sample name, alias) -> value``, through prometheus_client's own parser."""
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, sample.labels["alias"])] = sample.value
            assert set(sample.labels) == {"alias", "backend"}
    return out


@pytest.fixture
def site(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    location = tmp_path / "cache"
    return location, stats_workers.write_site(tmp_path, location)


def test_cachestats_from_another_process_shows_the_hits_of_a_serving_process(
        site: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    _, env = site
    sqlite_hits, tiered_hits = SPAWN.Value("q", 0), SPAWN.Value("q", 0)
    stop = SPAWN.Event()
    server = start(stats_workers.serve, str(tmp_path), sqlite_hits, tiered_hits, stop)
    try:
        deadline = time.monotonic() + POLL_FOR
        while tiered_hits.value < 1000 and time.monotonic() < deadline:
            time.sleep(0.05)
        served = (sqlite_hits.value, tiered_hits.value)  # done before the first look
        assert served[1] >= 1000, "the server made no traffic"
        seen: list[tuple[float, float]] = []
        while time.monotonic() < deadline:
            result = cachestats(env, "--format", "prometheus")
            assert result.returncode == 0, result.stderr
            samples = prometheus_samples(result.stdout)
            seen.append((samples[("djcachebench_hits_total", "default")],
                         samples[("djcachebench_hits_total", "tiered")]))
            if seen[-1][0] >= served[0] and seen[-1][1] >= served[1]:
                break
            time.sleep(0.2)
        assert seen[-1][0] >= served[0] and seen[-1][1] >= served[1], (served, seen)
        # Counters: never lower than an earlier reading.
        assert [s[0] for s in seen] == sorted(s[0] for s in seen)
        assert [s[1] for s in seen] == sorted(s[1] for s in seen)
        assert ("djcachebench_l1_hits_total", "tiered") in samples
        assert ("djcachebench_entries", "default") in samples
        assert not any(alias == "local" for _, alias in samples)  # no host-wide stats
        (tmp_path / "sample.prom").write_text(result.stdout)  # for a reader of the run
    finally:
        stop.set()
        assert join_all([server], 60) == [0]


def test_a_process_that_exits_has_every_count_in_the_file(
        site: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    location, env = site
    assert join_all([start(stats_workers.exact, str(tmp_path), 300)]) == [0]
    sqlite = read_totals(str(location / "stats.mmap"))
    tiered = read_totals(str(location / "generations.mmap.stats"))
    assert sqlite is not None and tiered is not None
    keys = stats_workers.KEYS
    assert sqlite.counters["hits"] == 300  # the tiered gets were L1 hits: none here
    assert sqlite.counters["sets"] == 2 * keys
    assert tiered.counters["l1_hits"] + tiered.counters["l2_hits"] == 300
    assert tiered.counters["sets"] == keys
    assert sqlite.processes == tiered.processes == 0  # its rows were folded at exit
    text = cachestats(env, "tiered", "local")
    assert text.returncode == 0, text.stderr
    assert "local (django.core.cache.backends.locmem.LocMemCache): no host-wide stats" in (
        text.stdout)
    assert "l1_hits" in text.stdout


def test_a_killed_process_keeps_what_it_flushed_and_sums_never_go_down(
        site: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    location, env = site
    path = str(location / "stats.mmap")
    sqlite_hits, tiered_hits = SPAWN.Value("q", 0), SPAWN.Value("q", 0)
    stop = SPAWN.Event()
    server = start(stats_workers.serve, str(tmp_path), sqlite_hits, tiered_hits, stop)
    readings: list[int] = []
    try:
        deadline = time.monotonic() + POLL_FOR
        while sqlite_hits.value < 1000 and time.monotonic() < deadline:
            time.sleep(0.05)
        flushed_before = sqlite_hits.value
        while time.monotonic() < deadline:
            totals = read_totals(path)
            readings.append(0 if totals is None else totals.counters["hits"])
            if readings[-1] >= flushed_before:
                break
            time.sleep(0.05)
        assert readings[-1] >= flushed_before, readings
    finally:
        os.kill(server.pid, signal.SIGKILL)
        assert join_all([server], 60) == [-signal.SIGKILL]
    did = sqlite_hits.value + stats_workers.KEYS  # at most one round it had not published
    after_kill = read_totals(path)
    assert after_kill is not None
    assert flushed_before <= after_kill.counters["hits"] <= did
    assert after_kill.processes == 1  # its row is still there, not yet folded
    # Another process claims a row: the dead one's is folded into the retired
    # totals, and the sum stays what it was.
    result = cachestats(env, "default", "--format", "json")
    assert result.returncode == 0, result.stderr
    folded = read_totals(path)
    assert folded is not None and folded.processes == 0
    assert folded.counters["hits"] == after_kill.counters["hits"]
    readings += [after_kill.counters["hits"], folded.counters["hits"]]
    assert readings == sorted(readings)


def test_a_forked_child_counts_only_what_it_does(
        site: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    location, _ = site
    assert join_all([start(stats_workers.forks, str(tmp_path), 40, 7)]) == [0]
    totals = read_totals(str(location / "stats.mmap"))
    assert totals is not None and totals.counters["hits"] == 47
