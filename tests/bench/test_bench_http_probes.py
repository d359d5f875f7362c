"""The http command's probes against real loopback HTTP servers, and its failure handling.

The small servers here are real ``http.server`` instances on 127.0.0.1 that
answer the way a site with a given cache would (a page that is not the
product list; a stampede round that computes nothing), so each probe is
exercised over real sockets.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from djcachebench.bench.http import probes
from tests.bench.helpers import project_with_target

Answer = Callable[[BaseHTTPRequestHandler], tuple[int, bytes]]


def _serve(answer: Answer) -> Iterator[int]:
    class Handler(BaseHTTPRequestHandler):
        def _reply(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            status, body = answer(self)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _reply

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def constant_site() -> Iterator[int]:
    """A site whose cache answers 42 for the product list (a 200, not the list)."""
    yield from _serve(lambda handler: (200, b"42"))


def test_freshness_counts_a_page_that_is_not_the_product_list(constant_site: int) -> None:
    figures = probes.freshness(constant_site, rounds=2, reads=5)
    assert figures["checked"] == 0 and figures["stale"] == 0
    assert figures["unexpected"] == 10


def test_a_routes_warm_up_reaches_every_worker_at_once() -> None:
    """The warm-up before wrk sends its requests together, so that each sync
    worker gets one (sent one after another they may all go to one idle worker,
    and the others' first requests, imports and connections, fell inside wrk's
    run). On the code before, the routes did not warm up through this helper (a loop
    of single requests) and it took no path: the test fails there on its signature."""
    import time

    lock = threading.Lock()
    seen: list[str] = []
    at_once = [0, 0]  # in flight now, most in flight

    def answer(handler: BaseHTTPRequestHandler) -> tuple[int, bytes]:
        with lock:
            seen.append(handler.path)
            at_once[0] += 1
            at_once[1] = max(at_once[1], at_once[0])
        time.sleep(0.2)  # a cold worker's first request
        with lock:
            at_once[0] -= 1
        return 200, b"ok"

    for port in _serve(answer):
        probes.warm_threads(port, 8, "/light/page/")
    assert seen == ["/light/page/"] * 16
    assert at_once[1] >= 8


def test_a_stampede_round_counts_only_its_own_computations(tmp_path: Path) -> None:
    # The cached round reuses the protected round's key: the log already holds
    # that round's computations, and this round computes nothing.
    log = tmp_path / "r0-protected.log"
    log.write_text("111\n222\n333\n")
    computes = {"n": 0}

    def answer(handler: BaseHTTPRequestHandler) -> tuple[int, bytes]:
        if computes["n"]:
            computes["n"] -= 1
            with open(log, "a") as f:
                f.write("444\n")
        return 200, b'{"value": "cached"}'

    site = _serve(answer)
    port = next(site)
    try:
        cached = probes.stampede(port, "r0-protected", tmp_path, True, clients=10)
        assert cached["computations"] == 0
        computes["n"] = 1
        again = probes.stampede(port, "r0-protected", tmp_path, True, clients=10)
        assert again["computations"] == 1
    finally:
        site.close()


def test_client_percentiles_are_the_projects_nearest_rank() -> None:
    # 100 clients: p99 is the 99th latency, not the maximum; p50 the 50th.
    latencies = [float(i) for i in range(1, 101)]
    assert probes.client_percentiles(latencies) == (50.0, 99.0)
    assert probes.client_percentiles([]) == (0.0, 0.0)


def test_http_report_medians_are_observed_values() -> None:
    from djcachebench.bench.http.report import median_route

    runs = [{"routes": {"light": {"requests_per_s": v}}} for v in (10.0, 20.0, 30.0, 40.0)]
    assert median_route({"runs": runs}, "light", "requests_per_s") == 20.0


CONSTANT_TARGET = '''
from djcachebench.bench.targets import Target
TARGET = Target(name="constant", description="every get answers 42", rank=200,
                caches=lambda env: {"BACKEND": "tests.bench.test_bench_http_probes.ConstantCache",
                                    "LOCATION": "c"})
'''


class ConstantCache:
    """Imported by the demo site's gunicorn workers: a LocMemCache whose get answers 42."""

    def __new__(cls, *args: object, **kwargs: object) -> object:
        from django.core.cache.backends.locmem import LocMemCache

        class _Constant(LocMemCache):
            def get(self, key: object, default: object = None, version: object = None) -> object:
                return 42

        return _Constant(*args, **kwargs)


@pytest.mark.slow
def test_a_cache_answering_the_wrong_page_fails_its_target_not_the_run(tmp_path: Path) -> None:
    from djcachebench.bench.http.gunicorn import gunicorn_missing
    from djcachebench.bench.http.wrk import wrk_missing

    if gunicorn_missing() or wrk_missing():
        pytest.skip(gunicorn_missing() or wrk_missing() or "")
    env = project_with_target(tmp_path, "constant", CONSTANT_TARGET)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "djcachebench", "http", "--backends", "locmem,constant",
         "--routes", "light,light-lowlevel", "--duration", "1", "--connections", "4",
         "--workers", "2", "--stampede-clients", "6", "--compute-seconds", "0.05",
         "--out", str(out), "--no-plot"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert "Traceback" not in proc.stdout, proc.stdout
    data = json.loads((out / "results.json").read_text())
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "locmem" in data["backends"] and "constant" in data["backends"]
    fresh = data["backends"]["constant"]["runs"][0]["freshness"]
    assert fresh["unexpected"] > 0 and fresh["checked"] == 0
    assert "unexpected" in data["failed"]["constant"]
    report = (out / "report.md").read_text()
    assert "constant" in report and "FAILED" in report


def test_a_run_with_error_responses_is_not_a_sites_figures() -> None:
    """A cache that breaks the site (non-2xx responses, every freshness read an
    error, or every stampede request failed) is not reported with its requests/s
    and ratios, exit 0. ``site_faults`` names what makes the `http` command fail
    such a target."""
    from djcachebench.bench.http.command import site_faults

    healthy = {"routes": {"light": {"non_2xx": 0, "socket_errors": 3}},
               "freshness": {"checked": 200, "stale": 0, "errors": 0},
               "stampede": {"protected": {"clients": 100, "failures": 0}}}
    assert site_faults(healthy) is None  # wrk's timeouts alone are a queue, not a fault
    broken = {"routes": {"light": {"non_2xx": 1727}, "heavy": {"non_2xx": 0}},
              "freshness": {"checked": 200, "stale": 0, "errors": 200},
              "stampede": {"protected": {"clients": 100, "failures": 100},
                           "unprotected": {"clients": 100, "failures": 0}}}
    fault = site_faults(broken)
    assert fault is not None
    assert "1,727 error responses on light" in fault and "heavy" not in fault
    assert "200 of 200 freshness reads failed" in fault
    assert "100 of 100 protected stampede requests failed" in fault
    assert "unprotected" not in fault
