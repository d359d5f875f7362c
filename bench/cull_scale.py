"""Culling at scale: set latency of 8 processes inserting into a full cache.

Pre-fills ``--keys`` keys of ~100 bytes into a ShardedSQLiteCache with
``MAX_ENTRIES = --keys``, then ``--procs`` processes each insert ``--inserts``
new keys; every set is timed. The same is run with ``MAX_ENTRIES: None`` (no
culling) on a copy of the pre-filled directory, for the p99.9 ratio. Also
reports one process's get p50 at that size against a 1,100-key cache.

    .venv/bin/python bench/cull_scale.py --keys 100000 [--procs 8] [--inserts 3000]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

SECRET = "bench-cull-not-secret-0123456789abcdef"
VALUE = b"v" * 100


def cache_for(location: str, max_entries: int | None) -> Any:
    from django.conf import settings

    from djcachebench.backends.sqlite import ShardedSQLiteCache

    if not settings.configured:
        settings.configure(SECRET_KEY=SECRET)
    return ShardedSQLiteCache(location, {"OPTIONS": {
        "MAX_ENTRIES": max_entries, "CULL_FREQUENCY": 3,
        "LOCK_TIMEOUT": 5.0}})


def prefill(location: str, keys: int) -> None:
    cache = cache_for(location, None)
    batch = 5000
    for start in range(0, keys, batch):
        cache.set_many({f"pre{i}": VALUE for i in range(start, min(keys, start + batch))},
                       timeout=None)


def inserter(location: str, max_entries: int | None, prefix: str, count: int,
             barrier: Any, out: Any) -> None:
    cache = cache_for(location, max_entries)
    cache.get("warm")
    barrier.wait()
    times = []
    for i in range(count):
        t = time.perf_counter()
        cache.set(f"{prefix}-{i}", VALUE, timeout=None)
        times.append(time.perf_counter() - t)
    out.put(times)


def run(location: str, max_entries: int | None, procs: int, inserts: int) -> list[float]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(procs)
    out = ctx.Queue()
    ps = [ctx.Process(target=inserter, args=(location, max_entries, f"p{n}", inserts,
                                             barrier, out)) for n in range(procs)]
    for p in ps:
        p.start()
    times: list[float] = []
    for _ in ps:
        times.extend(out.get(timeout=3600))
    for p in ps:
        p.join()
    return times


def get_p50(location: str, keys: int, reads: int = 20000) -> float:
    import random

    cache = cache_for(location, None)
    rng = random.Random(0)
    names = [f"pre{rng.randrange(keys)}" for _ in range(reads)]
    times = []
    for name in names:
        t = time.perf_counter()
        cache.get(name)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def pct(times: list[float], q: float) -> float:
    s = sorted(times)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--inserts", type=int, default=3000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        base = os.path.join(tmp, "base")
        t = time.monotonic()
        prefill(base, args.keys)
        print(f"prefilled {args.keys:,} keys in {time.monotonic() - t:.1f}s")
        small = os.path.join(tmp, "small")
        prefill(small, 1100)
        print(f"get p50: 1,100 keys {get_p50(small, 1100) * 1e6:.1f}µs, "
              f"{args.keys:,} keys {get_p50(base, args.keys) * 1e6:.1f}µs "
              f"(then 1,100 again: {get_p50(small, 1100) * 1e6:.1f}µs)")
        for label, limit in (("no culling", None), ("culling", args.keys)):
            location = os.path.join(tmp, label.replace(" ", "-"))
            shutil.copytree(base, location)
            times = run(location, limit, args.procs, args.inserts)
            print(f"{label:>10}: {len(times):,} sets, p50 {statistics.median(times) * 1e6:.0f}µs, "
                  f"p99 {pct(times, 0.99) * 1e3:.2f}ms, p99.9 {pct(times, 0.999) * 1e3:.2f}ms, "
                  f"max {max(times) * 1e3:.2f}ms; over 100 ms: "
                  f"{sum(x > 0.1 for x in times)}")
            if limit is not None:
                count = cache_for(location, limit).entry_count()
                print(f"{'':>10}  entries after: {count:,} (MAX_ENTRIES {limit:,})")


if __name__ == "__main__":
    main()
