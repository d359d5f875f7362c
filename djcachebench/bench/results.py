"""The results file: a versioned JSON document, the only input of report and plot.

Why a schema version and machine metadata in the file (as pyperf does): a
number without the machine, the versions and the exact settings it came from
cannot be compared or reproduced. ``load`` reads the versions it knows (1 and
2) and refuses any other instead of guessing at its fields.

Layout (schema_version 3)::

    schema_version, created (UTC ISO 8601), tool {name, version, git, dirty}, command
    machine   {cpu_count, usable_cpus, cpu_model, platform, os, python,
               django, sqlite, packages {name: version|null},
               cache_dir {path, mount, fstype} (the targets' files: provenance.py),
               servers {redis|memcached: {version, command [argv]}}}
    scenario  the Scenario fields (after CLI overrides)
    run       {procs, threads, tasks, ops, warmup, seed, start_method, repeat,
               budget_s (null: none),
               interrupted ("SIGINT"|"SIGTERM", only when the run was cut short)}
    targets   {name: {description, note, servers, settings (as run), per_process,
                      plan {budget_s, calibration_ops_per_s, ops, warmup,
                            scenario_ops, scenario_warmup, cut} (with a budget:
                            the ops per process this target ran; budget.py)}}
    backends  [{name, wall_s, ops, ops_per_s, actions {get|set|delete|incr: stats},
                notes [str], failures [str] (non-empty: the target failed),
                stale [str] (non-empty: stale answers held against it),
                footprint {rss_growth_bytes [per worker], rss_bytes [per worker],
                           entries, entries_probed, entries_estimated,
                           disk {bytes, apparent_bytes, wal_bytes, files} | null,
                           server {kind, memory_bytes, dataset_bytes, items,
                                   rss_bytes} | null},   (footprint.py)
                cache_stats {l1_hits, l1_misses, l2_hits, l2_misses, board_hits,
                             invalidations, unserved, l1_bypassed, l1_kept_out, published,
                             workers, l1_share, cluster_* ...,
                             give_ups, voided, errors, tampered, corruptions,
                             l2_give_ups ... (silent failures: summed over runs)} | null,
                             (TieredCache and ShardedSQLiteCache targets; cache_stats.py)
                runs [{wall_s, ops, ops_per_s, actions, notes, footprint,
                       cache_stats}],   (repeat > 1)
                summary {figure: {median, low, high, n, confidence, unstable}}}]
    skipped   [{name, reason, status: "skipped"|"failed"|"interrupted"|"not run"}]
    warnings  [str]

Latencies are integer nanoseconds (``p50_ns`` ... ``p99_99_ns``, ``max_ns``,
``total_ns``), null for an action with no sample (every call raised); each
action also counts ``errors`` (calls that raised), ``wrong`` (gets that
returned a value the workload never stored for the key, verify.py) and
``stale`` (gets that returned a value a later acknowledged write had
replaced, freshness.py).
With ``--repeat N`` (N > 1), ``runs`` holds every run's own figures in run
order, and the backend's top-level figures are, per figure (``wall_s``, ``ops``
and ``ops_per_s``: those of the run with the median ops/s, :func:`median_run`),
the median of the runs' values (see :mod:`djcachebench.bench.summary`), except
``errors``, ``wrong`` and ``stale``, which are totals over the runs (:data:`TOTALS`);
``summary`` is that median with its confidence interval, written for readers
of the file and recomputed from ``runs`` when it is loaded.

Schema 2 had no ``footprint`` (read as None). Schema 1 (before repeats) had
no ``runs``, ``summary``, ``notes``, ``p99_99_ns`` nor ``run.repeat``; it is
read as one run each, without p99.99. ``cache_stats`` came later within schema
3, without a new version: it is optional (null for most backends), so a file
without it reads as None, and a reader that predates it loses nothing by
ignoring it (a new version would only make such readers refuse the file).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import sqlite3
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from djcachebench.bench.cache_stats import median_runs
from djcachebench.bench.footprint import median_footprint
from djcachebench.bench.provenance import filesystem_of
from djcachebench.bench.stats import ActionStats, percentile
from djcachebench.bench.summary import Interval, median_interval
from djcachebench.bench.targets import is_per_process

SCHEMA_VERSION = 3
#: Versions ``load`` reads (older ones are upgraded in memory).
READABLE_VERSIONS = (1, 2, 3)

#: Packages whose versions are recorded with every run.
PACKAGES = ("djcachebench", "django", "diskcache", "django-redis", "redis", "pylibmc", "msgpack")


class ResultsError(ValueError):
    """The results file is unreadable or of an unsupported schema version."""


@dataclass
class BackendResult:
    """One backend's figures for the run: of its one run, or per-figure medians of its runs."""

    name: str
    actions: dict[str, ActionStats]
    wall_s: float
    ops: int
    #: What a reader must know about these figures (errors, refused values).
    notes: list[str] = field(default_factory=list)
    #: Every run's own figures when the targets ran more than once (else empty).
    runs: list[BackendResult] = field(default_factory=list)
    #: Memory and disk after the run (see footprint.py); None in older files.
    footprint: dict[str, Any] | None = None
    #: The cache's own counters over the measured ops (see cache_stats.py); None
    #: for a cache that keeps none, and in older files.
    cache_stats: dict[str, Any] | None = None
    #: Why this target's figures must not be read as a result although it ran:
    #: every call of an action raised, or the cache returned values the
    #: workload never stored (verify.py). Non-empty: the target failed (exit 1).
    failures: list[str] = field(default_factory=list)
    #: What the freshness check holds against the target (freshness.py): gets
    #: that returned a value an acknowledged earlier write had replaced, within
    #: what the cache promises. Non-empty: the status is "stale" -- the figures
    #: are measurements, but of a cache that lost or did not see writes.
    stale: list[str] = field(default_factory=list)

    @property
    def ops_per_s(self) -> float:
        if self.runs:
            return float(percentile(sorted(r.ops_per_s for r in self.runs), 50))
        return self.ops / self.wall_s if self.wall_s > 0 else 0.0

    @classmethod
    def from_runs(cls, runs: list[BackendResult]) -> BackendResult:
        """One run as it is; several summarised per figure by the median (never merged)."""
        if len(runs) == 1:
            return runs[0]
        actions: dict[str, ActionStats] = {}
        for action in runs[0].actions:
            per_run = [r.actions[action] for r in runs if action in r.actions]
            actions[action] = ActionStats(
                **{
                    name: (sum if name in TOTALS else _median)([getattr(s, name) for s in per_run])
                    for name in ActionStats.__dataclass_fields__
                }
            )
        notes = [f"run {i}: {note}" for i, r in enumerate(runs, 1) for note in r.notes]
        failures = [f"run {i}: {why}" for i, r in enumerate(runs, 1) for why in r.failures]
        stale = [f"run {i}: {why}" for i, r in enumerate(runs, 1) for why in r.stale]
        footprints = [r.footprint for r in runs]
        middle = median_run(runs)
        return cls(
            name=runs[0].name,
            actions=actions,
            wall_s=middle.wall_s,
            ops=middle.ops,
            notes=notes,
            runs=list(runs),
            footprint=None if None in footprints else median_footprint(footprints),
            cache_stats=median_runs([r.cache_stats for r in runs]),
            failures=failures,
            stale=stale,
        )

    def summary(self) -> dict[str, Interval]:
        """Per figure, the median of the runs and its interval (empty for one run)."""
        if not self.runs:
            return {}
        out = {"ops/s": median_interval([r.ops_per_s for r in self.runs])}
        for action in self.actions:
            for label, name in FIGURES:
                values = [getattr(r.actions[action], name) for r in self.runs
                          if action in r.actions]  # fmt: skip
                if values and None not in values:
                    out[f"{action} {label}"] = median_interval(values)
        return out

    def to_dict(self) -> dict[str, Any]:
        data = self._figures_dict()
        if self.runs:
            data["runs"] = [r._figures_dict() for r in self.runs]
            data["summary"] = {k: v.to_dict() for k, v in self.summary().items()}
        return {"name": self.name, **data}

    def _figures_dict(self) -> dict[str, Any]:
        return {
            "wall_s": self.wall_s,
            "ops": self.ops,
            "ops_per_s": round(self.ops_per_s, 1),
            "actions": {a: s.to_dict() for a, s in self.actions.items()},
            "notes": self.notes,
            "failures": self.failures,
            "stale": self.stale,
            "footprint": self.footprint,
            "cache_stats": self.cache_stats,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], name: str | None = None) -> BackendResult:
        name = data["name"] if name is None else name
        return cls(
            name=name,
            wall_s=float(data["wall_s"]),
            ops=int(data["ops"]),
            actions={a: ActionStats.from_dict(s) for a, s in data["actions"].items()},
            notes=list(data.get("notes", [])),
            runs=[cls.from_dict(r, name) for r in data.get("runs", [])],
            footprint=data.get("footprint"),
            cache_stats=data.get("cache_stats"),
            failures=list(data.get("failures", [])),
            stale=list(data.get("stale", [])),
        )


#: The per-action figures summarised over runs: (label, ActionStats field).
FIGURES: tuple[tuple[str, str], ...] = (
    ("p50", "p50"),
    ("p90", "p90"),
    ("p99", "p99"),
    ("p99.9", "p999"),
    ("p99.99", "p9999"),
    ("max", "max"),
    ("miss", "miss"),
    ("errors", "errors"),
    ("wrong", "wrong"),
    ("stale", "stale"),
)


def median_run(runs: list[BackendResult]) -> BackendResult:
    """The run whose ops/s is the runs' median (nearest rank): its wall and ops are
    the backend's, so that wall, ops and ops/s are one run's and agree.

    Why not each its own median: with an even count the lower-middle wall is
    the faster run's and the lower-middle ops/s the slower run's, and the row
    would contradict itself (a wall, an op count and an ops/s that do not agree).
    """
    middle = percentile(sorted(r.ops_per_s for r in runs), 50)
    return next(r for r in runs if r.ops_per_s == middle)


#: Per-action counts summed over the runs, not their median: calls that raised or
#: answered wrong in one run of three would vanish in a median of zeros, and the
#: headline would read "0 errors".
TOTALS = ("errors", "wrong", "stale")


def _median(values: list[Any]) -> Any:
    """The nearest-rank median (an observed value); None if any run lacks the figure."""
    if any(v is None for v in values):
        return None
    return percentile(sorted(values), 50)


@dataclass
class Skipped:
    """A target that did not run (``skipped``), broke while running (``failed``), was
    running when the run was interrupted (``interrupted``) or never started (``not run``)."""

    name: str
    reason: str
    status: str = "skipped"

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "reason": self.reason, "status": self.status}


@dataclass
class Results:
    """One benchmark run."""

    machine: dict[str, Any]
    scenario: dict[str, Any]
    run: dict[str, Any]
    targets: dict[str, dict[str, Any]] = field(default_factory=dict)
    backends: list[BackendResult] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    command: list[str] = field(default_factory=list)
    created: str = field(default_factory=lambda: utc_now())
    #: The checkout's commit (``+dirty`` when it had changes), or None outside one.
    git: str | None = field(default_factory=lambda: git_revision())
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "created": self.created,
            "tool": {
                "name": "djcachebench",
                "version": _version("djcachebench"),
                "git": self.git,
                # Uncommitted changes to tracked files (untracked ones are not counted).
                "dirty": None if self.git is None else self.git.endswith("+dirty"),
            },
            "command": self.command,
            "machine": self.machine,
            "scenario": self.scenario,
            "run": self.run,
            "targets": self.targets,
            "backends": [b.to_dict() for b in self.backends],
            "skipped": [s.to_dict() for s in self.skipped],
            "warnings": self.warnings,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Results:
        version = data.get("schema_version")
        if version not in READABLE_VERSIONS:
            raise ResultsError(
                f"results schema_version {version!r} is not supported (this is "
                f"{SCHEMA_VERSION}; it reads {', '.join(map(str, READABLE_VERSIONS))})"
            )
        try:
            run = dict(data["run"])
            run.setdefault("repeat", 1)  # schema 1: one run
            return cls(
                schema_version=SCHEMA_VERSION,
                created=data["created"],
                git=data.get("tool", {}).get("git"),
                command=list(data.get("command", [])),
                machine=data["machine"],
                scenario=data["scenario"],
                run=run,
                targets=data.get("targets", {}),
                backends=[BackendResult.from_dict(b) for b in data["backends"]],
                skipped=[Skipped(**s) for s in data.get("skipped", [])],
                warnings=list(data.get("warnings", [])),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ResultsError(f"malformed results: {exc!r}") from exc

    def per_process(self, name: str) -> bool:
        """Is target ``name`` a cache private to each worker process (LocMemCache)?

        Such a cache's hit rate and speed answer another question (every
        process has its own copy, sees none of the others' writes): reports and
        charts mark it. Files written before ``per_process`` was recorded are
        read from the target's settings.
        """
        target = self.targets.get(name, {})
        if "per_process" in target:
            return bool(target["per_process"])
        entry = ((target.get("settings") or {}).get("CACHES") or {}).get("default") or {}
        return is_per_process(entry)

    def plan(self, name: str) -> dict[str, Any] | None:
        """What a time budget gave target ``name`` (budget.Plan.to_dict), or None."""
        plan = self.targets.get(name, {}).get("plan")
        return plan if isinstance(plan, dict) else None

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Results:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ResultsError(f"cannot read results {path}: {exc}") from exc
        return cls.from_dict(data)


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def git_revision() -> str | None:
    """The commit of the checkout the package runs from, so a result names its code."""
    from djcachebench.bench.paths import repo_root

    root = repo_root()
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}+dirty" if dirty else head


def usable_cpus() -> int:
    """CPUs this process may run on (affinity), which is what the workers share."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_model() -> str:
    """The CPU model from /proc/cpuinfo (Linux), else platform.processor()."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine_info() -> dict[str, Any]:
    """What the figures depend on: CPUs, OS, interpreter, libraries."""
    return {
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable_cpus(),
        "cpu_model": cpu_model(),
        "platform": platform.platform(),
        "os": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "django": _version("django"),
        "sqlite": sqlite3.sqlite_version,
        "packages": {name: _version(name) for name in PACKAGES},
        "executable": sys.executable,
        # Where the targets' cache files go, and on what filesystem (provenance.py).
        "cache_dir": filesystem_of(),
    }


def oversubscription_warning(procs: int, cpus: int | None = None) -> str | None:
    """The warning printed when worker processes outnumber the usable CPU cores."""
    cpus = usable_cpus() if cpus is None else cpus
    if procs <= cpus:
        return None
    return (
        f"{procs} worker processes share {cpus} CPU core(s): the workers are "
        f"oversubscribed, so latencies include time spent waiting for a core "
        f"(tails especially). Compare backends with each other, not with other machines."
    )


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None
