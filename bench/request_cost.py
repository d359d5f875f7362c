"""What one request of the demo site costs a worker, per cache: ``djcachebench http``'s
site served in-process (its WSGI application called directly: no gunicorn, no wrk,
no socket), one child process per backend target, the targets taking turns.

Usage: .venv/bin/python bench/request_cost.py [--backends locmem,tiered]
       [--route light-page] [--requests 2000] [--rounds 6]

Why: under gunicorn and wrk on two cores, a request's CPU is shared with the
server, the client and the other workers, and two caches whose own parts differ
by a few microseconds serve within the run-to-run noise of each other
(docs/benchmarks.md, "End to end"). Here each target's child serves
``--requests`` requests of ``--route`` in a block, timing the CPU of each
(``thread_time``: what other tenants of the machine take is not counted), whole
request included (Django's handler, middleware, the cache's gets, the response
body read, ``close()`` and the request-finished signal that closes the caches).
The targets alternate A B, B A, ... (``--rounds``), so a drift of the machine
lands on all of them; the script prints each block's median and, per round,
every target's median divided by the first target's.

Every response must be 200 with the route's body; the first requests of each
child fill the cache (a hit is what ``light-page`` then measures).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from djcachebench.bench.http.command import ROUTES, site_config


def _environ(path: str) -> dict[str, Any]:
    return {
        "REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": "", "SCRIPT_NAME": "",
        "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8000", "HTTP_HOST": "127.0.0.1",
        "SERVER_PROTOCOL": "HTTP/1.1", "REMOTE_ADDR": "127.0.0.1",
        "wsgi.version": (1, 0), "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(b""),
        "wsgi.errors": sys.stderr, "wsgi.multithread": False, "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }


def _serve(config: str, path: str, conn: Connection) -> None:
    """A child: the site under one cache; serves blocks of requests on demand."""
    os.environ["DJCB_HTTP_CONFIG"] = config
    os.environ["DJANGO_SETTINGS_MODULE"] = "djcachebench.bench.http.site_settings"
    from djcachebench.bench.http.wsgi import application

    statuses: list[str] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        statuses.append(status)

    def one() -> bytes:
        response = application(_environ(path), start_response)
        try:
            return b"".join(response)
        finally:
            response.close()  # Django's request_finished: close_caches() runs here

    first = one()
    for _ in range(20):  # fill the cache; open connections
        if one() != first:
            conn.send(("error", "the route's body changed between two requests"))
            return
    conn.send(("ready", len(first)))
    while (count := conn.recv()) is not None:
        times: list[int] = []
        statuses.clear()
        for _ in range(count):
            started = time.thread_time_ns()
            body = one()
            times.append(time.thread_time_ns() - started)
            if len(body) != len(first):
                conn.send(("error", f"a response of {len(body)} bytes, not {len(first)}"))
                return
        bad = [s for s in statuses if not s.startswith("200")]
        conn.send(("error", f"responses {sorted(set(bad))}") if bad else ("ok", times))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="locmem,tiered")
    parser.add_argument("--route", default="light-page", choices=sorted(ROUTES))
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)
    if args.requests < 1 or args.rounds < 1:
        parser.error("--requests and --rounds must be at least 1")

    from djcachebench.bench.http.seed import seed
    from djcachebench.bench.runner import ServerPool
    from djcachebench.bench.summary import run_order
    from djcachebench.bench.targets import load_targets, select_targets

    targets = select_targets(load_targets(), args.backends.split(","))
    workdir = Path(tempfile.mkdtemp(prefix="djcb-request-cost-"))
    pool = ServerPool()
    context = multiprocessing.get_context("spawn")
    children: dict[str, tuple[Any, Connection]] = {}
    try:
        base_db = workdir / "base.sqlite3"
        seed(base_db)
        for target in targets:
            why = pool.need(target)
            if why:
                print(f"{target.name}: skipped ({why})")
                continue
            config, _ = site_config(target, pool, workdir, base_db, target.name, 0.2)
            ours, theirs = context.Pipe()
            child = context.Process(target=_serve, args=(str(config), ROUTES[args.route], theirs))
            child.start()
            kind, what = ours.recv()
            if kind != "ready":
                print(f"{target.name}: FAILED ({what})")
                return 1
            children[target.name] = (child, ours)
        names = list(children)
        if not names:
            return 1
        print(f"route {args.route}, {args.requests} requests a block, CPU per request "
              f"(median), ratios to {names[0]}")
        ratios: dict[str, list[float]] = {name: [] for name in names[1:]}
        for index in range(args.rounds):
            medians: dict[str, float] = {}
            for name in run_order(names, index):
                conn = children[name][1]
                conn.send(args.requests)
                kind, what = conn.recv()
                if kind != "ok":
                    print(f"{name}: FAILED ({what})")
                    return 1
                medians[name] = statistics.median(what) / 1000
            line = ", ".join(f"{name} {medians[name]:.1f} µs" for name in names)
            for name in names[1:]:
                ratios[name].append(medians[name] / medians[names[0]])
            shares = ", ".join(f"{name} {ratios[name][-1]:.3f}" for name in names[1:])
            print(f"round {index + 1}: {line}; {shares}")
        for name in names[1:]:
            print(f"{name} / {names[0]}: median {statistics.median(ratios[name]):.3f} "
                  f"(rounds {min(ratios[name]):.3f}-{max(ratios[name]):.3f})")
        return 0
    finally:
        for child, conn in children.values():
            with contextlib.suppress(OSError):  # a child that failed has gone
                conn.send(None)
            child.join(10)
            if child.is_alive():
                child.kill()
        pool.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
