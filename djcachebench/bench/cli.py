"""The ``djcachebench`` command: ``bench``, ``plot``, ``list``.

``djcachebench bench`` runs the scenario against every target (or those
named with ``--backends``), writes ``results.json`` into the output folder,
then reads that file back to draw the charts and write ``report.md``, and
prints the tables. Exit status: 0 when every selected target ran or was
skipped for a missing dependency; 1 when one failed while running or none
ran; 2 for a usage error; 130 on Ctrl-C and 143 on SIGTERM (servers and
workers are stopped; ``bench`` first writes results.json, report.md and the
charts of the targets that finished).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from djcachebench import __version__
from djcachebench.bench.argtypes import (
    OutDirError,
    budget_seconds,
    names,
    non_negative_int,
    positive_int,
    positive_seconds,
    prepare_out_dir,
    process_count,
    safe_component,
    size_range,
    thread_count,
)
from djcachebench.bench.budget import describe_estimate
from djcachebench.bench.paths import DataNotFound, default_results_dir
from djcachebench.bench.progress import Progress
from djcachebench.bench.report import render_text, write_report
from djcachebench.bench.results import Results, ResultsError
from djcachebench.bench.runner import RunInterrupted, RunOptions, run_targets
from djcachebench.bench.signals import (
    deferred_signals,
    interrupt_noted,
    seen_through,
    signal_of,
    terminate_as_interrupt,
)
from djcachebench.bench.targets import (
    TargetError,
    load_targets,
    select_targets,
    serializer_variants,
)
from djcachebench.bench.workload import Scenario, ScenarioError, load_scenario, scenario_names


def scenario_from_args(args: argparse.Namespace) -> Scenario:
    """The named scenario with the command line's overrides applied."""
    scenario = load_scenario(args.scenario).with_overrides(
        procs=args.procs, ops=args.ops, warmup=args.warmup, keys=args.keys,
        threads=getattr(args, "threads", None), tasks=getattr(args, "tasks", None),
    )
    if args.value_size:
        scenario = scenario.with_value_size(*args.value_size)
    return scenario


def add_lane_arguments(parser: argparse.ArgumentParser) -> None:
    """``--threads`` and ``--tasks``: callers inside each worker process (lanes.py)."""
    parser.add_argument(
        "--threads", type=thread_count, metavar="N",
        help="threads per worker process calling get/set (a gunicorn gthread worker); "
        "each its own op stream and backend instance (default 1)",
    )
    parser.add_argument(
        "--tasks", type=thread_count, metavar="N",
        help="asyncio tasks per worker process awaiting aget/aset (an ASGI worker); "
        "default: none, sync calls",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="djcachebench", description="Multiprocess benchmark of Django cache backends."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    bench = sub.add_parser("bench", help="run the benchmark and write results, report, charts")
    bench.add_argument("--procs", type=process_count, help="worker processes (scenario's: 8)")
    add_lane_arguments(bench)
    bench.add_argument(
        "--ops", type=positive_int,
        help="measured ops per process, shared by its threads or tasks (scenario's: 100,000)",
    )
    bench.add_argument(
        "--warmup", type=non_negative_int, help="warm-up ops per process, not counted (1,000)"
    )
    bench.add_argument("--keys", type=positive_int, help="distinct keys (scenario's: 1,100)")
    bench.add_argument(
        "--value-size",
        type=size_range,
        metavar="N|MIN-MAX",
        help="value sizes: N bytes (fixed) or MIN-MAX (e.g. 10k, 1k-64KiB, 100k-10M)",
    )
    bench.add_argument(
        "--backends",
        type=names,
        action="extend",
        metavar="NAMES",
        help="comma-separated target names (default: all; see `djcachebench list`)",
    )
    bench.add_argument(
        "--serializer",
        type=names,
        metavar="NAMES",
        help="run each target once per serializer: pickle, msgpack or a dotted path "
        "(targets named like sqlite[msgpack]; a backend without the option is skipped)",
    )
    bench.add_argument(
        "--scenario",
        default="reference",
        help="scenario name (see `djcachebench list`) or a TOML path (default: reference)",
    )
    bench.add_argument(
        "--out", type=Path, help="output folder (default: bench/results/DATE-SCENARIO)"
    )
    bench.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    bench.add_argument(
        "--repeat",
        type=positive_int,
        default=1,
        metavar="N",
        help="run the targets N times, interleaved; report each figure's median and "
        "confidence interval over the runs (default 1; 6 or more for a 95%% interval)",
    )
    bench.add_argument(
        "--start-method",
        choices=("spawn", "forkserver", "fork"),
        default="spawn",
        help="how worker processes are started (default spawn)",
    )
    bench.add_argument(
        "--timeout",
        type=positive_seconds,
        default=3600.0,
        help="seconds per target before it fails (3600)",
    )
    bench.add_argument(
        "--budget",
        type=budget_seconds,
        default=None,
        metavar="SECONDS|none",
        help="seconds of ops per target: a short calibration sizes each target's op "
        "count to fit, never above the scenario's (default none: the scenario's counts; "
        "bench/run.sh passes 25)",
    )
    bench.add_argument("--no-plot", action="store_true", help="skip the PNG charts")
    bench.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="live progress line (default: when stderr is a terminal)",
    )

    plot = sub.add_parser("plot", help="re-draw the charts (and report.md) from a results.json")
    plot.add_argument("results", type=Path, metavar="RESULTS.json")
    plot.add_argument("--out", type=Path, help="folder for the PNGs (default: beside the file)")

    sub.add_parser("list", help="list the targets and whether each can run here")
    for name, module in _command_modules().items():
        module.add_arguments(sub.add_parser(name, help=module.HELP))
    return parser


#: Commands that live in their own module: ``HELP``, ``add_arguments(parser)`` and
#: ``run(args, command) -> exit status``. Kept apart so that each command's options
#: and code stay beside the engine they drive.
COMMAND_MODULES = {
    "sweep": "djcachebench.bench.sweep",
    "http": "djcachebench.bench.http.command",
    "serializers": "djcachebench.bench.serializer_report",
    "stampede": "djcachebench.bench.stampede.command",
    "breakdown": "djcachebench.bench.breakdown",
}


def _command_modules() -> dict[str, Any]:
    found = {}
    for name, dotted in COMMAND_MODULES.items():
        try:
            found[name] = importlib.import_module(dotted)
        except ModuleNotFoundError as exc:
            # Not built in this tree; a missing dependency of a present module is a bug.
            if not (exc.name and (dotted + ".").startswith(exc.name + ".")):
                raise
    return found


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(args_list)
    try:
        if args.command == "bench":
            return cmd_bench(args, ["djcachebench", *args_list])
        if args.command == "plot":
            return cmd_plot(args)
        if args.command == "list":
            return cmd_list()
        return _command_modules()[args.command].run(args, ["djcachebench", *args_list])
    except (ScenarioError, TargetError, DataNotFound, ResultsError, OutDirError) as exc:
        print(f"djcachebench: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print("\ndjcachebench: interrupted; servers and workers stopped", file=sys.stderr)
        return 128 + signal_of(exc)


def default_out_dir(scenario_name: str) -> Path:
    """``bench/results/DATE-NAME``: one folder under the results directory, whatever
    the name holds (a scenario named ``../../x`` stays inside; argtypes.safe_component)."""
    base = default_results_dir()
    now = dt.datetime.now()
    name = safe_component(scenario_name)
    out = base / f"{now:%Y-%m-%d}-{name}"
    if out.exists():
        out = base / f"{now:%Y-%m-%d-%H%M%S}-{name}"
    return out


def cmd_bench(args: argparse.Namespace, command: list[str]) -> int:
    scenario = scenario_from_args(args)
    targets = serializer_variants(select_targets(load_targets(), args.backends), args.serializer)
    out = prepare_out_dir(args.out or default_out_dir(scenario.name))
    options = RunOptions(
        scenario=scenario,
        seed=args.seed,
        start_method=args.start_method,
        timeout=args.timeout,
        command=command,
        repeat=args.repeat,
        budget=args.budget,
    )
    progress = Progress(live=args.progress)
    runs = f", {args.repeat} runs interleaved" if args.repeat > 1 else ""
    ops = "ops sized by the budget" if args.budget else f"{scenario.ops:,} ops"
    progress.say(
        f"djcachebench: {scenario.name} scenario, {scenario.procs} processes{_lanes(scenario)} "
        f"x {ops}{runs}, targets: {', '.join(t.name for t in targets)}"
    )
    progress.say(f"djcachebench: {describe_estimate(len(targets), args.budget, args.repeat)}")
    previous = signal.signal(signal.SIGTERM, terminate_as_interrupt)
    # Ctrl-C as Python's own handler takes it, remembered; left alone where the
    # shell started this in the background with SIGINT ignored.
    previous_int = signal.getsignal(signal.SIGINT)
    if previous_int is signal.default_int_handler:
        signal.signal(signal.SIGINT, interrupt_noted)
    try:
        try:
            with progress.heartbeat():
                results = run_targets(targets, options, progress)
        except RunInterrupted as stop:
            seen_through()
            return _save_interrupted(stop, out, args.no_plot, progress)
        results_path = results.save(out / "results.json")
        charts = [] if args.no_plot else _draw(results_path, progress)
        report = write_report(results_path, [c.name for c in charts])
    finally:
        signal.signal(signal.SIGTERM, previous)
        if previous_int is signal.default_int_handler:
            signal.signal(signal.SIGINT, previous_int)
    saved = Results.load(results_path)
    print(render_text(saved), end="")
    print(f"\nresults: {results_path}")
    for chart in charts:
        print(f"chart:   {chart}")
    print(f"report:  {report}")
    return 1 if failed_targets(saved) or not saved.backends else 0


def _lanes(scenario: Scenario) -> str:
    if scenario.tasks:
        return f" x {scenario.tasks} asyncio tasks"
    return f" x {scenario.threads} threads" if scenario.threads > 1 else ""


def _save_interrupted(stop: RunInterrupted, out: Path, no_plot: bool, progress: Progress) -> int:
    """Write what finished before the interrupt; exit status 128 + the signal.

    results.json and report.md first, with the signals held (a second Ctrl-C
    must not leave half a file); then the charts, which a second signal may cut.
    """
    results = stop.results
    how = signal.Signals(stop.signum).name
    results.run["interrupted"] = how
    results.warnings.append(
        f"interrupted by {how}: only the targets that finished are reported "
        f"({len(results.backends)} of {len(results.targets)})"
    )
    with deferred_signals():
        results_path = results.save(out / "results.json")
        report = write_report(results_path)
    progress.say(f"\ndjcachebench: interrupted by {how}; servers and workers stopped; "
                 f"{len(results.backends)} finished target(s) kept in {results_path}")  # fmt: skip
    if results.backends and not no_plot:
        charts = _draw(results_path, progress)
        report = write_report(results_path, [c.name for c in charts])
    progress.say(f"report:  {report}")
    return 128 + stop.signum


def failed_targets(results: Results) -> list[str]:
    """Targets that failed: broke while running, or ran with a failure of their
    figures (every call of an action raised, or wrong values)."""
    broken = [s.name for s in results.skipped if s.status == "failed"]
    return broken + [b.name for b in results.backends if b.failures]


def cmd_plot(args: argparse.Namespace) -> int:
    charts = _draw(args.results, Progress(), args.out)
    report = write_report(args.results, [_relative(c, args.results.parent) for c in charts])
    for path in [*charts, report]:
        print(path)
    return 0


def cmd_list() -> int:
    for target in load_targets():
        reason = target.missing_module()
        needs = f" [needs {', '.join(target.servers)}]" if target.servers else ""
        state = f"unavailable: {reason}" if reason else "ok"
        print(f"{target.name:<14} {target.description}{needs}: {state}")
    print("\nscenarios (--scenario NAME):")
    for name in scenario_names():
        print(f"  {name:<14} {load_scenario(name).description}")
    return 0


def _draw(results_path: Path, progress: Progress, out: Path | None = None) -> list[Path]:
    from djcachebench.bench.plot import missing_matplotlib

    missing = missing_matplotlib()
    if missing:
        progress.say(f"charts skipped: {missing}")
        return []
    from djcachebench.bench.plot import plot_results

    return plot_results(results_path, out)


def _relative(path: Path, base: Path) -> str:
    try:
        return str(path.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(path.resolve())


if __name__ == "__main__":
    sys.exit(main())
