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

The op mix is ``l1_share.py``'s (90% get, 9% set, 1% delete of 100-byte values,
Zipf or uniform keys); each worker has its own seed. ``--options`` adds
TieredCache OPTIONS (e.g. ``'{"SHARED_VALUE_BYTES": 0}'``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import l1_share  # the op lists and settings of the sibling script

COUNTERS = ("l1_hits", "l2_hits", "l1_bypassed", "l1_kept_out", "l1_entries")


def _worker(location: str, alias: str, seed: int, args: Any, barrier: Any, out: Any) -> None:
    caches = l1_share._setup(location, args.l1, json.loads(args.options))
    cache = caches[alias]
    ops = l1_share._ops(seed, args.keys, args.zipf, args.ops)
    value = b"v" * 100
    cpu = time.thread_time_ns
    spent = [0, 0, 0]  # ns of CPU in gets, sets, deletes
    count = [0, 0, 0]
    cache.get("warm-up")  # connections, the tiered table mapped
    barrier.wait(120)
    for action, key in ops:
        before = cpu()
        if action == 0:
            cache.get(key)
        elif action == 1:
            cache.set(key, value, 3600)
        else:
            cache.delete(key)
        spent[action] += cpu() - before
        count[action] += 1
    stats = cache.stats() if alias == "tiered" else {}
    out.put((alias, spent, count, {name: stats.get(name, 0) for name in COUNTERS}))


def _round(location: str, args: Any, round_: int) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(2 * args.per), ctx.Queue()
    procs = []
    for _ in range(args.per):
        for alias in ("sqlite", "tiered"):  # interleaved start order
            seed = 1000 + 100 * round_ + len(procs)
            procs.append(ctx.Process(target=_worker,
                                     args=(location, alias, seed, args, barrier, out)))
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
    args = parser.parse_args()
    location = tempfile.mkdtemp(prefix="l1-ab-")
    caches = l1_share._setup(location, args.l1, json.loads(args.options))
    batch = 5_000
    for start in range(0, args.keys, batch):
        caches["sqlite"].set_many({f"key-{i}": b"v" * 100
                                   for i in range(start, min(start + batch, args.keys))}, 3600)
    print(f"keys {args.keys:,}  zipf {args.zipf}  {args.per} sqlite + {args.per} tiered "
          f"workers at once  ops/worker {args.ops:,}  L1 {args.l1:,}  options {args.options}")
    ratios = []
    for round_ in range(args.rounds):
        totals = _round(location, args, round_)
        parts = []
        for alias in ("sqlite", "tiered"):
            spent, count = totals[alias]["spent"], totals[alias]["count"]
            per = [spent[i] / max(count[i], 1) / 1e3 for i in range(3)]
            parts.append(f"{alias} get {per[0]:.1f} set {per[1]:.1f} delete {per[2]:.1f} µs")
        ratio = sum(totals["sqlite"]["spent"]) / max(sum(totals["tiered"]["spent"]), 1)
        ratios.append(ratio)
        counters = totals["tiered"]["counters"]
        gets = totals["tiered"]["count"][0]
        print(f"round {round_ + 1}: {'; '.join(parts)}; CPU sqlite / tiered {ratio:.2f}; "
              f"L1 answered {counters['l1_hits'] / max(gets, 1):.1%}, misses kept out "
              f"{counters['l1_bypassed'] + counters['l1_kept_out']:,}, "
              f"L1 entries {counters['l1_entries']:,}", flush=True)
    print("CPU sqlite / tiered per round: " + ", ".join(f"{r:.2f}" for r in ratios))


if __name__ == "__main__":
    main()
