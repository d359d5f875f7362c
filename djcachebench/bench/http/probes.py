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
    it ``reads`` times: a response that still carries the old price is stale."""
    stale = checked = errors = 0
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
            checked += 1
            first = json.loads(body)[0]
            if first[3] != new_price:
                stale += 1
    return {"checked": checked, "stale": stale, "errors": errors}


def warm_threads(port: int, clients: int) -> None:
    """``clients`` simultaneous cache reads, twice, so that every server thread has
    its cache instance and connections before the stampede is timed (a first
    access opens them: that is start-up cost, not the stampede's)."""
    for _ in range(2):
        threads = [threading.Thread(target=request, args=(port, "GET", "/warm"))
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
    since = time.time()
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    log = log_dir / f"{key}.log"
    computations = len(log.read_text().splitlines()) if log.exists() else 0
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else 0.0
    return {"clients": clients, "computations": computations, "wall_ms": wall * 1e3,
            "p50_ms": latencies[len(latencies) // 2] * 1e3 if latencies else 0.0,
            "p99_ms": p99 * 1e3, "failures": len(failures),
            "overlapped": overlapped(log_dir, key, since)}


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
