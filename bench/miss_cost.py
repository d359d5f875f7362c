"""What a read that misses TieredCache's L1 costs, against the same read of its L2 alone.

Usage: .venv/bin/python bench/miss_cost.py [--keys 30000] [--batch 1500] [--rounds 3]

Why: at many keys most of TieredCache's reads miss its L1, and whether the L1
pays depends on what a miss costs over the plain read it replaces. Two kinds of
miss: one the L1 keeps (the slot's token read first, the L2 read with its
expiry, the table file confirmed, the value kept) and one it lets through
unkept (the admission gate closed: a plain read behind the L1's checks).

Each round reads ``--batch`` keys never read before through a TieredCache of
its own configuration (its own L1 and admission gate) over a ShardedSQLiteCache
of ``--keys`` keys (the L1 has room and the gate is open, so every miss is
kept; ``--batch`` stays under the gate's window), then as many other such keys
through the ShardedSQLiteCache alone, then, once the gate has closed on a run
of misses, another batch through the TieredCache (misses let through unkept)
and one through the L2 again. It prints
each kind's CPU time per read (``process_time``: what other tenants of a shared
machine take is not counted) and its ratio to the plain reads of the same
round.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from djcachebench.tiered.admission import WINDOW  # imports nothing from Django


def _caches(location: str) -> Any:
    import django
    from django.conf import settings

    settings.configure(SECRET_KEY="miss-cost-bench-not-secret-0123456789", CACHES={
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "l2": {"BACKEND": "djcachebench.backends.sqlite.ShardedSQLiteCache",
               "LOCATION": location, "OPTIONS": {"MAX_ENTRIES": None}},
    })
    django.setup()
    from django.core.cache import caches
    return caches


def _per_read(get: Callable[[str], Any], keys: Sequence[str]) -> float:
    """CPU microseconds per read of ``keys`` through ``get``."""
    start = time.process_time()
    for key in keys:
        get(key)
    return (time.process_time() - start) / len(keys) * 1e6


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=30_000)
    parser.add_argument("--batch", type=int, default=1_500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    needed = args.rounds * (4 * args.batch + WINDOW)
    if not 0 < args.batch < WINDOW:
        parser.error(f"--batch must be between 1 and {WINDOW - 1} (the gate's window)")
    if args.keys < needed:
        parser.error(f"--keys must be at least {needed} (every read is of a new key)")

    caches = _caches(tempfile.mkdtemp(prefix="miss-cost-"))
    from djcachebench.backends.tiered import TieredCache

    l2 = caches["l2"]
    rng = random.Random(0)
    for start in range(0, args.keys, 5_000):
        l2.set_many({f"k{i}": rng.randbytes(100)
                     for i in range(start, min(start + 5_000, args.keys))}, 3600)
    fresh = [f"k{i}" for i in range(args.keys)]
    rng.shuffle(fresh)
    taken = 0

    def take(count: int) -> list[str]:
        nonlocal taken
        taken += count
        return fresh[taken - count:taken]

    kept: list[float] = []
    unkept: list[float] = []
    for round_no in range(1, args.rounds + 1):
        # A configuration of its own: instances of one share their L1 and gate.
        tiered = TieredCache("", {"OPTIONS": {"L2": "l2", "L1_MAX_ENTRIES": 10_000 + round_no}})
        kept_us = _per_read(tiered.get, take(args.batch))
        kept_entries = tiered.stats()["l1_entries"]
        plain_us = _per_read(l2.get, take(args.batch))
        # A run of misses that nothing answers closes the admission gate.
        for key in take(WINDOW):
            tiered.get(key)
        before = tiered.stats()["l1_entries"]
        unkept_us = _per_read(tiered.get, take(args.batch))
        added = tiered.stats()["l1_entries"] - before
        plain2_us = _per_read(l2.get, take(args.batch))
        kept.append(kept_us / plain_us)
        unkept.append(unkept_us / plain2_us)
        print(f"round {round_no}: plain read {plain_us:.2f} µs, miss kept {kept_us:.2f} µs "
              f"({kept[-1]:.2f}x, L1 entries {kept_entries}); plain read {plain2_us:.2f} µs, "
              f"miss let through {unkept_us:.2f} µs ({unkept[-1]:.2f}x, L1 entries added "
              f"{added})")
    print(f"median: miss kept {statistics.median(kept):.2f}x a plain read, "
          f"miss let through {statistics.median(unkept):.2f}x")


if __name__ == "__main__":
    main()
