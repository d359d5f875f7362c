"""How large the shards' ``-wal`` files get under writers and readers that never pause,
and what a set costs meanwhile; optionally against another tree in the same run.

    .venv/bin/python bench/wal_bound.py [--seconds 15] [--readers 0,1,2] [--writers 4]
        [--shards 2] [--keys 2000] [--min-value 10000] [--max-value 30000]
        [--compare OTHER_TREE] [--tree TREE] [--json OUT]

The workload: a cache of ``--shards`` shards (no ``MAX_ENTRIES``) pre-filled with
``--keys`` keys; ``--writers`` processes replace uniformly random keys with random
values of ``--min-value`` to ``--max-value`` bytes (below ``codec.LARGE_MIN``, so
they pass through the log), as fast as they can; each reader count of ``--readers``
adds that many processes that get random keys without a pause. Every 20 ms
(``--sample-ms``) the size of every ``-wal`` file is sampled; the report gives the
largest in any sample, per reader count and tree, and the set p50/p99/p99.9 (raw
samples of every writer merged, nearest rank: ``djcachebench.bench.stats``).

``--compare OTHER`` runs each reader count four times, alternated: this tree,
``OTHER``, ``OTHER``, this tree (A B B A), each phase a fresh cache directory,
so both trees see the same machine; a tree is a checkout (a git worktree or an
export of another commit) whose ``djcachebench`` package is imported through
``PYTHONPATH``. The ratios are OTHER's over this tree's.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import json
import multiprocessing
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
SECRET = "wal-bound-bench-not-secret-0123456789"
MIB = 1024 * 1024


def _cache(location: str, shards: int) -> Any:
    from django.conf import settings

    from djcachebench.backends.sqlite import ShardedSQLiteCache

    if not settings.configured:
        settings.configure(SECRET_KEY=SECRET)
    return ShardedSQLiteCache(location, {"OPTIONS": {"SHARDS": shards, "MAX_ENTRIES": None}})


def _values(seed: int, low: int, high: int, count: int = 64) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.randint(low, high)) for _ in range(count)]


def _writer(location: str, args: dict[str, Any], seed: int, barrier: Any, out: str) -> None:
    cache = _cache(location, args["shards"])
    rng = random.Random(seed)
    values = _values(seed, args["min_value"], args["max_value"])
    keys = [f"k{i}" for i in range(args["keys"])]
    cache.get("warm-up")
    times = array.array("q")
    clock = time.perf_counter_ns
    barrier.wait(120)
    ends = time.monotonic() + args["seconds"]
    while time.monotonic() < ends:
        key, value = rng.choice(keys), rng.choice(values)
        started = clock()
        cache.set(key, value, None)
        times.append(clock() - started)
    with open(out, "wb") as f:
        times.tofile(f)
    with open(out + ".stats", "w") as f:
        json.dump(cache.stats(), f)


def _reader(location: str, args: dict[str, Any], seed: int, barrier: Any) -> None:
    cache = _cache(location, args["shards"])
    rng = random.Random(seed)
    keys = [f"k{i}" for i in range(args["keys"])]
    cache.get("warm-up")
    barrier.wait(120)
    ends = time.monotonic() + args["seconds"]
    while time.monotonic() < ends:
        cache.get(rng.choice(keys))


def _wal_sizes(location: str) -> list[int]:
    sizes = []
    for name in os.listdir(location):
        if name.endswith("-wal"):
            with contextlib.suppress(OSError):
                sizes.append(os.stat(os.path.join(location, name)).st_size)
    return sizes


def run_phase(args: dict[str, Any], readers: int, out: str) -> None:
    """One phase, in this process's tree: write a JSON summary and the set samples to ``out``."""
    import djcachebench

    location = tempfile.mkdtemp(prefix="wal-bound-")
    cache = _cache(location, args["shards"])
    values = _values(0, args["min_value"], args["max_value"])
    for start in range(0, args["keys"], 200):
        cache.set_many({f"k{i}": values[i % len(values)]
                        for i in range(start, min(args["keys"], start + 200))}, None)
    cache.close_connections()
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(args["writers"] + readers + 1)
    outs = [f"{out}.w{i}" for i in range(args["writers"])]
    procs = [ctx.Process(target=_writer, args=(location, args, i + 1, barrier, outs[i]))
             for i in range(args["writers"])]
    procs += [ctx.Process(target=_reader, args=(location, args, 100 + i, barrier))
              for i in range(readers)]
    for p in procs:
        p.start()
    barrier.wait(120)
    ends = time.monotonic() + args["seconds"]
    step = args["sample_ms"] / 1000
    peak = samples = 0
    while time.monotonic() < ends:
        peak = max(peak, *_wal_sizes(location), 0)
        samples += 1
        time.sleep(step)
    for p in procs:
        p.join(120)
    if any(p.exitcode != 0 for p in procs):
        raise SystemExit(f"a worker failed: {[p.exitcode for p in procs]}")
    peak = max(peak, *_wal_sizes(location), 0)
    times = array.array("q")
    stats: dict[str, int] = {}
    for path in outs:
        with open(path, "rb") as f:
            times.frombytes(f.read())
        with open(path + ".stats") as f:
            for name, count in json.load(f).items():
                stats[name] = stats.get(name, 0) + count
        os.unlink(path)
        os.unlink(path + ".stats")
    with open(out + ".sets", "wb") as f:
        times.tofile(f)
    with open(out, "w") as f:
        json.dump({"peak_wal": peak, "samples": samples, "sets": len(times),
                   "give_ups": stats.get("give_ups", 0), "errors": stats.get("errors", 0),
                   "package": os.path.dirname(djcachebench.__file__)}, f)
    subprocess.run(["rm", "-rf", location], check=False)


def _phase_in(tree: Path, args: argparse.Namespace, readers: int, out: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])}
    settings = json.dumps({name: getattr(args, name) for name in (
        "seconds", "writers", "shards", "keys", "min_value", "max_value", "sample_ms")})
    subprocess.run([sys.executable, __file__, "--phase", settings, "--phase-readers",
                    str(readers), "--phase-out", out], env=env, check=True, cwd=str(tree))
    with open(out) as f:
        result = json.load(f)
    times = array.array("q")
    with open(out + ".sets", "rb") as f:
        times.frombytes(f.read())
    os.unlink(out + ".sets")
    result["times"] = times
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="per phase")
    parser.add_argument("--readers", default="0,1,2", help="reader counts, comma-separated")
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--keys", type=int, default=2000)
    parser.add_argument("--min-value", type=int, default=10_000)
    parser.add_argument("--max-value", type=int, default=30_000)
    parser.add_argument("--sample-ms", type=float, default=20.0)
    parser.add_argument("--tree", type=Path, default=HERE, help="tree A (default: this one)")
    parser.add_argument("--compare", type=Path, help="tree B, run alternated with A (A B B A)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    parser.add_argument("--phase-readers", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--phase-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        run_phase(json.loads(args.phase), args.phase_readers, args.phase_out)
        return

    sys.path.insert(0, str(HERE))
    from djcachebench.bench.stats import merge_samples, percentile
    from djcachebench.store.codec import LARGE_MIN

    if args.max_value >= LARGE_MIN - 64:
        parser.error(f"--max-value must stay below LARGE_MIN ({LARGE_MIN}) to pass through the log")
    trees = {"A": args.tree.resolve()}
    if args.compare:
        trees["B"] = args.compare.resolve()
    order = ["A", "B", "B", "A"] if args.compare else ["A"]
    work = tempfile.mkdtemp(prefix="wal-bound-results-")
    figures: dict[str, Any] = {"trees": {k: str(v) for k, v in trees.items()}, "rows": []}
    counts = [int(r) for r in args.readers.split(",")]
    all_times: dict[str, list[Any]] = {name: [] for name in trees}
    for readers in counts:
        by_tree: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
        for i, name in enumerate(order):
            result = _phase_in(trees[name], args, readers, os.path.join(work, f"r{readers}-{i}"))
            by_tree[name].append(result)
            print(f"  readers {readers} phase {i + 1}/{len(order)} tree {name}: largest -wal "
                  f"{result['peak_wal'] / MIB:.1f} MiB over {result['samples']} samples, "
                  f"{result['sets'] / args.seconds:,.0f} sets/s", flush=True)
        for name, results in by_tree.items():
            times = merge_samples(r["times"] for r in results)
            all_times[name].append(times)
            row = {"tree": name, "readers": readers,
                   "peak_wal_mib": max(r["peak_wal"] for r in results) / MIB,
                   "sets_per_s": sum(r["sets"] for r in results) / (args.seconds * len(results)),
                   "give_ups": sum(r["give_ups"] for r in results),
                   "errors": sum(r["errors"] for r in results),
                   **{p: percentile(times, q) / 1000 for p, q in
                      (("p50", 50), ("p99", 99), ("p99.9", 99.9))}}
            figures["rows"].append(row)
    print(f"\n{'tree':4s} {'readers':>7s} {'largest -wal':>12s} {'sets/s':>8s} "
          f"{'p50 µs':>8s} {'p99 µs':>8s} {'p99.9 µs':>9s} {'give-ups':>8s}")
    for row in figures["rows"]:
        print(f"{row['tree']:4s} {row['readers']:7d} {row['peak_wal_mib']:8.1f} MiB "
              f"{row['sets_per_s']:8,.0f} {row['p50']:8.0f} {row['p99']:8.0f} "
              f"{row['p99.9']:9.0f} {row['give_ups']:8d}")
    overall = {}
    for name, parts in all_times.items():
        times = merge_samples(parts)
        overall[name] = {p: percentile(times, q) / 1000 for p, q in
                         (("p50", 50), ("p99", 99), ("p99.9", 99.9))}
        print(f"tree {name} ({trees[name]}), every reader count: set p50 {overall[name]['p50']:.0f}"
              f" p99 {overall[name]['p99']:.0f} p99.9 {overall[name]['p99.9']:.0f} µs")
    figures["overall"] = overall
    if args.compare:
        ratios = {p: overall["B"][p] / overall["A"][p] for p in ("p50", "p99", "p99.9")}
        figures["ratios_b_over_a"] = ratios
        print("B / A, every reader count: " + ", ".join(f"{p} {r:.2f}x" for p, r in ratios.items()))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    subprocess.run(["rm", "-rf", work], check=False)


if __name__ == "__main__":
    main()
