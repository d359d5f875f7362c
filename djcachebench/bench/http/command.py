"""``djcachebench http``: the demo site per backend under gunicorn, loaded with wrk.

For every backend target (the same definitions as ``bench``, with the same
loopback redis/memcached servers) the site is started under gunicorn with that
cache as ``default``, every route is loaded with wrk for ``--duration`` seconds,
the freshness check counts stale pages after invalidating writes, and the
stampede measurement sends ``--stampede-clients`` simultaneous requests for one
uncomputed key, with ``get_or_set``'s protection and with Django's own
(unprotected) ``BaseCache.get_or_set``. ``--repeat N`` runs all targets N times,
interleaved in a balanced order (A B C, C B A, ...), and keeps every run.

``--l2-outage SECONDS`` hangs each target's server (SIGSTOP) and continues it
in alternate windows while wrk loads every route (``outage.py``), and reports
requests/s in the outage windows and the healthy ones; ``--breaker on,off``
runs every TieredCache target with its circuit breaker and without
(``bench/breaker_variants.py``), so that one run compares both.

Sync workers serve one request each at a time, so a stampede of 100 clients
against 4 sync workers would be 4 requests at once: the stampede runs on a
second gunicorn with ``gthread`` workers whose threads together can hold every
client at once.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import shutil
import signal
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from djcachebench.bench.argtypes import (
    connection_count,
    names,
    non_negative_seconds,
    positive_int,
    prepare_out_dir,
    process_count,
    thread_count,
    whole_seconds,
)
from djcachebench.bench.breaker_variants import breaker_modes, breaker_variants
from djcachebench.bench.cli import default_out_dir
from djcachebench.bench.http import probes
from djcachebench.bench.http.gunicorn import GunicornSite, gunicorn_missing
from djcachebench.bench.http.outage import KINDS, cycle_error, run_windows, summarize
from djcachebench.bench.http.outputs import write_outputs
from djcachebench.bench.http.seed import seed
from djcachebench.bench.http.wrk import WrkError, run_wrk, wrk_missing
from djcachebench.bench.results import machine_info, usable_cpus
from djcachebench.bench.runner import ServerPool
from djcachebench.bench.servers import LOOPBACK, ServerUnavailable
from djcachebench.bench.signals import deferred_signals, terminate_as_interrupt
from djcachebench.bench.summary import run_order
from djcachebench.bench.targets import (
    Target,
    TargetEnv,
    TargetError,
    load_targets,
    select_targets,
)

HELP = ("a demo Django site per backend under gunicorn + wrk: cached vs uncached, "
        "stale pages, stampede")
SCHEMA = "djcachebench-http"
VERSION = 1
#: Route name -> path. "uncached" routes are what the cached ones are compared to.
ROUTES = {
    "light": "/light/",
    "light-page": "/light/page/",
    "light-lowlevel": "/light/lowlevel/",
    "heavy": "/heavy/",
    "heavy-page": "/heavy/page/",
    "heavy-lowlevel": "/heavy/lowlevel/",
    "session": "/session/",
}
DEFAULT_BACKENDS = "locmem,sqlite,tiered,redis,memcached,diskcache"
#: Longest an unprotected stampede round may take: under the clients' 120 s
#: request timeout (probes.stampede) and gunicorn's worker timeout (gunicorn.py).
STAMPEDE_BUDGET = 100.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Every value is checked here (argtypes): a bad one is a usage error, exit 2,
    # before any server starts.
    parser.add_argument("--backends", type=names, default=DEFAULT_BACKENDS,
                        help=f"comma-separated targets (default {DEFAULT_BACKENDS})")
    parser.add_argument("--routes", type=names, default=",".join(ROUTES),
                        help=f"comma-separated routes (default all: {','.join(ROUTES)})")
    parser.add_argument("--duration", type=whole_seconds, default=10,
                        help="whole seconds of wrk per route, >= 1 (10)")
    parser.add_argument("--connections", type=connection_count, default=64,
                        help="wrk connections (64)")
    parser.add_argument("--workers", type=process_count, default=2 * usable_cpus(),
                        help="gunicorn sync workers (default 2x usable cores)")
    parser.add_argument("--repeat", type=positive_int, default=1,
                        help="runs of every target, interleaved")
    parser.add_argument("--stampede-clients", type=thread_count, default=100,
                        help="simultaneous requests for one uncomputed key (100)")
    parser.add_argument("--compute-seconds", type=non_negative_seconds, default=0.2,
                        help="how long the stampede's computation takes (0.2)")
    parser.add_argument("--l2-outage", type=whole_seconds, metavar="SECONDS",
                        help="stop each target's redis or memcached (SIGSTOP) for SECONDS, "
                        "continue it for SECONDS, alternately, while wrk loads each route; "
                        "report requests/s in the outage and the healthy windows. Whole "
                        "seconds >= 1; --duration a multiple of twice it")
    parser.add_argument("--breaker", type=breaker_modes, metavar="on,off",
                        help="run every TieredCache target with its circuit breaker (on), "
                        "without (off), or both (on,off); its L2 gets a 0.5 s socket timeout")
    parser.add_argument("--out", type=Path,
                        help="output folder (default ./bench/results/DATE-http)")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG charts")


def _unsupported(target: Target) -> str | None:
    if target.settings is not None or target.setup_commands:
        return "needs Django settings of its own (DATABASES); the demo site has its own"
    return target.missing_module() or target.unsupported or None


def run(args: argparse.Namespace, command: list[str]) -> int:
    reason = gunicorn_missing()
    if reason:
        print(f"djcachebench http: {reason}")
        return 2
    routes = args.routes
    unknown = [r for r in routes if r not in ROUTES]
    if unknown:
        print(f"djcachebench http: unknown route(s) {unknown}; allowed: {', '.join(ROUTES)}")
        return 2
    serial = args.compute_seconds * -(-args.stampede_clients // args.workers)
    if serial > STAMPEDE_BUDGET:
        # Unprotected, each worker runs its share of the clients' computations one
        # after another; past the budget the clients (and gunicorn) time out and
        # the round measures the timeouts, not the stampede.
        print(f"djcachebench http: --compute-seconds {args.compute_seconds:g} x "
              f"{args.stampede_clients} clients over {args.workers} workers takes "
              f"{serial:,.0f} s unprotected; allowed: at most {STAMPEDE_BUDGET:.0f} s "
              f"(fewer --stampede-clients, more --workers or a shorter computation)")
        return 2
    if args.l2_outage and (why := cycle_error(args.duration, args.l2_outage)):
        print(f"djcachebench http: error: {why}", file=sys.stderr)
        return 2
    targets = breaker_variants(select_targets(load_targets(), args.backends), args.breaker)
    if args.l2_outage:
        check_outage_targets(targets)
    # A second run the same day gets a folder of its own (DATE-HHMMSS-http), as
    # bench's do, instead of overwriting the first run's results.
    out = prepare_out_dir(args.out or default_out_dir("http"))
    no_wrk = wrk_missing()
    if no_wrk:
        print(f"djcachebench http: routes skipped: {no_wrk}")
    workdir = Path(tempfile.mkdtemp(prefix="djcb-http-"))
    base_db = workdir / "base.sqlite3"
    seed(base_db)
    data: dict[str, Any] = {
        "schema": SCHEMA, "version": VERSION, "machine": machine_info(), "command": command,
        "params": {"duration": args.duration, "connections": args.connections,
                   "workers": args.workers, "repeat": args.repeat, "routes": routes,
                   "stampede_clients": args.stampede_clients,
                   "compute_seconds": args.compute_seconds, "l2_outage": args.l2_outage,
                   "breaker": args.breaker},
        "routes_skipped": no_wrk or "", "backends": {}, "skipped": {},
        # Targets that broke while running, or answered pages that are not the
        # site's, with the reason: the command then exits 1.
        "failed": {},
    }
    # SIGTERM takes Ctrl-C's path, so the finally blocks stop gunicorn, wrk and
    # the servers by PID instead of leaving them running.
    previous = signal.signal(signal.SIGTERM, terminate_as_interrupt)
    pool = ServerPool()
    try:
        for run_index in range(args.repeat):
            for target in run_order(targets, run_index):
                why = _unsupported(target) or pool.need(target)
                if why:
                    data["skipped"][target.name] = why
                    continue
                print(f"djcachebench http: {target.name}, run {run_index + 1} of {args.repeat}",
                      flush=True)
                try:
                    one = _run_target(target, pool, workdir, base_db, routes, args,
                                      run_index, bool(no_wrk))
                except Exception as exc:
                    # One target's failure (a server, wrk, or a cache answering
                    # something unexpected) must never lose the others' results:
                    # it is recorded with its reason and the run goes on.
                    print(f"djcachebench http: {target.name} FAILED:", file=sys.stderr)
                    traceback.print_exception(exc, file=sys.stderr)
                    data["failed"][target.name] = _reason(exc)
                    continue
                data["backends"].setdefault(target.name, {"runs": []})["runs"].append(one)
                unexpected = one["freshness"].get("unexpected", 0)
                if unexpected:
                    # Its pages are not the site's: the figures measure something else.
                    data["failed"][target.name] = (
                        f"{unexpected} unexpected page(s): the product list read through "
                        f"the cache was not the list (the cache answered something else)")
                elif fault := site_faults(one):
                    data["failed"][target.name] = fault
    finally:
        try:
            with deferred_signals():
                pool.stop()
                shutil.rmtree(workdir, ignore_errors=True)
        finally:
            signal.signal(signal.SIGTERM, previous)
    (out / "results.json").write_text(json.dumps(data, indent=1))
    written = write_outputs(out, data, plot=not args.no_plot)
    for path in written:
        print(path)
    for name, why in data["failed"].items():
        print(f"djcachebench http: {name} FAILED: {why}", file=sys.stderr)
    return 0 if data["backends"] and not data["failed"] else 1


def check_outage_targets(targets: list[Target]) -> None:
    """Raise :class:`TargetError` (exit 2, before any server starts) for targets that
    ``--l2-outage`` cannot hang: their cache is in-process or on disk, no server.

    Why an error and not a skip: every figure of such a run is about the outage,
    and a target without one has none to give; the default target list holds
    several, and an error now costs nothing where a skip is found after the run."""
    serverless = [t.name for t in targets if not t.servers]
    if serverless:
        have = "has" if len(serverless) == 1 else "have"
        raise TargetError(
            f"--l2-outage stops the redis or memcached server a target's cache uses, and "
            f"{', '.join(serverless)} {have} none (in the process or on disk); name targets "
            f"with a server in --backends (e.g. redis, memcached, tiered-redis)")


def _reason(exc: BaseException) -> str:
    """An exception as a one-line reason: known failures as they are, others with their type."""
    if isinstance(exc, ServerUnavailable | WrkError | OSError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"



def site_config(target: Target, pool: ServerPool, workdir: Path, base_db: Path,
                name: str, compute_seconds: float) -> tuple[Path, Path]:
    """The demo site's settings file for ``target`` (a fresh copy of the seeded
    database, a clean server, a directory for the computations' logs), as every
    gunicorn worker of a run reads it, and that directory. ``bench/request_cost.py``
    serves the same site in-process from it."""
    here = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=workdir))
    for kind in target.servers:  # a clean server for every target and run
        pool.servers[kind].flush()
    env = TargetEnv(workdir=here, servers=pool.locations())
    db = here / "site.sqlite3"
    shutil.copyfile(base_db, db)
    log_dir = here / "computations"
    log_dir.mkdir()
    config = here / "site.json"
    config.write_text(json.dumps({
        "secret_key": "djcachebench-http-demo-site-not-secret-0123456789",
        "db": str(db), "cache": target.caches(env), "log_dir": str(log_dir),
        "compute_seconds": compute_seconds,
    }))
    return config, log_dir


def _run_target(target: Target, pool: ServerPool, workdir: Path, base_db: Path,
                routes: list[str], args: argparse.Namespace, run_index: int,
                skip_routes: bool) -> dict[str, Any]:
    config, log_dir = site_config(target, pool, workdir, base_db, target.name,
                                   args.compute_seconds)
    result: dict[str, Any] = {"routes": {}}
    with GunicornSite(config, args.workers) as site:
        if not skip_routes:
            cookie = _session_cookie(site)
            for route in routes:
                path = ROUTES[route]
                headers = (f"Cookie: {cookie}",) if route == "session" and cookie else ()
                probes.warm_threads(site.port, args.workers * 2, path)  # every worker
                if args.l2_outage:
                    servers = [pool.servers[kind] for kind in target.servers]
                    windows = run_windows(site.url + path, args.duration, args.l2_outage,
                                          args.connections, servers, headers)
                    result.setdefault("outage", {})[route] = {"windows": windows}
                    _say_windows(target.name, route, windows)
                    continue
                figures, _ = run_wrk(site.url + path, args.duration, args.connections,
                                     headers=headers)
                result["routes"][route] = figures.to_dict()
        result["freshness"] = probes.freshness(site.port)
    threads = max(1, math.ceil(args.stampede_clients / args.workers))
    with GunicornSite(config, args.workers, threads=threads) as site:
        probes.warm_threads(site.port, args.stampede_clients)
        result["stampede"] = {
            "protected": probes.stampede(site.port, f"r{run_index}-protected", log_dir, True,
                                         args.stampede_clients),
            # The same burst once the value is cached: what serving that many
            # simultaneous requests costs this server and client by itself, with
            # no computation to wait for (the floor under the stampede's p99).
            # The same key, so it reads the stored value; the probe counts only
            # this round's computations, and the report says when it computed.
            "cached": probes.stampede(site.port, f"r{run_index}-protected", log_dir, True,
                                      args.stampede_clients),
            "unprotected": probes.stampede(site.port, f"r{run_index}-unprotected", log_dir,
                                           False, args.stampede_clients),
        }
    return result


def _say_windows(name: str, route: str, windows: list[dict[str, Any]]) -> None:
    parts = []
    for kind in KINDS:
        total = summarize(windows, kind)
        if total:
            parts.append(f"{kind} {total['requests_per_s']:,.0f} requests/s "
                         f"({total['non_2xx']:,} errors)")
    print(f"  {name} {route}: {'; '.join(parts)}", flush=True)


def site_faults(one: dict[str, Any]) -> str | None:
    """Why a run's figures are not a site's (None: they are): error responses on a
    route, freshness reads that failed, stampede requests that failed. A cache
    that breaks the site (every response an error, every freshness read an
    error) must not be reported with its requests/s and ratios, exit 0.
    wrk's socket timeouts are not counted: a queue of slow uncached requests
    makes them on a healthy site. Error responses in ``--l2-outage`` windows
    (``one["outage"]``) are the measurement, not a fault."""
    faults = [f"{figures['non_2xx']:,} error responses on {route}"
              for route, figures in one.get("routes", {}).items() if figures.get("non_2xx")]
    fresh = one.get("freshness", {})
    if fresh.get("errors"):
        faults.append(f"{fresh['errors']} of {fresh.get('checked', '?')} freshness reads failed")
    for name, burst in one.get("stampede", {}).items():
        if burst.get("failures"):
            faults.append(f"{burst['failures']} of {burst['clients']} {name} stampede "
                          f"requests failed")
    return "; ".join(faults) or None


def _session_cookie(site: GunicornSite) -> str | None:
    """A session to reuse in every wrk request (else each request makes a new one)."""
    conn = http.client.HTTPConnection(LOOPBACK, site.port, timeout=30)
    try:
        conn.request("GET", "/session/")
        response = conn.getresponse()
        response.read()
        header = response.getheader("Set-Cookie") or ""
    finally:
        conn.close()
    return header.split(";", 1)[0] or None
