"""``djcachebench http --l2-outage`` and ``--breaker``: windows of a hung server, against a
real redis-server, wrk and gunicorn; what the windows add up to; what is refused.

No timing is asserted: only that the windows alternate, are recorded and
reported, and that the server answers again afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from djcachebench.bench.breaker_variants import breaker_modes, breaker_variants
from djcachebench.bench.http.gunicorn import gunicorn_missing
from djcachebench.bench.http.outage import cycle_error, run_windows, summarize
from djcachebench.bench.http.wrk import WrkError, wrk_missing
from djcachebench.bench.servers import RedisServer, ServerNotInstalled
from djcachebench.bench.targets import TargetEnv, load_targets, select_targets

CI = os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def _needs(reason: str | None) -> None:
    if reason:
        if CI:
            pytest.fail(f"{reason} (CI=true: the set-up must install it)", pytrace=False)
        pytest.skip(reason)


def _state(pid: int) -> str:
    """The process's state letter from /proc: ``T`` while it is stopped."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own: stopping the session's would stall other tests."""
    server = RedisServer()
    try:
        server.start()
    except ServerNotInstalled as exc:
        _needs(str(exc))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def plain_site() -> Iterator[str]:
    """A real loopback HTTP server answering 200 (what wrk loads between the signals)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def _window(kind: str, requests: int, non_2xx: int = 0, p50: float = 1.0,
            p99: float = 2.0) -> dict[str, object]:
    return {"kind": kind, "requests": requests, "seconds": 2.0, "requests_per_s": requests / 2,
            "p50_ms": p50, "p75_ms": p50, "p90_ms": p99, "p99_ms": p99, "max_ms": p99,
            "non_2xx": non_2xx, "socket_errors": 0}


def test_windows_add_up_by_kind_and_percentiles_are_never_averaged() -> None:
    windows = [_window("outage", 10, non_2xx=4, p50=5.0, p99=900.0),
               _window("healthy", 400, p50=2.0, p99=9.0),
               _window("outage", 0, p50=0.0, p99=0.0),  # nothing served: no latency
               _window("healthy", 600, p50=3.0, p99=7.0)]
    outage = summarize(windows, "outage")
    assert outage is not None
    assert (outage["windows"], outage["requests"], outage["seconds"]) == (2, 10, 4.0)
    assert outage["requests_per_s"] == 2.5 and outage["ok_per_s"] == 1.5
    assert (outage["p50_ms"], outage["p99_ms"]) == (5.0, 900.0)
    healthy = summarize(windows, "healthy")
    assert healthy is not None and healthy["requests_per_s"] == 250.0
    # The nearest-rank median of two windows' p50s is the lower; p99 the worst window's.
    assert (healthy["p50_ms"], healthy["p99_ms"]) == (2.0, 9.0)
    assert summarize([_window("outage", 0)], "outage")["p50_ms"] is None  # type: ignore[index]
    assert summarize(windows[:1], "healthy") is None


def test_the_duration_must_hold_whole_outage_cycles() -> None:
    assert cycle_error(8, 2) is None and cycle_error(2, 1) is None
    assert "multiple of 4" in (cycle_error(10, 2) or "")
    assert "multiple of 4" in (cycle_error(2, 2) or "")


def test_breaker_variants_of_a_tiered_target_and_the_others_as_they_are(tmp_path: Path) -> None:
    assert breaker_modes("on, off,on") == ["on", "off"]
    targets = breaker_variants(select_targets(load_targets(), ["redis", "tiered-redis", "tiered"]),
                               ["on", "off"])
    by_name = {t.name: t for t in targets}
    assert sorted(by_name) == ["redis", "tiered-redis[breaker]", "tiered-redis[no-breaker]",
                               "tiered[breaker]", "tiered[no-breaker]"]
    env = TargetEnv(tmp_path, {"redis": "redis://127.0.0.1:2/0"})
    on = by_name["tiered-redis[breaker]"].caches(env)["OPTIONS"]
    off = by_name["tiered-redis[no-breaker]"].caches(env)["OPTIONS"]
    assert (on["BREAKER_THRESHOLD"], on["SERVE_STALE"]) == (3, 30)
    assert (off["BREAKER_THRESHOLD"], off["SERVE_STALE"]) == (None, None)
    for options in (on, off):  # a hung redis must not hold a call forever
        assert options["L2"]["OPTIONS"]["SOCKET_TIMEOUT"] == 0.5
    (redis,) = select_targets(load_targets(), ["redis"])
    assert by_name["redis"].caches(env) == redis.caches(env)  # no breaker to switch
    # ShardedSQLiteCache under TieredCache has no socket to bound: skipped with the reason.
    assert "socket timeout" in by_name["tiered[breaker]"].unsupported


@pytest.mark.servers
def test_windows_alternate_and_the_server_is_continued_after_them(
        own_redis: RedisServer, plain_site: str) -> None:
    _needs(wrk_missing())
    pid = own_redis.pid
    assert pid is not None
    windows = run_windows(plain_site, 2, 1, 2, [own_redis])
    assert [w["kind"] for w in windows] == ["outage", "healthy"]
    assert all(w["requests"] > 0 for w in windows)  # the site itself never hung
    assert _state(pid) != "T" and own_redis.ping()


@pytest.mark.servers
def test_the_server_is_continued_when_a_window_fails(own_redis: RedisServer) -> None:
    pid = own_redis.pid
    assert pid is not None
    with pytest.raises(WrkError):  # wrk refuses a non-loopback URL, after the stop
        run_windows("http://example.com/", 2, 1, 2, [own_redis])
    assert _state(pid) != "T" and own_redis.ping()


def _http(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "djcachebench", "http", *args],
                          capture_output=True, text=True, timeout=900, cwd=cwd)  # fmt: skip


@pytest.mark.parametrize(("args", "says"), [
    (["--l2-outage", "-2"], "argument --l2-outage: must be a finite number of seconds > 0"),
    (["--l2-outage", "0"], "argument --l2-outage: must be a finite number of seconds > 0"),
    (["--l2-outage", "two"], "argument --l2-outage: not a number of seconds: 'two'"),
    (["--l2-outage", "1.5"], "argument --l2-outage: must be a whole number of seconds"),
    (["--breaker", "maybe"], "argument --breaker: 'maybe': allowed: on, off"),
])
def test_bad_outage_options_are_usage_errors(args: list[str], says: str, tmp_path: Path) -> None:
    proc = _http("--backends", "redis", *args, cwd=tmp_path)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert "usage: djcachebench http" in proc.stderr


def test_outage_of_a_target_without_a_server_is_refused_before_anything_starts(
        tmp_path: Path) -> None:
    _needs(gunicorn_missing())
    out = tmp_path / "out"
    proc = _http("--backends", "redis,sqlite,locmem", "--l2-outage", "1", "--duration", "2",
                 "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--l2-outage" in proc.stderr and "locmem, sqlite have none" in proc.stderr
    assert not out.exists()  # refused before the run made anything
    proc = _http("--backends", "redis", "--l2-outage", "2", "--duration", "6", cwd=tmp_path)
    assert proc.returncode == 2 and "--duration must be a multiple of 4" in proc.stderr


@pytest.mark.slow
@pytest.mark.servers
def test_outage_run_with_and_without_the_breaker_end_to_end(tmp_path: Path) -> None:
    """Both variants share one redis: the second could not be flushed, nor the
    freshness reads answered, if the first had left it stopped."""
    _needs(gunicorn_missing() or wrk_missing())
    out = tmp_path / "out"
    proc = _http("--backends", "tiered-redis", "--breaker", "on,off", "--l2-outage", "1",
                 "--duration", "2", "--routes", "light-page", "--connections", "4",
                 "--workers", "2", "--stampede-clients", "4", "--no-plot", "--out", str(out),
                 cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((out / "results.json").read_text())
    assert data["params"]["l2_outage"] == 1 and data["params"]["breaker"] == ["on", "off"]
    assert sorted(data["backends"]) == ["tiered-redis[breaker]", "tiered-redis[no-breaker]"]
    for name, backend in data["backends"].items():
        (run,) = backend["runs"]
        windows = run["outage"]["light-page"]["windows"]
        assert [w["kind"] for w in windows] == ["outage", "healthy"], name
        assert run["freshness"]["errors"] == 0, name
    report = (out / "report.md").read_text()
    assert "## L2 outage: the server stopped 1 s, continued 1 s" in report
    assert "| tiered-redis[no-breaker] | light-page | healthy (1 x 1 s) |" in report
