"""Strict writes across hosts (OPTIONS["STRICT_LEASE"]): what a write pays.

Checked across simulated hosts by ``bench/cluster_stress.py check --strict-lease 1
--bound 0``. Here, ``cost``: one process writes the same keys through django's
RedisCache, TieredCache with ``COHERENCE="cluster"`` and TieredCache with strict
writes, interleaved in rounds (ABAB), while ``--others`` other hosts (one process
each, holding leases) apply and acknowledge. The two TieredCaches' own hosts have
their subscriber in this process.

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

    from tests.cluster.workers import SECRET_KEY

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

    from tests.cluster.workers import SECRET_KEY

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
    co = sub.add_parser("cost")
    co.add_argument("--others", type=int, default=1)
    co.add_argument("--lease", type=float, default=1.0)
    co.add_argument("--calls", type=int, default=3000)
    co.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    return cost(args)


if __name__ == "__main__":
    sys.exit(main())
