"""What TieredCache's own work costs, measured against ShardedSQLiteCache at the same moment.

Usage: .venv/bin/python bench/l1_ab.py [--keys 100000] [--zipf 0] [--per 4] [--ops 20000]
                                       [--l1 10000] [--rounds 3] [--options JSON]

Why another instrument: ``bench/l1_share.py`` runs sqlite, then tiered, and
compares their wall times. On a shared 2-core machine two runs of the *same*
configuration one after the other differ by up to 30%, so a few percent of
adapter cost cannot be seen there. Here ``--per`` ShardedSQLiteCache workers and
``--per`` TieredCache workers (over the same store) run *at the same time*,
interleaved, so both see the same machine: the same other tenants, the same
writers, the same page cache. Each worker times the CPU of each operation
(``thread_time``: time spent waiting for a core is not counted) and the report
gives, per round, the CPU per get, set and delete of each kind of worker and
the ratio of the workers' total CPU, sqlite's over tiered's: above 1, the L1
saves more than it costs. On cores the workers keep busy, throughput goes as
1 / CPU, so this ratio is what the throughput ratio of ``l1_share.py`` would be
without the noise.

With ``--ideal``, ``--per`` more sqlite workers skip every get that an ideal
L1 of ``--l1`` entries would answer (``l1_share.py``'s: an LRU per process,
never invalidated) and count it as free: sqlite's CPU over theirs is the
ceiling of any L1 of that size, measured at the same moment. It includes what
``l1_share.py``'s ceiling cannot: a worker that reads the store less often
finds SQLite's page cache colder (SQLite drops a connection's cache whenever
another connection has written since its last read).

One bias, against TieredCache: the sqlite workers write the same keys without
publishing their values on TieredCache's value board, so a tiered worker whose
entry they invalidated must read the L2 where, among tiered workers only, the
board would often have answered (in a 100,000-key Zipf run, 13% of a tiered
worker's gets were such refills).

The op mix is ``l1_share.py``'s (90% get, 9% set, 1% delete of 100-byte values,
Zipf or uniform keys); worker *i* of every kind runs the same op list.
``--options`` adds TieredCache OPTIONS (e.g. ``'{"SHARED_VALUE_BYTES": 0}'``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
from collections import OrderedDict
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import l1_share  # the op lists and settings of the sibling script

COUNTERS = ("l1_hits", "l2_hits", "l1_bypassed", "l1_kept_out", "l1_entries")


def _worker(location: str, kind: str, seed: int, args: Any, barrier: Any, out: Any) -> None:
    caches = l1_share._setup(location, args.l1, json.loads(args.options))
    cache = caches["tiered" if kind == "tiered" else "sqlite"]
    ops = l1_share._ops(seed, args.keys, args.zipf, args.ops)
    value = b"v" * 100
    cpu = time.thread_time_ns
    spent = [0, 0, 0]  # ns of CPU in gets, sets, deletes
    count = [0, 0, 0]
    # The "ideal" worker is sqlite that skips every get an ideal L1 of --l1
    # entries (l1_share.py's: per process, never invalidated) would answer.
    ideal: OrderedDict[str, None] | None = OrderedDict() if kind == "ideal" else None
    cache.get("warm-up")  # connections, the tiered table mapped
    barrier.wait(120)
    for action, key in ops:
        if ideal is not None:
            if action == 0 and key in ideal:
                ideal.move_to_end(key)
                count[0] += 1
                continue  # answered for free
            ideal[key] = None
            ideal.move_to_end(key)
            if len(ideal) > args.l1:
                ideal.popitem(last=False)
        before = cpu()
        if action == 0:
            cache.get(key)
        elif action == 1:
            cache.set(key, value, 3600)
        else:
            cache.delete(key)
        spent[action] += cpu() - before
        count[action] += 1
    stats = cache.stats() if kind == "tiered" else {}
    out.put((kind, spent, count, {name: stats.get(name, 0) for name in COUNTERS}))


def _round(location: str, args: Any, round_: int) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    kinds = ("sqlite", "tiered", "ideal") if args.ideal else ("sqlite", "tiered")
    barrier, out = ctx.Barrier(len(kinds) * args.per), ctx.Queue()
    procs = []
    for i in range(args.per):
        for kind in kinds:  # interleaved start order; each kind gets the same op lists
            seed = 1000 + 100 * round_ + i
            procs.append(ctx.Process(target=_worker,
                                     args=(location, kind, seed, args, barrier, out)))
    for proc in procs:
        proc.start()
    results = [out.get(timeout=1800) for _ in procs]
    for proc in procs:
        proc.join(60)
    totals: dict[str, Any] = {}
    for alias, spent, count, counters in results:
        total = totals.setdefault(alias, {"spent": [0, 0, 0], "count": [0, 0, 0],
                                          "counters": dict.fromkeys(COUNTERS, 0)})
        for i in range(3):
            total["spent"][i] += spent[i]
            total["count"][i] += count[i]
        for name, value in counters.items():
            total["counters"][name] += value
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--zipf", type=float, default=0.0)
    parser.add_argument("--per", type=int, default=4, help="workers of each kind")
    parser.add_argument("--ops", type=int, default=20_000, help="operations per worker")
    parser.add_argument("--l1", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--options", default="{}", help="more TieredCache OPTIONS, as JSON")
    parser.add_argument("--ideal", action="store_true",
                        help="also --per sqlite workers that skip every get an ideal L1 "
                             "answers: the ceiling, measured at the same moment")
    args = parser.parse_args()
    location = tempfile.mkdtemp(prefix="l1-ab-")
    caches = l1_share._setup(location, args.l1, json.loads(args.options))
    batch = 5_000
    for start in range(0, args.keys, batch):
        caches["sqlite"].set_many({f"key-{i}": b"v" * 100
                                   for i in range(start, min(start + batch, args.keys))}, 3600)
    kinds = "sqlite, tiered" + (", ideal" if args.ideal else "")
    print(f"keys {args.keys:,}  zipf {args.zipf}  {args.per} workers each of {kinds} at once  "
          f"ops/worker {args.ops:,}  L1 {args.l1:,}  options {args.options}")
    ratios: list[float] = []
    ceilings: list[float] = []
    for round_ in range(args.rounds):
        totals = _round(location, args, round_)
        parts = []
        for alias in ("sqlite", "tiered"):
            spent, count = totals[alias]["spent"], totals[alias]["count"]
            per = [spent[i] / max(count[i], 1) / 1e3 for i in range(3)]
            parts.append(f"{alias} get {per[0]:.1f} set {per[1]:.1f} delete {per[2]:.1f} µs")
        ratio = sum(totals["sqlite"]["spent"]) / max(sum(totals["tiered"]["spent"]), 1)
        ratios.append(ratio)
        if args.ideal:
            ceiling = sum(totals["sqlite"]["spent"]) / max(sum(totals["ideal"]["spent"]), 1)
            ceilings.append(ceiling)
            parts.append(f"ideal L1 (free hits) CPU sqlite / ideal {ceiling:.2f}")
        counters = totals["tiered"]["counters"]
        gets = totals["tiered"]["count"][0]
        print(f"round {round_ + 1}: {'; '.join(parts)}; CPU sqlite / tiered {ratio:.2f}; "
              f"L1 answered {counters['l1_hits'] / max(gets, 1):.1%}, misses kept out "
              f"{counters['l1_bypassed'] + counters['l1_kept_out']:,}, "
              f"L1 entries {counters['l1_entries']:,}", flush=True)
    print("CPU sqlite / tiered per round: " + ", ".join(f"{r:.2f}" for r in ratios))
    if ceilings:
        print("CPU sqlite / ideal per round (the ceiling): "
              + ", ".join(f"{r:.2f}" for r in ceilings))


if __name__ == "__main__":
    main()
