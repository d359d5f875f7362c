"""A hung L2 under TieredCache's circuit breaker: latency during the outage, recovery after.

Usage: python bench/breaker_outage.py [--l2 redis,django-redis,memcached,sqlite]
                                      [--seconds 3] [--keys 100] [--out FILE]
                                      [--no-breaker]

For each L2: a TieredCache with ``BREAKER_THRESHOLD=3``, ``BREAKER_COOLDOWN=1.0``,
``SERVE_STALE=30`` over it, its client's socket timeouts at 0.5 s (redis,
django-redis: ``socket_timeout``; pylibmc: ``receive_timeout``/``send_timeout``
and a 500 ms poll); ``--keys`` keys written and read (so the L1 holds them). Then
the L2 hangs: redis-server or memcached is SIGSTOPped (it accepts nothing and
answers nothing, as a swapped or stopped server), and for ShardedSQLiteCache
(``SHARDS=1``) another process holds the shard's write lock, uncommitted. For
``--seconds``, rounds of (get of a held key, get of an absent key, set of one of
ten other keys), each call timed with ``perf_counter_ns``; a call that raises is timed as
well (failing fast is what is measured). The first 10 rounds are the outage's
start (the breaker opens once the client's timeouts have failed 3 calls: redis-py
waits its timeout twice before it gives up a call, so this takes seconds); the
p99 of each kind is over the rounds of the ``--seconds`` that follow them, and
every held key read must return its last written value. Then the L2
is continued (SIGCONT, the lock released), and a set is retried until it
succeeds: the time from the continue to that success, and whether another
process then reads the value.

Why ten keys to set: a write refused while the breaker is open stamps its key's
slot of the generation table, so that no L1 of the host serves the value it
meant to replace; a held key that shares the slot is dropped too (slots, not
keys, are stamped), and its next read fails at once. A run that wrote a new key
every round would measure those collisions (about one held key in 65,536 per
key written, at the default ``GENERATION_SLOTS``), not the breaker.

``--no-breaker`` runs the same with ``BREAKER_THRESHOLD=None`` (what a site
meets without it: each call waits its socket timeout). Figures and the command
are in docs/benchmarks.md; the short run in CI (tests) only checks that the
command works.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SPAWN = multiprocessing.get_context("spawn")
THRESHOLD, COOLDOWN, STALE, TIMEOUT = 3, 1.0, 30.0, 0.5
KINDS = ("get held", "get absent", "set")


def _l2_spec(kind: str, where: str, server: Any) -> dict[str, Any]:
    if kind == "redis":
        return {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                "LOCATION": server.location,
                "OPTIONS": {"socket_timeout": TIMEOUT, "socket_connect_timeout": TIMEOUT}}
    if kind == "django-redis":
        return {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": server.location,
                "OPTIONS": {"SOCKET_TIMEOUT": TIMEOUT, "SOCKET_CONNECT_TIMEOUT": TIMEOUT}}
    if kind == "memcached":
        micros, millis = int(TIMEOUT * 1e6), int(TIMEOUT * 1e3)
        return {"BACKEND": "django.core.cache.backends.memcached.PyLibMCCache",
                "LOCATION": server.location,
                "OPTIONS": {"binary": True, "behaviors": {
                    "receive_timeout": micros, "send_timeout": micros,
                    "connect_timeout": millis, "_poll_timeout": millis,
                    # libmemcached keeps a server it saw fail out of use this long
                    # (seconds), whatever the breaker says.
                    "retry_timeout": 1}}}
    # A locked shard is waited for LOCK_TIMEOUT twice: about the others' 0.5 s.
    return {"BACKEND": "djcachebench.backends.sqlite.ShardedSQLiteCache",
            "LOCATION": os.path.join(where, "sqlite"),
            "OPTIONS": {"SHARDS": 1, "LOCK_TIMEOUT": TIMEOUT / 2, "RETRIES": 1}}


def options(kind: str, where: str, server: Any, breaker: bool) -> dict[str, Any]:
    # ShardedSQLiteCache keeps its own table; the others get one in ``where``.
    table = None if kind == "sqlite" else os.path.join(where, "generations.mmap")
    return {"L2": _l2_spec(kind, where, server), "GENERATION_PATH": table,
            "BREAKER_THRESHOLD": THRESHOLD if breaker else None,
            "BREAKER_COOLDOWN": COOLDOWN, "SERVE_STALE": STALE if breaker else None}


def _setup(opts: dict[str, Any]) -> Any:
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(SECRET_KEY="breaker-bench-not-secret-0123456789", CACHES={
            "default": {"BACKEND": "djcachebench.backends.tiered.TieredCache",
                        "OPTIONS": opts}})
        django.setup()
    from django.core.cache import cache

    return cache


def read_elsewhere(opts: dict[str, Any], key: str, out: Any) -> None:
    """Another process of the host reads ``key`` (after the recovery); what it
    raised, if it did (the breaker may still be open for it)."""
    try:
        out.put(_setup(opts).get(key))
    except Exception as exc:
        out.put(f"raised {type(exc).__name__}: {exc}")


def _hold_lock(path: str, ready: Any, release: Any) -> None:
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("UPDATE meta SET entries = entries WHERE id = 0")
    ready.set()
    release.wait(600)
    conn.close()


@contextmanager
def server_for(kind: str) -> Iterator[Any]:
    from djcachebench.bench.servers import MemcachedServer, RedisServer

    if kind == "sqlite":
        yield None
        return
    server = MemcachedServer() if kind == "memcached" else RedisServer()
    server.start()
    try:
        yield server
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.stop()


def hang(kind: str, server: Any, where: str) -> Callable[[], None]:
    """Hang the L2; returns what continues it."""
    if server is not None:
        os.kill(server.pid, signal.SIGSTOP)
        return lambda: os.kill(server.pid, signal.SIGCONT)
    ready, release = SPAWN.Event(), SPAWN.Event()
    holder = SPAWN.Process(target=_hold_lock, args=(
        os.path.join(where, "sqlite", "shard-000.sqlite3"), ready, release))
    holder.start()
    if not ready.wait(60):
        raise RuntimeError("the lock holder did not start")

    def resume() -> None:
        release.set()
        holder.join(60)

    return resume


def p99(samples: list[int]) -> float | None:
    if not samples:
        return None
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] / 1e6


def run_one(kind: str, seconds: float, keys: int, breaker: bool) -> dict[str, Any]:
    with server_for(kind) as server, tempfile.TemporaryDirectory() as where:
        opts = options(kind, where, server, breaker)
        from djcachebench.backends.tiered import TieredCache

        cache = TieredCache("", {"OPTIONS": opts})
        held = {f"held-{i}": f"value-{i}" for i in range(keys)}
        for key, value in held.items():
            cache.set(key, value)
        assert all(cache.get(k) == v for k, v in held.items())
        resume = hang(kind, server, where)
        times: dict[str, list[int]] = {k: [] for k in KINDS}
        errors = dict.fromkeys(KINDS, 0)
        wrong = 0
        rounds = 0
        names = list(held)
        hung = time.monotonic()
        end = None
        try:
            while end is None or time.monotonic() < end:
                if rounds == 10:
                    end = time.monotonic() + seconds
                key = names[rounds % len(names)]
                n = rounds
                for what, call in (("get held", lambda k=key: cache.get(k)),
                                   ("get absent", lambda n=n: cache.get(f"absent-{n}")),
                                   ("set", lambda n=n: cache.set(f"new-{n % 10}", n))):
                    start = time.perf_counter_ns()
                    try:
                        got = call()
                    except Exception:
                        errors[what] += 1
                        got = "raised"
                    took = time.perf_counter_ns() - start
                    if rounds >= 10:
                        times[what].append(took)
                    if what == "get held" and got != held[key]:
                        wrong += 1
                rounds += 1
        finally:
            resumed = time.monotonic()
            resume()
        recovered = None
        while time.monotonic() - resumed < 60:
            try:
                cache.set("after", "the outage")
                if cache.get("after") == "the outage":
                    recovered = time.monotonic() - resumed
                    break
            except Exception:
                time.sleep(0.02)
        out = SPAWN.Queue()
        proc = SPAWN.Process(target=read_elsewhere, args=(opts, "after", out))
        proc.start()
        seen = out.get(timeout=120)
        proc.join(60)
        stats = cache.stats()
        return {"l2": kind, "breaker": breaker, "rounds": rounds,
                "first_10_rounds_s": round(end - seconds - hung, 3),
                "p99_ms": {k: p99(v) for k, v in times.items()},
                "errors": errors, "held_wrong": wrong, "recovered_s": recovered,
                "read_elsewhere": seen == "the outage",
                "breaker_opened": stats["breaker_opened"],
                "fast_failures": stats["fast_failures"], "stale_served": stats["stale_served"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--l2", default="redis,django-redis,memcached,sqlite")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--no-breaker", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    import django
    from django.conf import settings

    settings.configure(SECRET_KEY="breaker-bench-not-secret-0123456789")
    django.setup()
    results = []
    print(f"{'L2':<13} {'start':>7} {'rounds':>6} " + " ".join(f"{k + ' p99':>16}" for k in KINDS)
          + f" {'held wrong':>10} {'recovered':>10} {'read there':>10}", flush=True)
    for kind in args.l2.split(","):
        r = run_one(kind, args.seconds, args.keys, not args.no_breaker)
        results.append(r)
        cells = " ".join(f"{'-' if v is None else f'{v:.3f} ms':>16}"
                         for v in r["p99_ms"].values())
        rec = "-" if r["recovered_s"] is None else f"{r['recovered_s']:.2f} s"
        print(f"{kind:<13} {r['first_10_rounds_s']:>6.2f}s {r['rounds']:>6} {cells} "
              f"{r['held_wrong']:>10} {rec:>10} {'yes' if r['read_elsewhere'] else 'NO':>10}",
              flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
