"""``djcachebench sweep``: one parameter varied over a list, every target at each value.

A single run answers "which backend is faster here"; a user deciding on a
cache also asks "how does it scale": with more worker processes, more keys,
larger values. ``--vary procs=1,2,4,8`` runs the scenario once per value (each
point a complete :class:`~djcachebench.bench.results.Results`, with
``--repeat`` interleaving the targets within it), keeps the loopback servers
of the whole sweep in one pool, and draws ``sweep.png``: throughput, p50 and
p99 of one action against the parameter, one line per backend.

Parameters: ``procs`` (worker processes), ``threads`` (threads per process
calling the sync methods), ``tasks`` (asyncio tasks per process awaiting the
``a*`` methods), ``keys`` (distinct keys; ``100k`` accepted), ``value_size``
(a fixed value size in bytes; ``10k``, ``64KiB``). ``--ops`` stays per
process at every point, shared by its threads or tasks (lanes.py), so every
point of a threads or tasks sweep runs the same total; in CPython a process's
threads take turns on one interpreter lock, which is part of what such a
sweep shows.

``sweep.json`` (same schema family as ``results.json``)::

    schema_version, kind: "sweep", created, command, parameter, values [..],
    action, points [{value, results: <a results.json document>}]

:meth:`Sweep.load` reads it back into the same objects (a test round-trips it),
and ``sweep.png`` / ``sweep.md`` are drawn from the file only.
"""

from __future__ import annotations

import argparse
import signal
from pathlib import Path
from typing import Any

from djcachebench.bench.argtypes import (
    names,
    non_negative_int,
    positive_int,
    positive_seconds,
    prepare_out_dir,
    process_count,
    size_range,
)
from djcachebench.bench.concurrency import callers, describe_concurrency
from djcachebench.bench.report import (
    describe_entry_limits,
    miss_rate,
    silent_failures,
    status,
)
from djcachebench.bench.results import (
    Results,
)
from djcachebench.bench.stats import format_ns
from djcachebench.bench.sweep_results import Sweep
from djcachebench.bench.values import SizeError, parse_size
from djcachebench.bench.workload import ACTIONS, Scenario, ScenarioError

HELP = "vary one parameter (procs, threads, tasks, keys, value_size) and chart them"
PARAMETERS = ("procs", "threads", "tasks", "keys", "value_size")


def parse_vary(text: str) -> tuple[str, list[int]]:
    """``procs=1,2,4`` -> ("procs", [1, 2, 4]); sizes accept ``10k`` and ``64KiB``."""
    name, sep, listed = text.partition("=")
    name = name.strip().replace("-", "_")
    if not sep or name not in PARAMETERS:
        raise argparse.ArgumentTypeError(
            f"--vary takes NAME=V1,V2,... with NAME one of {', '.join(PARAMETERS)}, got {text!r}"
        )
    try:
        values = [parse_size(v) for v in listed.split(",") if v.strip()]
    except SizeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if len(values) < 2:
        raise argparse.ArgumentTypeError(f"--vary needs at least two values, got {listed!r}")
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        # Two points of one value would chart as a vertical step that is only noise.
        raise argparse.ArgumentTypeError(
            f"--vary names {', '.join(f'{v:,}' for v in repeated)} more than once "
            f"(use --repeat for repeated runs), got {listed!r}"
        )
    return name, values


def point_scenario(base: Scenario, parameter: str, value: int) -> Scenario:
    """The base scenario with the swept parameter set to ``value``."""
    if parameter == "value_size":
        return base.with_value_size(value, value)
    return base.with_overrides(**{parameter: value})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--vary",
        type=parse_vary,
        required=True,
        metavar="NAME=V1,V2,...",
        help=f"the parameter and its values; NAME one of {', '.join(PARAMETERS)}",
    )
    parser.add_argument("--scenario", default="reference", help="scenario name or TOML path")
    parser.add_argument("--procs", type=process_count, help="worker processes when not swept")
    from djcachebench.bench.cli import add_lane_arguments

    add_lane_arguments(parser)
    parser.add_argument("--ops", type=positive_int, help="measured ops per process")
    parser.add_argument("--warmup", type=non_negative_int, help="warm-up ops per process")
    parser.add_argument("--keys", type=positive_int, help="distinct keys when not swept")
    parser.add_argument("--value-size", dest="value_size", type=size_range, metavar="N|MIN-MAX",
                        help="value sizes when not swept")  # fmt: skip
    parser.add_argument("--backends", type=names,
                        help="comma-separated target names (default: all)")  # fmt: skip
    parser.add_argument("--serializer", type=names,
                        help="comma-separated serializers (target variants)")  # fmt: skip
    parser.add_argument("--action", choices=ACTIONS, default="get", help="charted action (get)")
    parser.add_argument("--repeat", type=positive_int, default=1,
                        help="interleaved runs per point (1)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start-method", choices=("spawn", "forkserver", "fork"),
                        default="spawn")  # fmt: skip
    parser.add_argument("--timeout", type=positive_seconds, default=3600.0,
                        help="seconds per target")  # fmt: skip
    parser.add_argument("--out", type=Path, help="output folder (default under ./bench/results)")
    parser.add_argument("--no-plot", action="store_true", help="skip sweep.png")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)


def run(args: argparse.Namespace, command: list[str]) -> int:
    from djcachebench.bench.cli import default_out_dir, failed_targets, scenario_from_args
    from djcachebench.bench.progress import Progress
    from djcachebench.bench.runner import RunOptions, ServerPool, run_targets
    from djcachebench.bench.targets import load_targets, select_targets, serializer_variants

    parameter, values = args.vary
    base = scenario_from_args(args)
    if base.mix.get(args.action, 0) <= 0:
        raise ScenarioError(
            f"--action {args.action}: the {base.name} scenario's mix has no {args.action} "
            f"(its actions: {', '.join(a for a, w in base.mix.items() if w > 0)})"
        )
    targets = serializer_variants(select_targets(load_targets(), args.backends), args.serializer)
    # Every point is checked before anything is written: a point the workload
    # refuses (too many processes for the cores, say) left an empty results
    # folder behind (seen under bench/results after the test suite).
    scenarios = [point_scenario(base, parameter, value) for value in values]
    out = prepare_out_dir(args.out or default_out_dir(f"sweep-{parameter}-{base.name}"))
    progress = Progress(live=args.progress)
    pool = ServerPool()
    points: list[Results] = []
    previous = signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    try:
        for value, scenario in zip(values, scenarios, strict=True):
            progress.say(f"djcachebench sweep: {parameter}={value:,} ({scenario.name})")
            options = RunOptions(
                scenario=scenario,
                seed=args.seed,
                start_method=args.start_method,
                timeout=args.timeout,
                command=command,
                repeat=args.repeat,
            )
            points.append(run_targets(targets, options, progress, servers=pool))
    finally:
        pool.stop()
        signal.signal(signal.SIGTERM, previous)
    sweep = Sweep(parameter, values, points, action=args.action, command=command)
    path = sweep.save(out / "sweep.json")
    saved = Sweep.load(path)
    report = out / "sweep.md"
    report.write_text(render_markdown(saved))
    print(render_markdown(saved), end="")
    print(f"\nresults: {path}\nreport:  {report}")
    if not args.no_plot:
        from djcachebench.bench.plot import missing_matplotlib

        missing = missing_matplotlib()
        if missing:
            print(f"chart skipped: {missing}")
        else:
            from djcachebench.bench.sweep_plot import plot_sweep

            print(f"chart:   {plot_sweep(saved, out / 'sweep.png')}")
    failed = [name for r in saved.points for name in failed_targets(r)]
    return 1 if failed or not any(r.backends for r in saved.points) else 0


def render_markdown(sweep: Sweep) -> str:
    """A table per backend: the parameter's values down, throughput and latencies across."""
    action = sweep.action
    first, last = sweep.points[0], sweep.points[-1]
    out = [
        f"# djcachebench sweep: {sweep.parameter} over {', '.join(f'{v:,}' for v in sweep.values)}",
        "",
        f"Scenario {first.scenario['name']}; run {sweep.created} with "
        f"`{' '.join(sweep.command)}`; {first.machine.get('cpu_model')}, "
        f"{first.machine.get('usable_cpus')} usable CPU(s); "
        f"{first.run.get('repeat', 1)} run(s) per point (medians).",
        "",
        f"Concurrency at the last point: {describe_concurrency(last.run, last.machine)}. "
        f"Callers per point: {', '.join(f'{callers(r.run):,}' for r in sweep.points)}.",
        "",
    ]
    for name in sweep.backends():
        out += [f"## {name}", "", f"| {sweep.parameter} | ops/s | {action} miss | {action} p50 "
                f"| {action} p99 | Errors | Wrong | Gave up | Status |"]
        out.append("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for value, results in zip(sweep.values, sweep.points, strict=True):
            backend = next((b for b in results.backends if b.name == name), None)
            if backend is None or action not in backend.actions:
                out.append(f"| {value:,} | - | - | - | - | - | - | - | not run |")
                continue
            stats = backend.actions[action]
            errors = sum(s.errors for s in backend.actions.values())
            wrong = sum(s.wrong for s in backend.actions.values())
            out.append(f"| {value:,} | {backend.ops_per_s:,.0f} | {miss_rate(stats)} | "
                       f"{format_ns(stats.p50)} | {format_ns(stats.p99)} | {errors:,} | "
                       f"{wrong:,} | {silent_failures(backend)} | {status(backend)} |")
        out.append("")
    out += [f"Miss: gets that found no value, of the {action}s that returned; a capped cache "
            f"misses more as the keys outgrow it, and a miss is usually cheaper than a hit. "
            f"Entry limits: {describe_entry_limits(first)}. Errors and Wrong: totals over "
            f"a point's runs; Gave up and Status as in report.md's Summary "
            f"(docs/benchmarks.md).", ""]
    skipped = {(s.name, s.status, s.reason) for r in sweep.points for s in r.skipped}
    skipped |= {(b.name, "failed", f"at {value:,}: " + "; ".join(b.failures))
                for value, r in zip(sweep.values, sweep.points, strict=True)
                for b in r.backends if b.failures}  # fmt: skip
    if skipped:
        out += ["## Skipped or failed", ""]
        out += [f"- **{n}** ({st}): {reason}" for n, st, reason in sorted(skipped)] + [""]
    warnings = dict.fromkeys(w for r in sweep.points for w in r.warnings)
    out += [f"> **Warning:** {w}" for w in warnings]
    return "\n".join(out).rstrip() + "\n"


def _terminate_as_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
