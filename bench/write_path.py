"""What a write costs in one process: ShardedSQLiteCache alone, the same store once a
TieredCache watches it (its engine then marks and stamps every change), and
TieredCache over it, whole and without its parts: with no L1 (``L1_MAX_ENTRIES``
0: the write and its stamp, the least any coherent L1 can do) and with no value
board (``SHARED_VALUE_BYTES`` 0: the writer keeps its copy, publishes nothing).

Usage: .venv/bin/python bench/write_path.py [--keys 1100] [--batches 20] [--batch 1000]

Each configuration replaces values (1-495 random bytes) of ``--keys`` bytes keys,
``--batch`` sets at a time; the configurations take turns (ABAB), and the
script prints each one's lowest and median CPU time per set (``process_time``:
time other tenants of a shared machine take is not counted) and the ratios to
the unwatched store, taken batch by batch.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from typing import Any

#: TieredCaches without one part of the write path each, over stores of their own.
PARTS: dict[str, dict[str, Any]] = {
    "tiered, no L1": {"L1_MAX_ENTRIES": 0},
    "tiered, no board": {"SHARED_VALUE_BYTES": 0},
}


def _caches(location: str) -> dict[str, Any]:
    import django
    from django.conf import settings

    store = {"BACKEND": "djcachebench.backends.sqlite.ShardedSQLiteCache",
             "OPTIONS": {"MAX_ENTRIES": None}}
    settings.configure(SECRET_KEY="write-path-bench-not-secret-0123456789", CACHES={
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "alone": {**store, "LOCATION": os.path.join(location, "alone")},
        "watched": {**store, "LOCATION": os.path.join(location, "watched")},
        "tiered": {"BACKEND": "djcachebench.backends.tiered.TieredCache",
                   "OPTIONS": {"L2": "watched"}},
        **{f"store {name}": {**store, "LOCATION": os.path.join(location, name)}
           for name in PARTS},
        **{name: {"BACKEND": "djcachebench.backends.tiered.TieredCache",
                  "OPTIONS": {"L2": f"store {name}", **options}}
           for name, options in PARTS.items()},
    })
    django.setup()
    from django.core.cache import caches

    configs = {"sqlite": caches["alone"], "sqlite, watched": caches["watched"]}
    for name in ("tiered", *PARTS):
        configs[name] = caches[name]
        configs[name].get("watch")  # from now on its store marks and stamps
    return configs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=1100)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--batch", type=int, default=1000)
    args = parser.parse_args()
    configs = _caches(tempfile.mkdtemp(prefix="write-path-"))
    rng = random.Random(0)
    keys = [b"key-%d" % i for i in range(args.keys)]
    values = [rng.randbytes(rng.randint(1, 495)) for _ in keys]
    for cache in configs.values():
        for key, value in zip(keys, values, strict=True):
            cache.set(key, value)
    per_set: dict[str, list[float]] = {name: [] for name in configs}
    step = 7 if args.keys % 7 else 11
    for _ in range(args.batches):
        for name, cache in configs.items():
            started = time.process_time()
            for i in range(args.batch):
                j = (i * step) % args.keys
                cache.set(keys[j], values[j])
            per_set[name].append((time.process_time() - started) / args.batch * 1e6)
    base = per_set["sqlite"]
    for name, times in per_set.items():
        ratios = [t / b for t, b in zip(times, base, strict=True)]
        print(f"{name:17s} lowest {min(times):6.1f} µs  median {statistics.median(times):6.1f} µs"
              f"  / sqlite: median {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
