"""How much of the reads TieredCache's L1 answers at many keys, against an ideal L1.

Usage: .venv/bin/python bench/l1_share.py [--keys 100000] [--procs 8] [--ops 20000]
                                          [--zipf 1.0] [--l1 10000]

Each process runs the same mix (90% get, 9% set, 1% delete) over ``--keys`` keys
drawn with Zipf popularity (``--zipf 0`` for uniform), first through
TieredCache over ShardedSQLiteCache, then through ShardedSQLiteCache alone (same
op lists, same pre-filled store), and reports:

* the share of gets the L1 answered (its hits, its known absences and values
  taken from the value board), summed over processes;
* the share an *ideal* L1 of the same size would answer: an LRU of ``--l1``
  entries per process that sees only that process's own reads and writes and
  is never invalidated by another process or by a key sharing its slot. The
  tiered share can only be lower (other processes' writes must invalidate);
  the gap is what coherence costs;
* wall time of both runs (throughput ratio tiered / sqlite), and the CPU of
  the workers' loops (on cores they keep busy, throughput goes as 1 / CPU);
* the ceiling: sqlite's CPU with every get an ideal L1 would answer made free
  (the CPU each of those gets cost in the sqlite run, timed per get) and nothing
  else dearer. No L1 of ``--l1`` entries per process can be faster than that;
  it shows how much of a throughput target the workload leaves to win.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import multiprocessing
import random
import tempfile
import time
from collections import OrderedDict
from typing import Any


def _cumulative(keys: int, s: float) -> list[float]:
    weights = [1.0 / (rank ** s) for rank in range(1, keys + 1)]
    return list(itertools.accumulate(weights))


def _ops(seed: int, keys: int, s: float, ops: int) -> list[tuple[int, str]]:
    rng = random.Random(seed)
    if s > 0:
        cumulative = _cumulative(keys, s)
        total = cumulative[-1]
        draw = [bisect.bisect_left(cumulative, rng.random() * total) for _ in range(ops)]
    else:
        draw = [rng.randrange(keys) for _ in range(ops)]
    out = []
    for index in draw:
        roll = rng.random()
        action = 0 if roll < 0.90 else (1 if roll < 0.99 else 2)
        out.append((action, f"key-{index}"))
    return out


def _setup(location: str, l1: int, options: dict | None = None) -> Any:
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(SECRET_KEY="l1-share-bench-not-secret-0123456789", CACHES={
            "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
            "sqlite": {"BACKEND": "djcachebench.backends.sqlite.ShardedSQLiteCache",
                       "LOCATION": location, "OPTIONS": {"MAX_ENTRIES": None}},
            "tiered": {"BACKEND": "djcachebench.backends.tiered.TieredCache",
                       "OPTIONS": {"L2": "sqlite", "L1_MAX_ENTRIES": l1, **(options or {})}},
        })
        django.setup()
    from django.core.cache import caches

    return caches


def _worker(location: str, alias: str, seed: int, args: Any, barrier: Any, out: Any) -> None:
    caches = _setup(location, args.l1)
    cache = caches[alias]
    ops = _ops(seed, args.keys, args.zipf, args.ops)
    value = b"v" * 100
    ideal: OrderedDict[str, None] = OrderedDict()
    ideal_hits = gets = 0
    get_cpu = answerable_cpu = 0  # ns of this thread's CPU in gets; in gets an ideal L1 answers
    set_cpu = delete_cpu = 0
    cpu = time.thread_time_ns
    barrier.wait(120)
    started = time.perf_counter()
    loop_cpu = cpu()
    for action, key in ops:
        if action == 0:
            gets += 1
            answerable = key in ideal
            before = cpu()
            cache.get(key)
            spent = cpu() - before
            get_cpu += spent
            if answerable:
                answerable_cpu += spent
                ideal_hits += 1
                ideal.move_to_end(key)
            else:
                ideal[key] = None
        elif action == 1:
            before = cpu()
            cache.set(key, value, 3600)
            set_cpu += cpu() - before
            ideal[key] = None
            ideal.move_to_end(key)
        else:
            before = cpu()
            cache.delete(key)
            delete_cpu += cpu() - before
            ideal[key] = None  # an ideal L1 knows the key is absent
        while len(ideal) > args.l1:
            ideal.popitem(last=False)
    elapsed = time.perf_counter() - started
    loop_cpu = cpu() - loop_cpu
    stats = cache.stats() if alias == "tiered" else {}
    # A value-board answer is counted in l1_hits or l1_misses already.
    answered = stats.get("l1_hits", 0) + stats.get("l1_misses", 0)
    store = cache.l2 if alias == "tiered" else cache
    waits = store.stats()["lock_waits"]
    out.put((elapsed, gets, answered, ideal_hits, waits, loop_cpu / 1e9, get_cpu / 1e9,
             answerable_cpu / 1e9, set_cpu / 1e9, delete_cpu / 1e9))


def _run(location: str, alias: str, args: Any) -> tuple[float, ...]:
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(args.procs), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(location, alias, 1000 + i, args, barrier, out))
             for i in range(args.procs)]
    for p in procs:
        p.start()
    results = [out.get(timeout=3600) for _ in procs]
    for p in procs:
        p.join(60)
    return (max(r[0] for r in results), sum(r[1] for r in results),
            sum(r[2] for r in results), sum(r[3] for r in results),
            sum(r[4] for r in results), sum(r[5] for r in results),
            sum(r[6] for r in results), sum(r[7] for r in results),
            sum(r[8] for r in results), sum(r[9] for r in results))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--ops", type=int, default=20_000)
    parser.add_argument("--zipf", type=float, default=1.0)
    parser.add_argument("--l1", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=2, help="sqlite/tiered pairs (ABAB)")
    args = parser.parse_args()
    location = tempfile.mkdtemp(prefix="l1-share-")
    caches = _setup(location, args.l1)
    batch = 5_000
    for start in range(0, args.keys, batch):
        caches["sqlite"].set_many({f"key-{i}": b"v" * 100
                                   for i in range(start, min(start + batch, args.keys))}, 3600)
    print(f"keys {args.keys:,}  zipf {args.zipf}  procs {args.procs}  ops/proc {args.ops:,}  "
          f"L1 {args.l1:,}")
    # ABAB: the store is shared, so whichever runs first pays for a cold page
    # cache and for checkpointing the pre-fill's WAL; alternate and report each pair.
    for round_ in range(args.rounds):
        sqlite = _run(location, "sqlite", args)
        tiered = _run(location, "tiered", args)
        print(f"round {round_ + 1}: gets {tiered[1]:,}: answered by the L1 "
              f"{tiered[2] / tiered[1]:.1%}, by an ideal L1 {tiered[3] / tiered[1]:.1%} "
              f"(ratio {tiered[2] / max(tiered[3], 1):.2f}); wall: tiered {tiered[0]:.2f} s, "
              f"sqlite {sqlite[0]:.2f} s (tiered throughput {sqlite[0] / tiered[0]:.2f}x "
              f"sqlite's); writes that waited for a shard's lock: tiered {tiered[4]:,}, "
              f"sqlite {sqlite[4]:,}; CPU seconds of the workers' loops: tiered "
              f"{tiered[5]:.1f}, sqlite {sqlite[5]:.1f}")
        # The ceiling: sqlite's run with every get an ideal L1 answers made free
        # and nothing else dearer. On cores the workers keep busy, throughput
        # goes as 1 / CPU, so no L1 of this size can beat it.
        ceiling = sqlite[5] / max(sqlite[5] - sqlite[7], 1e-9)
        print(f"  sqlite's gets: {sqlite[6] / sqlite[5]:.0%} of its CPU, those an ideal L1 "
              f"answers {sqlite[7] / sqlite[5]:.0%}: ceiling of an L1 whose hits cost "
              f"nothing {ceiling:.2f}x sqlite's throughput; tiered by CPU "
              f"{sqlite[5] / tiered[5]:.2f}x")
        for name, run in (("sqlite", sqlite), ("tiered", tiered)):
            print(f"  {name} CPU seconds: gets {run[6]:.2f}, sets {run[8]:.2f}, deletes "
                  f"{run[9]:.2f}, the rest of the loop {run[5] - run[6] - run[8] - run[9]:.2f}")


if __name__ == "__main__":
    main()
