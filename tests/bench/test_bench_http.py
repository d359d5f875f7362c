"""djcachebench http: wrk's report read right, and the whole command against a real
gunicorn per backend (real redis-server and memcached), short."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from djcachebench.bench.http.gunicorn import gunicorn_missing
from djcachebench.bench.http.probes import overlapped
from djcachebench.bench.http.wrk import WrkError, parse, run_wrk, wrk_missing

# Captured from real runs of `wrk --latency` against the demo site.
WRK_OK = """\
Running 1s test @ http://127.0.0.1:55213/light/page/
  2 threads and 16 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    64.08ms   35.54ms 193.30ms   74.81%
    Req/Sec   124.45     68.31   220.00     65.00%
  Latency Distribution
     50%   48.28ms
     75%   88.50ms
     90%  127.81ms
     99%  140.05ms
  249 requests in 1.00s, 9.15MB read
Requests/sec:    248.15
Transfer/sec:      9.12MB
"""
WRK_404 = """\
Running 1s test @ http://127.0.0.1:55213/nope/
  2 threads and 4 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    10.00ms    4.42ms  34.41ms   70.30%
    Req/Sec   191.10     55.74   280.00     71.43%
  Latency Distribution
     50%    9.99ms
     75%   12.68ms
     90%   15.07ms
     99%   21.75ms
  400 requests in 1.10s, 140.19KB read
  Non-2xx or 3xx responses: 400
Requests/sec:    363.39
Transfer/sec:    127.36KB
"""


def test_overlap_counts_arrivals_before_the_rounds_first_computation_ended(
        tmp_path: Path) -> None:
    (tmp_path / "k.arrivals").write_text("5.0\n10.0\n10.1\n10.2\n10.4\n")
    (tmp_path / "k.done").write_text("6.0\n10.3\n10.35\n")
    # Since 9.5: the earlier round's lines are not this round's; the first
    # computation of this round ended at 10.3, after three arrivals.
    assert overlapped(tmp_path, "k", since=9.5) == 3
    assert overlapped(tmp_path, "k", since=11.0) is None  # nothing computed since
    assert overlapped(tmp_path, "other", since=0.0) is None


def test_wrk_report_is_read_with_its_units() -> None:
    r = parse(WRK_OK)
    assert (r.requests, r.seconds, r.requests_per_s) == (249, 1.0, 248.15)
    assert (r.p50_ms, r.p75_ms, r.p90_ms, r.p99_ms, r.max_ms) == (48.28, 88.5, 127.81, 140.05,
                                                                  193.3)
    assert (r.non_2xx, r.socket_errors) == (0, 0)
    bad = parse(WRK_404)
    assert bad.non_2xx == 400 and bad.seconds == pytest.approx(1.1)
    micro = WRK_OK.replace("48.28ms", "950.00us").replace("1.00s,", "2.00m,")
    assert parse(micro).p50_ms == pytest.approx(0.95) and parse(micro).seconds == 120
    errors = WRK_OK.replace("Requests/sec",
                            "  Socket errors: connect 1, read 2, write 0, timeout 4\nRequests/sec")
    assert parse(errors).socket_errors == 7


def test_wrk_report_without_percentiles_is_an_error() -> None:
    with pytest.raises(WrkError):
        parse(WRK_OK.replace("  Latency Distribution\n", "").replace("     50%   48.28ms\n", ""))


def test_only_the_loopback_site_is_loaded() -> None:
    with pytest.raises(WrkError, match="only the loopback"):
        run_wrk("http://example.com/", 1, 1)


def _needs(reason: str | None) -> None:
    if reason:
        if os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}:
            pytest.fail(f"{reason} (CI=true: the set-up must install it)", pytrace=False)
        pytest.skip(reason)


@pytest.mark.slow
def test_http_command_runs_every_backend(tmp_path: Path) -> None:
    _needs(gunicorn_missing() or wrk_missing())
    out = tmp_path / "out"
    # gunicorn's default control socket (~/.gunicorn/) is not left in the user's
    # home (matplotlib's own font cache, ~/.cache/matplotlib, is its business).
    home = tmp_path / "home"
    home.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "djcachebench", "http", "--backends",
         "locmem,sqlite,tiered,redis,memcached,diskcache", "--duration", "5",
         "--connections", "8", "--stampede-clients", "40", "--out", str(out)],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
        env={**os.environ, "HOME": str(home)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not (home / ".gunicorn").exists()
    data = json.loads((out / "results.json").read_text())
    assert data["schema"] == "djcachebench-http" and not data["skipped"], data["skipped"]
    backends = data["backends"]
    assert sorted(backends) == ["diskcache", "locmem", "memcached", "redis", "sqlite", "tiered"]
    for name, backend in backends.items():
        run = backend["runs"][0]
        assert set(run["routes"]) == set(data["params"]["routes"]), name
        for route, figures in run["routes"].items():
            assert figures["requests"] > 0 and figures["non_2xx"] == 0, (name, route)
        fresh = run["freshness"]
        assert fresh["checked"] == 200 and fresh["errors"] == 0, (name, fresh)
        assert fresh["unexpected"] == 0, (name, fresh)
        # Shared caches never serve the list from before the POST; per-process
        # locmem does (each worker keeps its own copy): the check can tell.
        assert (fresh["stale"] > 0) if name == "locmem" else (fresh["stale"] == 0), (name, fresh)
        stampede = run["stampede"]
        assert stampede["protected"]["failures"] == stampede["unprotected"]["failures"] == 0
        assert stampede["cached"]["failures"] == 0 and stampede["cached"]["p99_ms"] > 0
        clients = stampede["protected"]["clients"]
        for mode in ("protected", "unprotected"):
            # Requests that reached the view while the first computation ran.
            assert 1 <= stampede[mode]["overlapped"] <= clients, (name, mode, stampede)
        if stampede["cached"]["computations"] == 0:
            # Nothing computed in the cached round (it counts only its own
            # computations): none ended in it. Per-process locmem does compute.
            assert stampede["cached"]["overlapped"] is None, (name, stampede)
        if name in ("sqlite", "tiered"):
            # The cached burst reads what the protected stampede computed, once.
            assert stampede["protected"]["computations"] == 1, (name, stampede)
            assert stampede["cached"]["computations"] == 0, (name, stampede)
    assert backends["sqlite"]["runs"][0]["stampede"]["unprotected"]["computations"] > 1
    report = (out / "report.md").read_text()
    assert "Cached / uncached" in report and "Stampede" in report
    assert "cached burst p99" in report
    for chart in ("throughput.png", "latency.png"):
        assert (out / chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
