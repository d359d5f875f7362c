"""``djcachebench stampede``: ``--procs`` x ``--threads`` callers, one absent key, per backend.

For every backend target (the same definitions and loopback servers as
``bench``), a round spawns ``--procs`` processes of ``--threads`` threads
each (see :mod:`.crowd`); every caller calls ``cache.get_or_set`` on one key
that was just deleted, at the same moment, with a computation that takes
``--compute`` seconds. Per round: how many computations ran upstream, the
wall time, each caller's latency, whether every caller got a value some
computation produced, and the same callers' latency once the value is cached.

Rows: ShardedSQLiteCache and TieredCache protect ``get_or_set`` with a lease
by default (``OPTIONS["STAMPEDE_LEASE"]``, :mod:`djcachebench.stampede`), so
their targets run twice: as configured (``sqlite``) and with the lease off
(``sqlite (unprotected)``, Django's own ``BaseCache.get_or_set``). Every
other backend runs once, with Django's. ``--repeat N`` runs every row N
times, interleaved (A B C, C B A), as ``bench --repeat`` does, so a slow
spell of a shared host lands on every row alike.

Why 25 processes x 4 threads by default: the issue's 100 callers, spread over
processes so that a per-process lock or L1 cannot hide the stampede (threads
of one process share one cache store for locmem and one L1 for TieredCache).
Spawning 25 Python processes with Django is a few seconds of start-up per
round on a 2-core machine, paid before the release and never timed.

Each round gets a fresh temp directory and emptied servers; worker processes
are stopped by their own handles and servers by PID in ``finally`` blocks.
Exit status: 0 when every row ran or was skipped for a missing dependency; 1
when one failed or none ran; 2 for a usage error.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from djcachebench.bench.argtypes import (
    positive_int,
    positive_seconds,
    prepare_out_dir,
    process_count,
    thread_count,
)
from djcachebench.bench.cli import default_out_dir
from djcachebench.bench.plot import missing_matplotlib
from djcachebench.bench.progress import Progress
from djcachebench.bench.results import machine_info, oversubscription_warning
from djcachebench.bench.runner import ServerPool
from djcachebench.bench.signals import terminate_as_interrupt
from djcachebench.bench.stampede.data import Round, Row, StampedeResults
from djcachebench.bench.stampede.report import render
from djcachebench.bench.stampede.rounds import Plan, RoundFailed, run_round
from djcachebench.bench.summary import run_order
from djcachebench.bench.targets import (
    Target,
    TargetEnv,
    backend_paths,
    load_targets,
    resolvable,
    select_targets,
)

HELP = "many processes call get_or_set on one absent key: computations, wall, client p99"
DEFAULT_BACKENDS = "locmem,sqlite,tiered,redis,memcached,diskcache"
#: The OPTIONS key that turns a backend's stampede protection on or off.
LEASE_OPTION = "STAMPEDE_LEASE"
#: Backends whose ``get_or_set`` is protected, and the option table that holds
#: the lease's default (the one place it is defined).
PROTECTING = {
    "djcachebench.backends.sqlite.ShardedSQLiteCache": "djcachebench.backends.sqlite",
    "djcachebench.backends.tiered.TieredCache": "djcachebench.tiered.options",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backends", default=DEFAULT_BACKENDS,
                        help=f"comma-separated targets (default {DEFAULT_BACKENDS})")
    parser.add_argument("--procs", type=process_count, default=25,
                        help="worker processes per round (25)")
    parser.add_argument("--threads", type=thread_count, default=4,
                        help="caller threads per process (4): procs x threads callers")
    parser.add_argument("--compute", type=positive_seconds, default=0.2, metavar="SECONDS",
                        help="how long one computation takes (0.2)")
    parser.add_argument("--repeat", type=positive_int, default=3, metavar="N",
                        help="rounds per row, interleaved across rows (3)")
    parser.add_argument("--start-method", choices=("spawn", "forkserver"), default="spawn",
                        help="how worker processes are started (default spawn)")
    parser.add_argument("--timeout", type=positive_seconds, default=600.0,
                        help="seconds per round before it fails (600)")
    parser.add_argument("--out", type=Path,
                        help="output folder (default ./bench/results/DATE-stampede)")
    parser.add_argument("--no-plot", action="store_true", help="skip stampede.png")


@dataclass(frozen=True)
class Variant:
    """A target as one row runs it: protected as configured, or with the lease off."""

    name: str
    target: Target
    protected: bool

    def settings(self, env: TargetEnv) -> dict[str, Any]:
        """The target's Django settings; the unprotected row sets the lease to None."""
        settings = self.target.django_settings(env)
        if not self.protected and _protecting(settings):
            entry = settings["CACHES"]["default"]
            settings["CACHES"]["default"] = {
                **entry, "OPTIONS": {**entry.get("OPTIONS", {}), LEASE_OPTION: None}}
        return settings

    def lease_s(self, env: TargetEnv) -> float | None:
        """The lease this row runs with (None: no protection)."""
        entry = self.settings(env)["CACHES"]["default"]
        module = PROTECTING.get(str(entry.get("BACKEND")))
        if module is None:
            return None
        options = entry.get("OPTIONS", {})
        if LEASE_OPTION in options:
            value = options[LEASE_OPTION]
            return None if value is None else float(value)
        import importlib

        return float(importlib.import_module(module).OPTIONS[LEASE_OPTION].default)


def _protecting(settings: dict[str, Any]) -> bool:
    return str(settings["CACHES"]["default"].get("BACKEND")) in PROTECTING


def variants(targets: list[Target]) -> list[Variant]:
    """Every target once; those whose backend protects get_or_set twice (on, off)."""
    probe = TargetEnv(Path("/nonexistent"), {"memcached": "probe", "redis": "probe"})
    rows = []
    for target in targets:
        protects = _protecting(target.django_settings(probe))
        rows.append(Variant(target.name, target, protects))
        if protects:
            rows.append(Variant(f"{target.name} (unprotected)", target, False))
    return rows


def run(args: argparse.Namespace, command: list[str]) -> int:
    targets = select_targets(load_targets(), _names(args.backends))
    out: Path = prepare_out_dir(args.out or default_out_dir("stampede"))
    rows = variants(targets)
    callers = args.procs * args.threads
    results = StampedeResults(
        machine=machine_info(), command=command,
        params={"procs": args.procs, "threads": args.threads, "callers": callers,
                "compute_s": args.compute, "repeat": args.repeat,
                "start_method": args.start_method, "timeout_s": args.timeout,
                "backends": [t.name for t in targets]},
    )
    progress = Progress(live=False)
    warning = oversubscription_warning(args.procs, results.machine["usable_cpus"])
    if warning:
        results.warnings.append(warning)
        progress.say(f"WARNING: {warning}")
    progress.say(f"djcachebench stampede: {args.procs} processes x {args.threads} threads = "
                 f"{callers} callers, {args.compute:g} s computation, {args.repeat} round(s) "
                 f"per row; rows: {', '.join(r.name for r in rows)}")
    previous = signal.signal(signal.SIGTERM, terminate_as_interrupt)
    pool = ServerPool()
    try:
        _run_rows(rows, pool, args, results, progress)
    finally:
        pool.stop()
        signal.signal(signal.SIGTERM, previous)
    path = results.save(out / "results.json")
    written = write_outputs(path, plot=not args.no_plot, progress=progress)
    print(render(StampedeResults.load(path)), end="")
    for item in written:
        print(item)
    failed = any(s["status"] == "failed" for s in results.skipped)
    failed = failed or any(row.failures() for row in results.rows)
    return 1 if failed or not results.rows else 0


def write_outputs(path: Path, plot: bool = True, progress: Progress | None = None
                  ) -> list[Path]:
    """report.md and stampede.png beside ``path``, drawn from that file only."""
    data = StampedeResults.load(path)
    report = path.parent / "report.md"
    written = [path, report]
    charts: list[str] = []
    missing = missing_matplotlib()
    if plot and data.rows and missing:
        (progress or Progress()).say(f"chart skipped: {missing}")
    elif plot and data.rows:
        from djcachebench.bench.stampede.chart import draw

        chart = draw(data, path.parent / "stampede.png")
        charts.append(chart.name)
        written.append(chart)
    report.write_text(render(data, charts))
    return written


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def _run_rows(variants_: list[Variant], pool: ServerPool, args: argparse.Namespace,
              results: StampedeResults, progress: Progress) -> None:
    """Every row ``--repeat`` times, A B C, C B A, ... (``run_order``); skipped and
    failed rows recorded once."""
    runnable: list[tuple[Variant, Row]] = []
    for variant in variants_:
        target = variant.target
        reason = target.unsupported or target.missing_module() or pool.need(target)
        if reason:
            _skip(results, progress, variant.name, reason)
            continue
        runnable.append((variant, Row(variant.name, target.name, variant.protected, None,
                                      _description(variant))))
    plan = Plan(procs=args.procs, threads=args.threads, compute_s=args.compute,
                start_method=args.start_method, timeout_s=args.timeout)
    out: set[str] = set()
    for index in range(args.repeat):
        for variant, row in run_order(runnable, index):
            if variant.name in out:
                continue
            label = f"{variant.name}, round {index + 1} of {args.repeat}"
            try:
                one = _round(variant, row, pool, plan, index)
            except RoundSkipped as exc:
                _skip(results, progress, variant.name, str(exc))
                out.add(variant.name)
                continue
            except RoundFailed as exc:
                reason = str(exc) if args.repeat == 1 else f"round {index + 1}: {exc}"
                _skip(results, progress, variant.name, reason, "failed")
                out.add(variant.name)
                continue
            row.runs.append(one)
            p99 = "-" if one.p99_s is None else f"{one.p99_s * 1e3:.0f} ms"
            progress.say(f"{label}: {one.computations} computation(s), wall "
                         f"{one.wall_s * 1e3:.0f} ms, p99 {p99}, wrong {one.wrong}"
                         + (f"; FAILED: {one.failure}" if one.failure else ""))
    results.rows = [row for variant, row in runnable if variant.name not in out]


def _description(variant: Variant) -> str:
    how = ("its own get_or_set (lease)" if variant.protected
           else "Django's BaseCache.get_or_set")
    return f"{variant.target.description}; {how}"


def _skip(results: StampedeResults, progress: Progress, name: str, reason: str,
          status: str = "skipped") -> None:
    results.skipped.append({"name": name, "reason": reason, "status": status})
    progress.say(f"{name}: {status.upper()}: {reason}")


class RoundSkipped(RuntimeError):
    """The row cannot run here (a BACKEND class is missing); the message is the reason."""


def _round(variant: Variant, row: Row, pool: ServerPool, plan: Plan, index: int) -> Round:
    """One round of one row in a fresh temp dir, with emptied servers."""
    workdir = Path(tempfile.mkdtemp(prefix="djcb-stampede-"))
    try:
        env = TargetEnv(workdir, pool.locations())
        settings = variant.settings(env)
        for path in backend_paths(settings):
            reason = resolvable(path)
            if reason:
                raise RoundSkipped(reason)
        if not row.settings:
            row.settings = settings
            row.lease_s = variant.lease_s(env)
        for kind in variant.target.servers:
            pool.servers[kind].flush()
        return run_round(plan, settings, variant.target.setup_commands,
                         f"djcb-stampede-{index}", workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
