"""The results file of ``djcachebench stampede``, and the figures of one round.

Why its own schema and not ``results.json``'s: that one describes per-action
latency distributions of a workload; a stampede round is a different thing
(a count of computations, one latency per caller, whether each caller got a
computed value), and forcing it into the action table would mislabel it. The
habits are the same: a schema name and version that :meth:`StampedeResults.load`
checks, machine metadata (:func:`djcachebench.bench.results.machine_info`), the
settings as run, and every round's raw figures, so that report.md and
stampede.png are drawn from this file alone.

Layout (``schema: "djcachebench-stampede"``, ``version: 1``)::

    schema, version, created (UTC ISO 8601), tool {name, version, git}, command
    machine   as in results.json
    params    {procs, threads, callers, compute_s, repeat, start_method, timeout_s, backends}
    rows      [{name, target, protected, lease_s, description, settings,
                runs [{callers, computations, cached_computations, wall_s, wakeup_s,
                       latencies_s [sorted], cached_latencies_s [sorted],
                       wrong, errors {type: count},
                       p50_s, p99_s, max_s, cached_p99_s (null: no caller got a value)}]}]
    skipped   [{name, reason, status: "skipped"|"failed"}]
    warnings  [str]

``p50_s`` ... ``cached_p99_s`` are written for readers of the file; loading
recomputes them from the latencies (nearest rank, :mod:`djcachebench.bench.stats`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from djcachebench.bench.results import ResultsError, git_revision, utc_now
from djcachebench.bench.stats import percentile

SCHEMA = "djcachebench-stampede"
VERSION = 1


@dataclass(frozen=True)
class Call:
    """One caller's call, as its worker process recorded it.

    ``start_ns``/``end_ns`` are ``time.monotonic_ns()`` (one clock for every
    process of the host): ``start_ns`` the moment this caller woke up after
    the release, ``end_ns`` the moment ``get_or_set`` returned or raised.
    """

    start_ns: int
    end_ns: int
    value: str | None
    error: str | None = None


@dataclass(frozen=True)
class Round:
    """One round of one row: every caller once on the absent key, then once more on
    the cached key (the "cached burst", no computation to wait for)."""

    callers: int
    computations: int
    #: Computations during the cached burst (0 unless the value went missing).
    cached_computations: int
    #: The release to the last caller's return.
    wall_s: float
    #: The last caller's start after the release: how long the scheduler took to
    #: run every caller (inside their latencies, as a wait for a core would be).
    wakeup_s: float
    #: Per caller that got a value, seconds from the release to its return, sorted.
    latencies_s: list[float]
    #: The same for the cached burst (from that burst's own release).
    cached_latencies_s: list[float]
    #: Callers that returned a value no computation of this round produced, or raised.
    wrong: int
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def p50_s(self) -> float | None:
        """None when no caller got a value: no latency, never 0 (the fastest there is)."""
        return _pct(self.latencies_s, 50)

    @property
    def p99_s(self) -> float | None:
        return _pct(self.latencies_s, 99)

    @property
    def max_s(self) -> float | None:
        return self.latencies_s[-1] if self.latencies_s else None

    @property
    def cached_p99_s(self) -> float | None:
        return _pct(self.cached_latencies_s, 99)

    @property
    def failure(self) -> str | None:
        """Why this round's figures are not a result, or None.

        Every caller raised: a backend that is down computed nothing and has no
        latency, and it would read as the best row (0 computations, "0ns"). Or a
        caller got a value no computation of the round produced. Some callers
        raising is noted, not a failure (as in ``bench``).
        """
        raised = sum(self.errors.values())
        if self.callers and raised >= self.callers:
            kinds = ", ".join(f"{k} x{v}" for k, v in sorted(self.errors.items()))
            return f"every get_or_set raised ({kinds or 'no value returned'})"
        if self.wrong > raised:
            return (f"{self.wrong - raised} of {self.callers} callers got a value no "
                    f"computation of the round produced")
        return None

    @classmethod
    def from_calls(cls, stampede: list[Call], cached: list[Call], computed: set[str],
                   computations: int, cached_computations: int, release_ns: int,
                   cached_release_ns: int) -> Round:
        """The round's figures from every caller's two calls and the computation log.

        Latencies count from the release, one announced instant for every caller
        of a phase (see :mod:`.crowd`): a caller that the scheduler starts late
        still asked at the release, as a request that waits for a core does, so
        its wait is in its latency; how late the last one started is ``wakeup_s``.
        A caller is ``wrong`` when it raised or got a value that is not one of
        ``computed`` (this round's computations').
        """
        errors: dict[str, int] = {}
        for c in stampede:
            if c.error is not None:
                errors[c.error] = errors.get(c.error, 0) + 1
        return cls(
            callers=len(stampede),
            computations=computations,
            cached_computations=cached_computations,
            wall_s=max((c.end_ns - release_ns for c in stampede), default=0) / 1e9,
            wakeup_s=max((c.start_ns - release_ns for c in stampede), default=0) / 1e9,
            latencies_s=_from_release(stampede, release_ns),
            cached_latencies_s=_from_release(cached, cached_release_ns),
            wrong=sum(1 for c in stampede if c.error is not None or c.value not in computed),
            errors=errors,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "callers": self.callers,
            "computations": self.computations,
            "cached_computations": self.cached_computations,
            "wall_s": round(self.wall_s, 6),
            "wakeup_s": round(self.wakeup_s, 6),
            "p50_s": _rounded(self.p50_s),
            "p99_s": _rounded(self.p99_s),
            "max_s": _rounded(self.max_s),
            "cached_p99_s": _rounded(self.cached_p99_s),
            "wrong": self.wrong,
            "errors": self.errors,
            "latencies_s": [round(x, 6) for x in self.latencies_s],
            "cached_latencies_s": [round(x, 6) for x in self.cached_latencies_s],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Round:
        return cls(
            callers=int(data["callers"]),
            computations=int(data["computations"]),
            cached_computations=int(data["cached_computations"]),
            wall_s=float(data["wall_s"]),
            wakeup_s=float(data["wakeup_s"]),
            latencies_s=sorted(float(x) for x in data["latencies_s"]),
            cached_latencies_s=sorted(float(x) for x in data["cached_latencies_s"]),
            wrong=int(data["wrong"]),
            errors={str(k): int(v) for k, v in data.get("errors", {}).items()},
        )


def _from_release(calls: list[Call], release_ns: int) -> list[float]:
    """Sorted seconds from the release to each return that gave a value."""
    return sorted((c.end_ns - release_ns) / 1e9 for c in calls if c.error is None)


def _pct(values: list[float], q: float) -> float | None:
    return float(percentile(values, q)) if values else None


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


@dataclass
class Row:
    """One line of the report: a target, protected or not, and its rounds."""

    name: str
    target: str
    #: Whether ``get_or_set`` was the backend's lease-protected one.
    protected: bool
    #: The ``STAMPEDE_LEASE`` it ran with (None: off, or the backend has none).
    lease_s: float | None
    description: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    runs: list[Round] = field(default_factory=list)

    def failures(self) -> list[str]:
        """Why the row failed (exit status 1), one reason per failed round."""
        return [f"round {i}: {r.failure}" if len(self.runs) > 1 else r.failure
                for i, r in enumerate(self.runs, 1) if r.failure]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "target": self.target, "protected": self.protected,
            "lease_s": self.lease_s, "description": self.description,
            "settings": self.settings, "runs": [r.to_dict() for r in self.runs],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Row:
        lease = data.get("lease_s")
        return cls(
            name=str(data["name"]), target=str(data["target"]),
            protected=bool(data["protected"]),
            lease_s=None if lease is None else float(lease),
            description=str(data.get("description", "")),
            settings=dict(data.get("settings", {})),
            runs=[Round.from_dict(r) for r in data["runs"]],
        )


@dataclass(frozen=True)
class Spread:
    """The median of the runs' values (nearest rank: an observed run's) and their range."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        ordered = sorted(values)
        return cls(float(percentile(ordered, 50)), ordered[0], ordered[-1])

    @classmethod
    def present(cls, values: list[float | None]) -> Spread | None:
        """Over the rounds that have the figure; None when none has it."""
        kept = [v for v in values if v is not None]
        return cls.of(kept) if kept else None


@dataclass
class StampedeResults:
    """One ``djcachebench stampede`` run: parameters, machine, rows, what did not run."""

    machine: dict[str, Any]
    params: dict[str, Any]
    rows: list[Row] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    command: list[str] = field(default_factory=list)
    created: str = field(default_factory=utc_now)
    git: str | None = field(default_factory=git_revision)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "version": VERSION,
            "created": self.created,
            "tool": {"name": "djcachebench", "version": _version(), "git": self.git},
            "command": self.command,
            "machine": self.machine,
            "params": self.params,
            "rows": [r.to_dict() for r in self.rows],
            "skipped": self.skipped,
            "warnings": self.warnings,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StampedeResults:
        if data.get("schema") != SCHEMA or data.get("version") != VERSION:
            raise ResultsError(
                f"not a {SCHEMA} version {VERSION} file (schema {data.get('schema')!r}, "
                f"version {data.get('version')!r})"
            )
        try:
            return cls(
                machine=dict(data["machine"]),
                params=dict(data["params"]),
                rows=[Row.from_dict(r) for r in data["rows"]],
                skipped=[dict(s) for s in data.get("skipped", [])],
                warnings=list(data.get("warnings", [])),
                command=list(data.get("command", [])),
                created=str(data["created"]),
                git=data.get("tool", {}).get("git"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ResultsError(f"malformed {SCHEMA} results: {exc!r}") from exc

    def save(self, path: Path) -> Path:
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: Path) -> StampedeResults:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ResultsError(f"cannot read results {path}: {exc}") from exc
        return cls.from_dict(data)


def _version() -> str | None:
    try:
        return metadata.version("djcachebench")
    except metadata.PackageNotFoundError:
        return None
