"""djcachebench stampede: the real command, real worker processes, a real redis-server.

8 callers (4 processes x 2 threads) ask for one absent key whose computation
takes 0.2 s. ShardedSQLiteCache and TieredCache compute it once; with their
lease off, and with django-redis, more callers compute it (all 8 should, but a
caller woken late by a busy scheduler may find the value stored: > 1, not == 8).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from djcachebench.bench.servers import find_binary
from djcachebench.bench.stampede.command import variants
from djcachebench.bench.stampede.data import StampedeResults
from djcachebench.bench.stampede.rounds import Plan, RoundFailed, run_round
from djcachebench.bench.targets import load_targets, select_targets

CI = os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def test_our_backends_run_protected_and_unprotected_the_others_once() -> None:
    targets = select_targets(load_targets(), ["locmem", "sqlite", "tiered", "redis"])
    names = [(v.name, v.protected) for v in variants(targets)]
    assert names == [("locmem", False), ("redis", False), ("sqlite", True),
                     ("sqlite (unprotected)", False), ("tiered", True),
                     ("tiered (unprotected)", False)]


@pytest.mark.slow
def test_a_worker_that_raises_fails_the_round_with_its_reason(tmp_path: Path) -> None:
    settings = {"CACHES": {"default": {
        "BACKEND": "djcachebench.backends.sqlite.ShardedSQLiteCache",
        "LOCATION": str(tmp_path / "cache"), "OPTIONS": {"SHARDS": 0}}}}
    plan = Plan(procs=2, threads=2, compute_s=0.2, timeout_s=60)
    with pytest.raises(RoundFailed, match=r"ImproperlyConfigured.*SHARDS"):
        run_round(plan, settings, (), "key", tmp_path)


@pytest.mark.slow
@pytest.mark.servers
def test_stampede_command_counts_computations_per_backend(tmp_path: Path) -> None:
    if find_binary("redis-server") is None:
        if CI:
            pytest.fail("redis-server not found (CI=true: the set-up must install it)",
                        pytrace=False)
        pytest.skip("redis-server not found on PATH: apt-get install redis-server")
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "djcachebench", "stampede", "--procs", "4", "--threads", "2",
         "--compute", "0.2", "--repeat", "1", "--backends", "sqlite,tiered,redis",
         "--out", str(out)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr

    data = StampedeResults.load(out / "results.json")
    assert data.to_dict() == json.loads((out / "results.json").read_text())
    assert not data.skipped, data.skipped
    assert data.params["callers"] == 8 and data.machine["usable_cpus"] >= 1
    rows = {row.name: row for row in data.rows}
    assert sorted(rows) == ["redis", "sqlite", "sqlite (unprotected)", "tiered",
                            "tiered (unprotected)"]
    computations = {name: row.runs[0].computations for name, row in rows.items()}
    assert computations["sqlite"] == computations["tiered"] == 1, computations
    for name in ("sqlite (unprotected)", "tiered (unprotected)", "redis"):
        assert computations[name] > 1, computations
    for name, row in rows.items():
        (one,) = row.runs
        assert one.callers == 8 and len(one.latencies_s) == 8, name
        assert one.wrong == 0 and not one.errors, (name, one)
        assert one.cached_computations == 0, name
        # Nobody gets a value sooner than it takes to compute one.
        assert one.latencies_s[0] >= 0.2 and one.wall_s >= one.max_s, name
    assert rows["sqlite"].protected and rows["sqlite"].lease_s == 10.0
    unprotected = rows["sqlite (unprotected)"]
    assert not unprotected.protected and unprotected.lease_s is None
    assert unprotected.settings["CACHES"]["default"]["OPTIONS"]["STAMPEDE_LEASE"] is None

    report = (out / "report.md").read_text()
    assert "| backend | get_or_set | computations |" in report
    assert "| sqlite | own (lease) | 1 |" in report and "| tiered | own (lease) | 1 |" in report
    assert (out / "stampede.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
