"""What a mutable value (a JSON-like API response) costs TieredCache in one process,
against ShardedSQLiteCache alone: a write, and a read that refills the L1 after
another process's write.

Usage: .venv/bin/python bench/mutable_values.py [--size 10000] [--keys 200] [--rounds 6]

The L1 keeps a mutable value pickled (so callers cannot change what it serves
next); over ShardedSQLiteCache it keeps the pickle the engine made or verified
instead of making another (``tiered_set``, ``tiered_get``). Each round sets
every key three times through each configuration (ABAB), then, for TieredCache,
has a second TieredCache over the same store (another process, in this one)
write every key, so that each read of the first goes to the store and refills
its L1; sqlite alone reads the same keys, written again by a second
ShardedSQLiteCache on its store (so that both verify the rows they read: a
process vouches for the rows it wrote itself without their tag). It prints
the p50 wall time of a set and of such a read per round, and the tiered ÷
sqlite ratios.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from typing import Any


def _caches(location: str) -> tuple[Any, Any, Any, Any]:
    import django
    from django.conf import settings

    def store(name: str) -> dict[str, Any]:
        return {"BACKEND": "djcachebench.backends.sqlite.ShardedSQLiteCache",
                "LOCATION": os.path.join(location, name), "OPTIONS": {"MAX_ENTRIES": None}}

    settings.configure(SECRET_KEY="mutable-values-bench-not-secret-0123456789", CACHES={
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "sqlite": store("alone"),
        "sqlite writer": store("alone"),
        "store": store("tiered"),
        "tiered": {"BACKEND": "djcachebench.backends.tiered.TieredCache",
                   "OPTIONS": {"L2": "store"}},
        "writer": {"BACKEND": "djcachebench.backends.tiered.TieredCache",
                   "OPTIONS": {"L2": "store", "L1_MAX_ENTRIES": 9999}},
    })
    django.setup()
    from django.core.cache import caches

    return caches["sqlite"], caches["sqlite writer"], caches["tiered"], caches["writer"]


def _p50_us(samples: list[int]) -> float:
    return statistics.median(samples) / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=10_000, help="bytes of JSON per value")
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    sqlite, sqlite_writer, tiered, writer = _caches(tempfile.mkdtemp(prefix="mutable-values-"))
    from djcachebench.bench.values import api_response

    rng = random.Random(1)
    values = [api_response(args.size, rng) for _ in range(50)]
    keys = [f"api:{i}" for i in range(args.keys)]
    clock = time.perf_counter_ns
    print(f"{args.size:,}-byte API dicts, {args.keys} keys; p50 per round, µs")
    print("round | sqlite set | tiered set | ratio | sqlite read | tiered refill | ratio")
    ratios: dict[str, list[float]] = {"set": [], "read": []}
    for n in range(1, args.rounds + 1):
        sets: dict[str, list[int]] = {"sqlite": [], "tiered": []}
        reads: dict[str, list[int]] = {"sqlite": [], "tiered": []}
        for i in range(3 * args.keys):
            key, value = keys[i % args.keys], values[i % len(values)]
            for name, cache in (("sqlite", sqlite), ("tiered", tiered)):
                started = clock()
                cache.set(key, value, 600)
                sets[name].append(clock() - started)
        for i, key in enumerate(keys):  # another process's writes end the L1's copies
            writer.set(key, values[(i + n) % len(values)], 600)
            sqlite_writer.set(key, values[(i + n) % len(values)], 600)
        for key in keys:
            for name, cache in (("sqlite", sqlite), ("tiered", tiered)):
                started = clock()
                cache.get(key)
                reads[name].append(clock() - started)
        row = [_p50_us(sets["sqlite"]), _p50_us(sets["tiered"]),
               _p50_us(reads["sqlite"]), _p50_us(reads["tiered"])]
        ratios["set"].append(row[1] / row[0])
        ratios["read"].append(row[3] / row[2])
        print(f"{n} | {row[0]:.1f} | {row[1]:.1f} | {ratios['set'][-1]:.2f} | "
              f"{row[2]:.1f} | {row[3]:.1f} | {ratios['read'][-1]:.2f}")
    stats = tiered.stats()
    print(f"median ratios: set {statistics.median(ratios['set']):.2f}, "
          f"refilling read {statistics.median(ratios['read']):.2f} "
          f"(tiered: {stats['l2_hits']:,} reads from the store, {stats['l1_hits']:,} L1 hits)")


if __name__ == "__main__":
    main()
