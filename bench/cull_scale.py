"""Culling at scale: set latency of 8 processes inserting into a full cache.

Pre-fills ``--keys`` keys of ~100 bytes into a ShardedSQLiteCache with
``MAX_ENTRIES = --keys``, then ``--procs`` processes each insert ``--inserts``
new keys; every set is timed. The same is run with ``MAX_ENTRIES: None`` (no
culling) on a copy of the pre-filled directory, for the p99.9 ratio. Also
reports one process's get p50 at that size against a 1,100-key cache.

    .venv/bin/python bench/cull_scale.py --keys 100000 [--procs 8] [--inserts 3000]
        [--mmap BYTES] [--cull-batch N ...] [--skip-sets] [--sets-mmap BYTES]
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


def cache_for(location: str, max_entries: int | None, mmap_size: int | None = None,
              page_cache: int | None = None) -> Any:
    from django.conf import settings

    from djcachebench.backends.sqlite import ShardedSQLiteCache

    if not settings.configured:
        settings.configure(SECRET_KEY=SECRET)
    options: dict[str, Any] = {"MAX_ENTRIES": max_entries, "CULL_FREQUENCY": 3,
                               "LOCK_TIMEOUT": 5.0}
    if mmap_size is not None:  # None: the engine's default
        options["MMAP_SIZE"] = mmap_size
    if page_cache is not None:
        options["PAGE_CACHE"] = page_cache
    return ShardedSQLiteCache(location, {"OPTIONS": options})


def prefill(location: str, keys: int) -> None:
    """``keys`` rows in batches (one transaction per shard and batch), then the
    shards opened once as the limited cache sees them, so both runs below start
    from the same files (with the index on write order a large limit gives)."""
    cache = cache_for(location, None)
    batch = 5000
    for start in range(0, keys, batch):
        cache.set_many({f"pre{i}": VALUE for i in range(start, min(keys, start + batch))},
                       timeout=None)
    cache.close_connections()
    limited = cache_for(location, keys)
    limited._store.culler.recount()  # connects to every shard
    limited.close_connections()


def inserter(location: str, max_entries: int | None, prefix: str, count: int,
             barrier: Any, out: Any, cull_batch: int | None,
             mmap_size: int | None = None) -> None:
    if cull_batch is not None:  # an experiment: another batch size than the engine's
        from djcachebench.store import eviction

        eviction.CULL_BATCH = cull_batch
    cache = cache_for(location, max_entries, mmap_size)
    cache._store.culler.recount()  # a warm connection to every shard
    barrier.wait()
    stats = cache._store.stats
    times = []
    culled = []  # the sets that removed rows themselves (paid a batch of a cull)
    for i in range(count):
        before = stats.culled
        t = time.perf_counter()
        cache.set(f"{prefix}-{i}", VALUE, timeout=None)
        times.append(time.perf_counter() - t)
        if stats.culled != before:
            culled.append(times[-1])
    out.put((times, culled))


def run(location: str, max_entries: int | None, procs: int, inserts: int,
        cull_batch: int | None = None,
        mmap_size: int | None = None) -> tuple[list[float], list[float]]:
    """Every set's time, and those of the sets that culled."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(procs)
    out = ctx.Queue()
    ps = [ctx.Process(target=inserter, args=(location, max_entries, f"p{n}", inserts,
                                             barrier, out, cull_batch, mmap_size))
          for n in range(procs)]
    for p in ps:
        p.start()
    times: list[float] = []
    culled: list[float] = []
    for _ in ps:
        mine, mine_culled = out.get(timeout=3600)
        times.extend(mine)
        culled.extend(mine_culled)
    for p in ps:
        p.join()
    return times, culled


def get_p50(location: str, keys: int, reads: int = 20000,
            mmap_size: int | None = None) -> float:
    """One process's get p50 over uniformly random keys of the cache (all hits)."""
    import random

    cache = cache_for(location, None, mmap_size)
    rng = random.Random(0)
    names = [f"pre{rng.randrange(keys)}" for _ in range(reads)]
    for name in names[: reads // 10]:  # warm-up: connections, page cache
        cache.get(name)
    times = []
    for name in names:
        t = time.perf_counter()
        got = cache.get(name)
        times.append(time.perf_counter() - t)
        assert got is not None
    cache.close_connections()
    return statistics.median(times)


def pct(times: list[float], q: float) -> float:
    s = sorted(times)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--inserts", type=int, default=3000)
    parser.add_argument("--mmap", type=int, default=None,
                        help="also measure the gets with this MMAP_SIZE (bytes; 0: off)")
    parser.add_argument("--cull-batch", type=int, action="append", default=[],
                        help="also run the culling with this CULL_BATCH (repeatable)")
    parser.add_argument("--skip-sets", action="store_true", help="measure the gets only")
    parser.add_argument("--sets-mmap", type=int, default=None,
                        help="MMAP_SIZE of the inserting processes (default: the engine's)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        base = os.path.join(tmp, "base")
        t = time.monotonic()
        prefill(base, args.keys)
        print(f"prefilled {args.keys:,} keys in {time.monotonic() - t:.1f}s")
        small = os.path.join(tmp, "small")
        prefill(small, 1100)
        # ABAB: 1,100 keys, all keys, twice; then the same with --mmap's MMAP_SIZE.
        for mmap_size in [None] + ([] if args.mmap is None else [args.mmap]):
            figures = [get_p50(where, n, mmap_size=mmap_size)
                       for _ in range(2) for where, n in ((small, 1100), (base, args.keys))]
            few = statistics.median(figures[0::2])
            many = statistics.median(figures[1::2])
            shown = "default" if mmap_size is None else f"{mmap_size:,}"
            print(f"get p50 (MMAP_SIZE {shown}): 1,100 keys {few * 1e6:.1f}µs, "
                  f"{args.keys:,} keys {many * 1e6:.1f}µs, ratio {many / few:.2f} "
                  f"(runs: {', '.join(f'{x * 1e6:.1f}' for x in figures)})")
        runs: list[tuple[str, int | None, int | None]] = [
            ("no culling", None, None), ("culling", args.keys, None)]
        runs += [(f"batch {b}", args.keys, b) for b in args.cull_batch]
        for label, limit, batch in () if args.skip_sets else runs:
            location = os.path.join(tmp, label.replace(" ", "-"))
            shutil.copytree(base, location)
            times, culled = run(location, limit, args.procs, args.inserts, batch,
                                args.sets_mmap)
            print(f"{label:>10}: {len(times):,} sets, p50 {statistics.median(times) * 1e6:.0f}µs, "
                  f"p99 {pct(times, 0.99) * 1e3:.2f}ms, p99.9 {pct(times, 0.999) * 1e3:.2f}ms, "
                  f"max {max(times) * 1e3:.2f}ms; over 100 ms: "
                  f"{sum(x > 0.1 for x in times)}")
            if culled:
                print(f"{'':>10}  of which {len(culled):,} culled: p50 "
                      f"{statistics.median(culled) * 1e3:.2f}ms, "
                      f"p99 {pct(culled, 0.99) * 1e3:.2f}ms, max {max(culled) * 1e3:.2f}ms")
            if limit is not None:
                count = cache_for(location, limit).entry_count()
                print(f"{'':>10}  entries after: {count:,} (MAX_ENTRIES {limit:,})")


if __name__ == "__main__":
    main()
