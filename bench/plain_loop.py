"""The harness's figures beside a plain timed loop's, target by target.

    .venv/bin/python bench/plain_loop.py [--backends a,b] [--procs 8] [--ops 20000]
        [--warmup 1000] [--rounds 3] [--scenario reference] [--json OUT]

Runs each target through ``djcachebench bench`` (one target, one run) and
through ``djcachebench.bench.plain_loop`` (the same settings, set-up and op
lists, every call timed and nothing else), interleaved per round, and prints
per target and action the median over the rounds of p50, p90 and p99 of
both, and the harness's p50 over the loop's. The test
``tests/bench/test_bench_plain_loop.py`` asserts the same at one process.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from djcachebench.bench.plain_loop import FIGURES, cross_check
from djcachebench.bench.stats import format_ns
from djcachebench.bench.targets import load_targets, select_targets
from djcachebench.bench.workload import load_scenario


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", help="comma-separated targets (default: all)")
    parser.add_argument("--scenario", default="reference")
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--ops", type=int, default=20_000)
    parser.add_argument("--warmup", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    names = args.backends.split(",") if args.backends else None
    targets = select_targets(load_targets(), names)
    scenario = load_scenario(args.scenario).with_overrides(
        procs=args.procs, ops=args.ops, warmup=args.warmup)
    checks, skipped = cross_check(targets, scenario, rounds=args.rounds)
    print(f"{scenario.name}: {args.procs} procs x {args.ops:,} ops (+{args.warmup:,} warm-up), "
          f"{args.rounds} rounds, harness and plain loop interleaved; medians over the rounds")
    head = " | ".join(f"{side} {f}" for side in ("harness", "loop") for f in FIGURES)
    print(f"| Target | Action | {head} | harness/loop p50 |")
    print("|---|---|" + "---:|" * (2 * len(FIGURES) + 1))
    out = []
    for check in checks:
        for action in ("get", "set", "delete"):
            cells = [format_ns(check.median(side, action, f))
                     for side in ("harness", "plain") for f in FIGURES]
            ratio = check.ratio(action)
            shown = "-" if ratio is None else f"{ratio:.2f}"
            print(f"| {check.target} | {action} | {' | '.join(cells)} | {shown} |")
        out.append({"target": check.target, "rounds": check.rounds})
    for name, reason in skipped.items():
        print(f"{name}: skipped: {reason}")
    if args.json:
        args.json.write_text(json.dumps({"scenario": scenario.to_dict(), "rounds": args.rounds,
                                         "checks": out, "skipped": skipped}, indent=1))


if __name__ == "__main__":
    main()
