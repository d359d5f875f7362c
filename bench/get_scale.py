"""Get p50 of ShardedSQLiteCache at many keys against 1,100 keys, at the same moments.

    .venv/bin/python bench/get_scale.py --keys 1000000 [--blocks 40] [--block 2000]
        [--mmap BYTES] [--page-cache BYTES] [--dir DIR] [--floor]

Pre-fills two caches (``--keys`` and 1,100 keys of 100 bytes, the layout of
``cull_scale.py``; kept in ``--dir`` across runs when given), then one process
per cache reads uniformly random keys in turns: a block of ``--block`` gets in
one process, then a block in the other, ``--blocks`` times each. Only one of
them runs at a time, so each sees the machine as the other saw it a moment
before: on a shared machine whose speed drifts by tens of percent between
runs, the ratio of the two medians is steady where two runs one after the
other are not. Each process warms up first (``--warm`` gets), so that the
memos of the read path are in the state a long-running process reaches.
Prints both p50s, their ratio, and the ratio per quarter of the blocks.

``--floor`` also times, in the same blocks (alternating call by call with the
gets, on other random keys), the two parts of a get that no Python layer can
remove: the engine's SELECT alone, on the cache's own connection (so the same
page cache), and the integrity check of the row it returned by its tag
(``Sealer.open``), which every row pays at its first read in a process. What
a target of 1.5 times allows a get to grow by is half the 1,100-key get;
what these two grow by, between the two key counts, is the least any get on
this storage format can grow by (at 1,100 keys the exact-bytes memo spares the
tag; the floor counts that as free).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cull_scale  # bench/ is not a package: found through the path above

FEW = 1100


def reader(location: str, keys: int, mmap_size: int | None, page_cache: int | None, warm: int,
           blocks: int, block: int, floor: bool, turn: Any, done: Any, out: Any) -> None:
    cache = cull_scale.cache_for(location, None, mmap_size, page_cache)
    rng = random.Random(keys)
    get = cache.get
    for _ in range(warm):
        get(f"pre{rng.randrange(keys)}")
    clock = time.perf_counter_ns
    times: list[list[int]] = []
    selects: list[int] = []
    tags: list[int] = []
    for _ in range(blocks):
        names = [f"pre{rng.randrange(keys)}" for _ in range(block)]
        others = [cache.make_key(f"pre{rng.randrange(keys)}") for _ in range(block)]
        turn.wait()
        turn.clear()
        mine = []
        for name, other in zip(names, others, strict=True):
            t = clock()
            get(name)
            mine.append(clock() - t)
            if floor:
                _floor(cache, other, selects, tags)
        times.append(mine)
        done.set()
    cache.close_connections()
    out.put((keys, (times, selects, tags)))


def _floor(cache: Any, key: str, selects: list[int], tags: list[int]) -> None:
    """Time the engine's SELECT of ``key`` and the tag check of its row."""
    from djcachebench.serializers import RAW_BYTES
    from djcachebench.store.statements import SQL_GET

    store = cache._store  # a measurement of the engine's own parts
    cursor = store.pool.cursor(store.route(key))
    clock = time.perf_counter_ns
    t = clock()
    row = cursor.execute(SQL_GET, (key,)).fetchone()
    selects.append(clock() - t)
    t = clock()
    ok = store.codec._sealer.open(key, row[1], RAW_BYTES)
    tags.append(clock() - t)
    assert ok is not None, key


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--block", type=int, default=2000)
    parser.add_argument("--warm", type=int, default=30000)
    parser.add_argument("--mmap", type=int, default=None,
                        help="MMAP_SIZE of both caches (default: the engine's)")
    parser.add_argument("--page-cache", type=int, default=None,
                        help="PAGE_CACHE of both caches (default: the engine's)")
    parser.add_argument("--dir", help="keep the pre-filled caches here (reused when present)")
    parser.add_argument("--floor", action="store_true",
                        help="also time the engine's SELECT and the tag check alone")
    args = parser.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="get-scale-")
    where = {}
    for n in (FEW, args.keys):
        where[n] = os.path.join(root, f"n{n}")
        if not os.path.exists(where[n]):
            t = time.monotonic()
            cull_scale.prefill(where[n], n)
            print(f"pre-filled {n:,} keys in {time.monotonic() - t:.1f}s")
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    turns = {n: (ctx.Event(), ctx.Event()) for n in where}
    procs = [ctx.Process(target=reader, args=(where[n], n, args.mmap, args.page_cache,
                                              args.warm, args.blocks, args.block,
                                              args.floor, *turns[n], out)) for n in where]
    for p in procs:
        p.start()
    for _ in range(args.blocks):
        for n in where:  # one block at a time, in turns
            turn, done = turns[n]
            turn.set()
            if not done.wait(600):
                raise SystemExit(f"the {n:,}-key reader stopped answering")
            done.clear()
    results = dict(out.get(timeout=600) for _ in procs)
    for p in procs:
        p.join()

    def p50(blocks: list[list[int]]) -> float:
        return statistics.median(t for b in blocks for t in b) / 1e3

    gets = {n: results[n][0] for n in results}
    few, many = p50(gets[FEW]), p50(gets[args.keys])
    q = max(1, args.blocks // 4)
    quarters = [p50(gets[args.keys][i:i + q]) / p50(gets[FEW][i:i + q])
                for i in range(0, args.blocks, q)]
    shown = "default" if args.mmap is None else f"{args.mmap:,}"
    cached = "default" if args.page_cache is None else f"{args.page_cache:,}"
    print(f"get p50 (MMAP_SIZE {shown}, PAGE_CACHE {cached}): {FEW:,} keys {few:.1f} µs, "
          f"{args.keys:,} keys "
          f"{many:.1f} µs, ratio {many / few:.2f} (by quarter: "
          f"{', '.join(f'{r:.2f}' for r in quarters)})")
    if args.floor:
        select = {n: statistics.median(results[n][1]) / 1e3 for n in results}
        tag = statistics.median(results[args.keys][2]) / 1e3
        growth = select[args.keys] - select[FEW] + tag
        print(f"floor: the engine's SELECT alone {select[FEW]:.1f} µs at {FEW:,} keys, "
              f"{select[args.keys]:.1f} µs at {args.keys:,}; the tag check at "
              f"{args.keys:,} keys {tag:.2f} µs (spared by the memo at {FEW:,}); "
              f"least growth {growth:.1f} µs against the {few / 2:.1f} µs the 1.5x target "
              f"allows (half the {FEW:,}-key get)")


if __name__ == "__main__":
    main()
