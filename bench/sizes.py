"""get and set p50 by value size: ShardedSQLiteCache against diskcache's DjangoCache.

One process. For each value (bytes of 10 KB to 10 MB, a pickled ~10 KB dict,
a 60 KB HTML ``str``) both caches are measured in the same run, the rounds
interleaved (sqlite, diskcache, sqlite, ...) so that a noisy neighbour hits
both; each round sets then gets a few keys repeatedly and the p50 is over
every round. ``--serializer msgpack`` stores the dict with msgpack in both
caches (diskcache through a ``Disk`` that packs what it stores and unpacks what
it reads, see :func:`msgpack_disk`), so that the two stores are compared and
not two serializers; ``--serializer msgpack-sqlite`` only in ShardedSQLiteCache
(diskcache pickling, as its default ``Disk`` does).

    .venv/bin/python bench/sizes.py [--rounds 5] [--serializer pickle|msgpack|msgpack-sqlite]
        [--cases 2KB,10KB,20KB,100KB,1MB,10MB,dict10KB,html60KB] [--keys 4]

``--keys`` is how many keys each round writes and reads (4 by default: the
values stay in the page cache and the memos). With thousands of keys a read
also walks a deeper B-tree, which is where the layout of the rows shows
(docs/architecture.md, "Values in blobs"); the total written per round is
capped near 250 MB, and a case too large for that is skipped.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import django
from django.conf import settings

CASES: dict[str, Callable[[], Any]] = {
    "2KB": lambda: os.urandom(2_000),
    "10KB": lambda: os.urandom(10_000),
    "20KB": lambda: os.urandom(20_000),
    "100KB": lambda: os.urandom(100_000),
    "1MB": lambda: os.urandom(1_000_000),
    "10MB": lambda: os.urandom(10_000_000),
    # A typical cached structure: ~10 KB pickled.
    "dict10KB": lambda: {f"field{i}": {"id": i, "name": f"name {i}", "score": i * 1.5,
                                       "tags": ["a", "b", "c"]} for i in range(150)},
    "html60KB": lambda: ("<div class='row'><span>Some text &amp; more</span></div>\n" * 1100),
}


def msgpack_disk() -> type:
    """A diskcache ``Disk`` that stores values as msgpack, as ``SERIALIZER: "msgpack"``
    makes ShardedSQLiteCache do (diskcache's hook for another encoding: a
    ``Disk`` subclass whose ``store`` encodes and whose ``fetch`` decodes)."""
    import diskcache
    import msgpack

    class MsgpackDisk(diskcache.Disk):
        def store(self, value: Any, read: bool, key: Any = diskcache.core.UNKNOWN) -> Any:
            if not read:
                value = msgpack.packb(value, use_bin_type=True)
            return super().store(value, read, key=key)

        def fetch(self, mode: int, filename: Any, value: Any, read: bool) -> Any:
            data = super().fetch(mode, filename, value, read)
            return data if read else msgpack.unpackb(data, raw=False, strict_map_key=False)

    return MsgpackDisk


def configure(workdir: str, serializer: str) -> None:
    disk = {"disk": msgpack_disk()} if serializer == "msgpack" else {}
    if serializer == "msgpack-sqlite":
        serializer = "msgpack"
    settings.configure(
        SECRET_KEY="bench-sizes-not-secret-0123456789abcdef",
        CACHES={
            "sqlite": {"BACKEND": "djcachebench.backends.sqlite.ShardedSQLiteCache",
                       "LOCATION": os.path.join(workdir, "sqlite"),
                       "OPTIONS": {"MAX_ENTRIES": 100_000, "SERIALIZER": serializer}},
            "diskcache": {"BACKEND": "diskcache.DjangoCache",
                          "LOCATION": os.path.join(workdir, "diskcache"), "OPTIONS": disk},
        },
    )
    django.setup()


def measure(cache: Any, value: Any, keys: int, reps: int) -> tuple[list[float], list[float]]:
    sets: list[float] = []
    gets: list[float] = []
    names = [f"v{i}" for i in range(keys)]
    for _ in range(reps):
        for name in names:
            t = time.perf_counter()
            cache.set(name, value)
            sets.append(time.perf_counter() - t)
    if keys > 4:  # not in write order: a B-tree walk like a site's reads
        random.Random(keys).shuffle(names)
    for _ in range(reps):
        for name in names:
            t = time.perf_counter()
            got = cache.get(name)
            gets.append(time.perf_counter() - t)
            assert got is not None
    return sets, gets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--serializer", default="pickle")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--keys", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as workdir:
        configure(workdir, args.serializer)
        from django.core.cache import caches

        targets = {"sqlite": caches["sqlite"], "diskcache": caches["diskcache"]}
        print(f"serializer={args.serializer} rounds={args.rounds} keys={args.keys} "
              f"python={sys.version.split()[0]}")
        print(f"{'case':>10} {'backend':>10} {'get p50':>10} {'set p50':>10}  get ratio  set ratio")
        for case in args.cases.split(","):
            value = CASES[case]()
            size = len(value) if isinstance(value, bytes | str) else 0
            reps = 3 if size >= 5_000_000 else 20 if size >= 500_000 else 200
            keys = args.keys
            if keys > 4:
                reps = max(1, 800 // keys)
                if keys * max(size, 10_000) > 250_000_000:
                    continue
            results: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n in targets}
            for _ in range(args.rounds):
                for name, cache in targets.items():
                    s, g = measure(cache, value, keys, reps)
                    results[name][0].extend(s)
                    results[name][1].extend(g)
            med = {n: (statistics.median(r[1]), statistics.median(r[0]))
                   for n, r in results.items()}
            for name in targets:
                g, s = med[name]
                ratio = ("" if name != "sqlite" else
                         f"  {g / med['diskcache'][0]:8.2f}  {s / med['diskcache'][1]:8.2f}")
                print(f"{case:>10} {name:>10} {_fmt(g):>10} {_fmt(s):>10}{ratio}")
            for cache in targets.values():
                cache.clear()


def _fmt(seconds: float) -> str:
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f}ms"
    return f"{seconds * 1e6:.1f}µs"


if __name__ == "__main__":
    main()
