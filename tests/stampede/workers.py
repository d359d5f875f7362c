"""Worker processes of tests/stampede/test_stampede.py (spawned: importable, own Django set-up)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any


def _setup(location: str, lease: float) -> Any:
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            SECRET_KEY="stampede-tests-not-secret-0123456789",
            CACHES={
                "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
                "disk": {"BACKEND": "djcachebench.backends.sqlite.ShardedSQLiteCache",
                         "LOCATION": location, "OPTIONS": {"MAX_ENTRIES": 10_000}},
                "tiered": {"BACKEND": "djcachebench.backends.tiered.TieredCache",
                           "OPTIONS": {"L2": "disk", "STAMPEDE_LEASE": lease}},
            },
        )
        django.setup()
    from django.core.cache import caches

    return caches


def compute(log: str, seconds: float) -> str:
    """The slow view: records each start and each finish in ``log`` (O_APPEND lines)."""
    with open(log, "a") as f:
        f.write(f"start {os.getpid()}\n")
    time.sleep(seconds)
    with open(log, "a") as f:
        f.write(f"done {os.getpid()}\n")
    return f"computed by {os.getpid()}"


def crowd(location: str, alias: str, lease: float, log: str, seconds: float, threads: int,
          barrier: Any, out: Any) -> None:
    """``threads`` threads call get_or_set on one cold key at once; report what and when."""
    caches = _setup(location, lease)
    results: list[tuple[str, float]] = []
    warmed = threading.Barrier(threads + 1)
    go = threading.Event()

    def one() -> None:
        cache = caches[alias]
        cache.get("warm-up")  # this thread's instance and connections, before the clock
        warmed.wait(60)
        go.wait(60)
        started = time.monotonic()
        value = cache.get_or_set("report", lambda: compute(log, seconds), 300)
        results.append((value, time.monotonic() - started))

    workers = [threading.Thread(target=one) for _ in range(threads)]
    for w in workers:
        w.start()
    warmed.wait(60)
    barrier.wait(60)  # every thread of every process is warmed up: all ask at once
    go.set()
    for w in workers:
        w.join()
    out.put(results)


def lease_holder(location: str, lease: float, log: str, ready: Any) -> None:
    """Takes the lease and computes for a long time (the test SIGKILLs it)."""
    caches = _setup(location, lease)

    def slow() -> str:
        ready.set()
        return compute(log, 3600)

    caches["tiered"].get_or_set("report", slow, 300)
