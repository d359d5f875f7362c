"""``djcachebench breakdown``: where one get and one set of one value spend their time.

The seed L1 library reports, for a 10 KB dict, the cost of serialization,
deserialization, key generation and the L1 lookup; this command gives the
same split for our backends, measured: timers around the real functions that
do each part (breakdown_probes.py), over ``--calls`` calls of the same key
after a warm-up, in this one process. Per backend and serializer it reports
the mean microseconds of every part, ``other`` (what the call does outside
the timed parts: the Django adapter, routing, bookkeeping), the instrumented
whole call, and the same call timed without any probe, so the probes' own
cost is in plain view.

Reads repeat one key, as the seed's figures do: ShardedSQLiteCache then
finds the row in its memo of verified bytes (an exact compare instead of the
tag; codec.py), and TieredCache answers from its L1. Calls whose whole time
falls outside the 10th..90th percentile are left out of the means: on a
shared host a preempted call or a GC pause would otherwise dominate a part,
and a mean (unlike a median) keeps the parts adding up to the call.

Output: ``breakdown.json`` (the figures, with the machine) and ``breakdown.md``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from random import Random
from typing import Any

from djcachebench.bench.argtypes import names, positive_int, prepare_out_dir, size_range
from djcachebench.bench.breakdown_probes import PART_TITLES, PARTS, PartTimer, instrumented
from djcachebench.bench.results import machine_info, utc_now
from djcachebench.bench.values import api_response

HELP = "split one get and one set (a 10 KB dict) into key, serializer, tag, store"
KEY = "breakdown:value"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backends", type=names, default=["sqlite", "tiered", "redis"],
                        help="comma-separated targets (default sqlite,tiered,redis)")
    parser.add_argument("--serializer", type=names, default=["pickle", "msgpack"],
                        help="comma-separated serializers (default pickle,msgpack)")
    parser.add_argument("--value-size", type=size_range, default=(10_240, 10_240),
                        metavar="N", help="JSON bytes of the dict value (default 10k)")
    parser.add_argument("--calls", type=positive_int, default=2_000,
                        help="timed calls per action (2,000)")
    parser.add_argument("--warmup", type=positive_int, default=200, help="untimed calls first")
    parser.add_argument("--out", type=Path, help="output folder (default under ./bench/results)")


def run(args: argparse.Namespace, command: list[str]) -> int:
    from djcachebench.bench.cli import default_out_dir
    from djcachebench.bench.runner import ServerPool
    from djcachebench.bench.targets import (
        TargetEnv,
        load_targets,
        select_targets,
        serializer_variants,
    )

    targets = serializer_variants(select_targets(load_targets(), args.backends), args.serializer)
    out = prepare_out_dir(args.out or default_out_dir("breakdown"))
    value = api_response(args.value_size[1], Random(0))
    pool = ServerPool()
    workdir = Path(tempfile.mkdtemp(prefix="djcb-breakdown-"))
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    try:
        caches: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for target in targets:
            reason = target.unsupported or target.missing_module() or pool.need(target)
            if reason:
                skipped.append({"name": target.name, "reason": reason})
                continue
            env = TargetEnv(workdir / target.name.replace("[", "-").rstrip("]"),
                            pool.locations())
            settings = target.django_settings(env)
            caches[target.name] = settings.pop("CACHES")["default"]
            extra.update(settings)
        _configure(caches, extra)
        from django.core.cache import caches as django_caches

        for name in caches:
            cache = django_caches[name]
            cache.clear()
            for action in ("set", "get"):
                rows.append({"target": name, "action": action,
                             **measure(cache, action, value, args.calls, args.warmup)})
            cache.close()
    finally:
        pool.stop()
    doc = {"kind": "breakdown", "created": utc_now(), "command": command,
           "machine": machine_info(), "value": {"kind": "dict", "json_bytes": args.value_size[1]},
           "calls": args.calls, "warmup": args.warmup, "rows": rows, "skipped": skipped,
           "timer_ns": timer_cost()}
    (out / "breakdown.json").write_text(json.dumps(doc, indent=2) + "\n")
    text = render_markdown(doc)
    (out / "breakdown.md").write_text(text)
    print(text, end="")
    print(f"\nresults: {out / 'breakdown.json'}\nreport:  {out / 'breakdown.md'}")
    return 0 if rows else 1


def _configure(caches: dict[str, Any], extra: dict[str, Any]) -> None:
    import django
    from django.conf import settings

    settings.configure(CACHES=caches, SECRET_KEY="djcachebench-benchmark-not-secret",
                       USE_TZ=True, **extra)
    django.setup()


def measure(cache: Any, action: str, value: Any, calls: int, warmup: int) -> dict[str, Any]:
    """Mean ns per part of ``calls`` calls of ``action`` on one key, with and without probes."""
    call = (lambda: cache.set(KEY, value)) if action == "set" else (lambda: cache.get(KEY))
    cache.set(KEY, value)
    clock = time.perf_counter_ns
    for _ in range(warmup):
        call()
    plain = []
    for _ in range(calls):
        t0 = clock()
        call()
        plain.append(clock() - t0)
    timer = PartTimer()
    per_call: list[tuple[int, dict[str, int]]] = []
    with instrumented(cache, timer) as store:
        for _ in range(warmup):
            call()
        for _ in range(calls):
            before = timer.snapshot()
            t0 = clock()
            answer = call()
            whole = clock() - t0
            after = timer.snapshot()
            per_call.append((whole, {p: after[p] - before[p] for p in PARTS}))
    kept = _central(per_call)
    parts = {p: sum(c[1][p] for c in kept) / len(kept) for p in PARTS}
    whole = sum(c[0] for c in kept) / len(kept)
    plain_kept = _central([(t, {}) for t in plain])
    return {
        "parts_ns": parts,
        "other_ns": whole - sum(parts.values()),
        "instrumented_ns": whole,
        "plain_ns": sum(t for t, _ in plain_kept) / len(plain_kept),
        "plain_median_ns": sorted(plain)[len(plain) // 2],
        "store": store,
        "answered": action == "set" or answer == value,
    }


def _central(calls: list[tuple[int, dict[str, int]]]) -> list[tuple[int, dict[str, int]]]:
    """The calls whose whole time lies within the 10th..90th percentile."""
    times = sorted(t for t, _ in calls)
    lo, hi = times[len(times) // 10], times[min(len(times) - 1, len(times) * 9 // 10)]
    return [c for c in calls if lo <= c[0] <= hi] or calls


def timer_cost(n: int = 20_000) -> float:
    """Nanoseconds one timed part adds to a call (a wrapped no-op less a bare one)."""
    timer = PartTimer()
    wrapped = timer.wrap("key", lambda: None)
    bare = lambda: None  # noqa: E731
    clock = time.perf_counter_ns
    t0 = clock()
    for _ in range(n):
        wrapped()
    t1 = clock()
    for _ in range(n):
        bare()
    t2 = clock()
    return ((t1 - t0) - (t2 - t1)) / n


def _us(ns: float) -> str:
    return f"{ns / 1000:.2f}"


def render_markdown(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    out = [
        f"# djcachebench breakdown: a {doc['value']['json_bytes']:,}-byte dict (JSON size)",
        "",
        f"Run {doc['created']} with `{' '.join(doc['command'])}`; {m.get('cpu_model')}, "
        f"{m.get('usable_cpus')} usable CPU(s); {m.get('python')}; one process, one key, "
        f"{doc['calls']:,} timed calls per action after {doc['warmup']:,}.",
        "",
        "Mean µs per call over the calls between the 10th and 90th percentile of the whole, "
        "by part (exclusive: a timed part inside another counts once). "
        "*other*: what the call does outside the timed parts; *sum*: the instrumented call; "
        f"*plain*: the same call without probes (mean; median in brackets). Each timed part "
        f"adds about {doc['timer_ns']:.0f} ns of its own.",
        "",
        "| target | action | " + " | ".join(PART_TITLES[p] for p in PARTS)
        + " | other | sum | plain |",
        "|---|---|" + "---:|" * (len(PARTS) + 3),
    ]
    stores: dict[str, str] = {}
    for row in doc["rows"]:
        stores[row["target"]] = row["store"]
        parts = " | ".join(_us(row["parts_ns"][p]) if row["parts_ns"][p] else "-" for p in PARTS)
        flag = "" if row["answered"] else " (wrong answer!)"
        out.append(f"| {row['target']} | {row['action']}{flag} | {parts} | "
                   f"{_us(row['other_ns'])} | {_us(row['instrumented_ns'])} | "
                   f"{_us(row['plain_ns'])} ({_us(row['plain_median_ns'])}) |")
    out += ["", "*store* is, per target:", ""]
    out += [f"- **{name}**: {what}" for name, what in stores.items()]
    if doc["skipped"]:
        out += ["", "Skipped:", ""] + [f"- **{s['name']}**: {s['reason']}" for s in doc["skipped"]]
    return "\n".join(out) + "\n"
