"""Checks that wrk cannot make: stale pages after a write, and stampede computations.

Both use plain ``http.client`` connections on loopback, one per request, so each
request may land on any gunicorn worker (sync workers close the connection
after every response), which is what makes a per-process cache show stale pages.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

from djcachebench.bench.servers import LOOPBACK
from djcachebench.bench.stats import percentile


def request(port: int, method: str, path: str, body: dict[str, str] | None = None,
            timeout: float = 60.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=timeout)
    try:
        headers = {}
        data = None
        if body is not None:
            data = urllib.parse.urlencode(body)
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def freshness(port: int, rounds: int = 5, reads: int = 40) -> dict[str, int]:
    """Each round: read the cached product list (fills the caches of some workers),
    POST a new price for product 1 (the view deletes the cached list), then read
    it ``reads`` times: a response that still carries the old price is stale.

    A 200 whose body is not the product list (a cache that answered something
    else: not JSON, not a list of rows) is counted as ``unexpected``, never
    read as fresh or stale, and never a crash that would lose the run."""
    stale = checked = errors = unexpected = 0
    for round_ in range(rounds):
        for _ in range(8):  # warm several workers' caches with the old list
            request(port, "GET", "/light/lowlevel/")
        new_price = 1_000_000 + round_
        status, _ = request(port, "POST", "/product/1/price", {"price": str(new_price)})
        if status != 200:
            errors += 1
            continue
        for _ in range(reads):
            status, body = request(port, "GET", "/light/lowlevel/")
            if status != 200:
                errors += 1
                continue
            price = product_price(body)
            if price is None:
                unexpected += 1
                continue
            checked += 1
            if price != new_price:
                stale += 1
    return {"checked": checked, "stale": stale, "errors": errors, "unexpected": unexpected}


def product_price(body: bytes) -> Any:
    """The first product's price in the product list's JSON, or None if the body is not one."""
    try:
        rows = json.loads(body)
        first = rows[0]
        if not isinstance(rows, list) or not isinstance(first, list):
            return None
        return first[3]
    except (ValueError, TypeError, LookupError):
        return None


def warm_threads(port: int, clients: int, path: str = "/warm") -> None:
    """``clients`` simultaneous requests of ``path`` (by default one cache read),
    twice, so that every server process and thread has its cache instance and
    connections, and a route its cached page, before anything is timed: a first
    access opens them, which is start-up cost, not the route's or the stampede's.

    Why simultaneous: a sync worker serves one request at a time, so requests
    sent one after another may all go to the same idle worker. Sent so, the
    routes' warm-up left workers cold, and each one's first request fell inside
    wrk's run: TieredCache's slowest request was 0.5-0.8 s in every run (its
    worker's imports and eight shard connections on a loaded machine) against
    locmem's 0.05-0.1 s."""
    for _ in range(2):
        threads = [threading.Thread(target=request, args=(port, "GET", path))
                   for _ in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def stampede(port: int, key: str, log_dir: Path, protect: bool, clients: int = 100
             ) -> dict[str, Any]:
    """``clients`` requests at once for a key nobody computed yet (an expired
    entry): how many computations ran, the wall time, the clients' p99, and how
    many requests reached the view before the round's first computation ended
    (``overlapped``: ``clients`` when they all met the missing key; ``None`` when
    the round computed nothing). Why count it: when the server is slow to
    accept the requests, the first computation can finish before most of them
    arrive, and such a round is not a stampede whatever its computations say."""
    barrier = threading.Barrier(clients)
    latencies: list[float] = []
    failures: list[str] = []
    path = f"/stampede/{key}/?protect={1 if protect else 0}"

    def one() -> None:
        barrier.wait(60)
        started = time.perf_counter()
        try:
            status, _ = request(port, "GET", path, timeout=120)
            if status != 200:
                failures.append(str(status))
        except OSError as exc:
            failures.append(type(exc).__name__)
        latencies.append(time.perf_counter() - started)

    threads = [threading.Thread(target=one) for _ in range(clients)]
    log = log_dir / f"{key}.log"
    # Only this round's computations: a round that reuses a key (the cached
    # burst reads the protected round's value) must not count that round's.
    before = _lines(log)
    since = time.time()
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    # Every request of the round has been answered: its computations are logged.
    computations = _lines(log) - before
    p50, p99 = client_percentiles(latencies)
    return {"clients": clients, "computations": computations, "wall_ms": wall * 1e3,
            "p50_ms": p50 * 1e3, "p99_ms": p99 * 1e3, "failures": len(failures),
            "overlapped": overlapped(log_dir, key, since)}


def client_percentiles(latencies: list[float]) -> tuple[float, float]:
    """(p50, p99) of the clients' latencies by the project's one percentile (nearest
    rank, stats.percentile): with 100 clients p99 is the 99th, not the maximum."""
    if not latencies:
        return 0.0, 0.0
    ordered = sorted(latencies)
    return float(percentile(ordered, 50)), float(percentile(ordered, 99))


def _lines(path: Path) -> int:
    """Lines in a computation log (one per computation), 0 if there is none yet."""
    try:
        return len(path.read_text().splitlines())
    except FileNotFoundError:
        return 0


def _times(path: Path, since: float) -> list[float]:
    """The wall-clock times logged in ``path`` at or after ``since``."""
    if not path.exists():
        return []
    return [t for t in (float(x) for x in path.read_text().split()) if t >= since]


def overlapped(log_dir: Path, key: str, since: float) -> int | None:
    """Requests for ``key`` that reached the view (after ``since``) before the
    first computation that ended after ``since``; None if none ended."""
    done = _times(log_dir / f"{key}.done", since)
    if not done:
        return None
    first = min(done)
    return sum(1 for t in _times(log_dir / f"{key}.arrivals", since) if t <= first)
