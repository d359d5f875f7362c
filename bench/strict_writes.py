"""Strict writes across hosts (OPTIONS["STRICT_LEASE"]): checked and measured.

``check``: simulated hosts (each a generation-table directory of its own, 2+
processes with warm L1s) share one redis-server on loopback; writers and readers
on every host; every read is checked against the acknowledged writes with a
bound of 0 (``tests/cluster_workers.py``). Exit 1 on any violation or too few reads.

``cost``: one process writes the same keys through django's RedisCache, TieredCache
with ``COHERENCE="cluster"`` and TieredCache with strict writes, interleaved in
rounds (ABAB), while ``--others`` other hosts (one process each, holding leases)
apply and acknowledge. The two TieredCaches' own hosts have their subscriber in
this process.

    python bench/strict_writes.py check --seconds 40
    python bench/strict_writes.py cost --others 1
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from djcachebench.bench.servers import RedisServer
from djcachebench.bench.stats import percentile


def check(args: argparse.Namespace) -> int:
    from tests.cluster_workers import run_hosts

    with RedisServer() as server, tempfile.TemporaryDirectory() as tmp:
        results, _ = run_hosts(tmp, [server.location] * args.hosts, procs=args.procs,
                               nkeys=args.keys, duration=args.seconds, bound=0.0,
                               strict_lease=args.lease)
    reads = sum(r["reads"] for r in results)
    writes = sum(r["writes"] for r in results)
    violations = [v for r in results for v in r["violations"]]
    l1 = sum(r["stats"]["l1_hits"] for r in results)
    strict = sum(r["cluster"]["strict_writes"] for r in results)
    unconfirmed = sum(r["cluster"]["strict_unconfirmed"] for r in results)
    wait = sum(r["cluster"]["strict_wait_ms_mean"] * r["cluster"]["strict_writes"]
               for r in results) / max(strict, 1)
    print(f"hosts {args.hosts} x {args.procs} processes, {args.seconds:g} s, strict lease "
          f"{args.lease:g} s, bound 0")
    print(f"reads checked {reads}, writes {writes} ({strict} strict, {unconfirmed} "
          f"unconfirmed), served from L1 {l1 / max(reads, 1):.1%}")
    print(f"older than a write acknowledged before the read started: {len(violations)}")
    print(f"strict wait (publish to the last host's ack) mean {wait:.2f} ms")
    for v in violations[:10]:
        print("  ", v)
    return 1 if violations or reads < args.min_reads else 0


def _l2(location: str) -> dict[str, Any]:
    return {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": location}


def _tiered(location: str, directory: str, **options: Any) -> dict[str, Any]:
    return {"BACKEND": "djcachebench.backends.tiered.TieredCache",
            "OPTIONS": {"L2": _l2(location), "COHERENCE": "cluster",
                        "GENERATION_PATH": os.path.join(directory, "g.mmap"), **options}}


def _other_host(location: str, directory: str, lease: float, ready: Any, leave: Any) -> None:
    """Another host of one process: it subscribes, holds its lease and acks (spawned)."""
    import django
    from django.conf import settings

    from tests.cluster_workers import SECRET_KEY

    settings.configure(SECRET_KEY=SECRET_KEY, USE_TZ=True, CACHES={
        "default": _tiered(location, directory, STRICT_LEASE=lease)})
    django.setup()
    from django.core.cache import cache

    while not cache.stats()["cluster_host_fresh"]:
        time.sleep(0.01)
    ready.set()
    leave.wait(3600)


def cost(args: argparse.Namespace) -> int:
    import django
    from django.conf import settings

    from tests.cluster_workers import SECRET_KEY

    spawn = multiprocessing.get_context("spawn")
    with RedisServer() as server, tempfile.TemporaryDirectory() as tmp:
        leave = spawn.Event()
        others = []
        for i in range(args.others):
            ready = spawn.Event()
            p = spawn.Process(target=_other_host, daemon=True, args=(
                server.location, os.path.join(tmp, f"other{i}"), args.lease, ready, leave))
            p.start()
            others.append(p)
            if not ready.wait(60):
                raise SystemExit("another host did not start")
        settings.configure(SECRET_KEY=SECRET_KEY, USE_TZ=True, CACHES={
            "default": _l2(server.location),
            "cluster": _tiered(server.location, os.path.join(tmp, "cluster")),
            "strict": _tiered(server.location, os.path.join(tmp, "strict"),
                              STRICT_LEASE=args.lease)})
        django.setup()
        from django.core.cache import caches

        redis, cluster, strict = caches["default"], caches["cluster"], caches["strict"]
        for cache in (cluster, strict):
            while not cache.stats()["cluster_host_fresh"]:
                time.sleep(0.01)
        value = os.urandom(200)
        calls = [("redis set", redis), ("tiered cluster set", cluster),
                 ("tiered strict set", strict)]
        wall: dict[str, list[int]] = {name: [] for name, _ in calls}
        per_round = max(1, args.calls // args.rounds)
        for _ in range(args.rounds):  # ABAB: the load moves, every variant sees it
            for name, cache in calls:
                xs = wall[name]
                for i in range(per_round):
                    t = time.perf_counter_ns()
                    cache.set(f"k{i % 500}", value)
                    xs.append(time.perf_counter_ns() - t)
        base = percentile(sorted(wall["redis set"]), 50)
        print(f"other hosts holding leases: {args.others}; lease {args.lease:g} s; "
              f"{per_round * args.rounds} sets each")
        for name, _ in calls:
            xs = sorted(wall[name])
            p50 = percentile(xs, 50)
            print(f"{name:20s} p50 {p50 / 1000:8.1f} us ({p50 / base:.2f}x redis)   "
                  f"p90 {percentile(xs, 90) / 1000:8.1f} us   "
                  f"p99 {percentile(xs, 99) / 1000:8.1f} us")
        st = strict.stats()
        print(f"strict: {st['cluster_strict_writes']} writes confirmed, hosts acked "
              f"{st['cluster_strict_hosts_acked']}, excluded "
              f"{st['cluster_strict_hosts_excluded']}, unconfirmed "
              f"{st['cluster_strict_unconfirmed']}, wait mean "
              f"{st['cluster_strict_wait_ms_mean']:.3f} ms")
        leave.set()
        for p in others:
            p.join(5)
            if p.is_alive():
                p.kill()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check")
    c.add_argument("--seconds", type=float, default=40.0)
    c.add_argument("--hosts", type=int, default=3)
    c.add_argument("--procs", type=int, default=2)
    c.add_argument("--keys", type=int, default=48)
    c.add_argument("--lease", type=float, default=1.0)
    c.add_argument("--min-reads", type=int, default=100_000)
    co = sub.add_parser("cost")
    co.add_argument("--others", type=int, default=1)
    co.add_argument("--lease", type=float, default=1.0)
    co.add_argument("--calls", type=int, default=3000)
    co.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    return {"check": check, "cost": cost}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
