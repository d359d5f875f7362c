"""The host-wide reports as metric families, and as text, JSON and Prometheus text.

One list of families (:func:`families`) feeds the Prometheus text of
``manage.py cachestats`` and the ``prometheus_client`` collector
(``djcachebench.metrics``): both show the same names, types and help.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from djcachebench.hoststats.report import AliasStats

__all__ = ["Family", "families", "render_json", "render_prometheus", "render_text"]

PREFIX = "djcachebench_"
LABELS = ("alias", "backend")

#: Counters every backend's report has, first, with their help.
COMMON_COUNTERS = {
    "hits": "Reads answered with a value (TieredCache: from L1 or from its L2).",
    "misses": "Reads answered with the default (TieredCache: by L1 or by its L2).",
    "sets": "Values stored by set().",
    "deletes": "delete() calls.",
    "lock_give_ups": "Operations that gave up waiting for a lock (a shard's; for "
                     "TieredCache a generation-table slot's).",
    "culled": "Entries removed by MAX_ENTRIES / SIZE_LIMIT culling.",
}
OTHER_HELP = {
    "l1_hits": "TieredCache reads answered from the in-process L1.",
    "l1_misses": "TieredCache reads the L1 answered as absent.",
    "l2_hits": "TieredCache reads the L1 could not answer and the L2 had.",
    "l2_misses": "TieredCache reads the L1 could not answer and the L2 did not have.",
    "invalidations": "L1 entries found stale (their key was written since).",
    "board_hits": "Stale L1 entries answered from the value board.",
    "published": "Values put on the value board.",
    "no_expiry": "L2 values not kept in L1 because their expiry was unknown.",
    "bad_pickles": "L1 copies that would not unpickle (read from the L2 instead).",
    "unserved": "Reads sent to the L2 because the generation table could not be trusted.",
    "coherence_lock_give_ups": "Generation-table stamps that gave up waiting for their slot.",
    "give_ups": "Operations that gave up after the whole retry policy.",
    "lock_waits": "Operations that found a shard busy and waited.",
    "tampered": "Values that failed their integrity check (read as misses).",
    "expired_removed": "Expired rows removed.",
    "errors": "Operations failed by disk full, I/O errors or read-only files.",
    "voided": "Keys whose failed write voided their stored rows.",
    "corruptions": "Shard files found corrupt and set aside.",
    "reopened": "Shard files found deleted or replaced under an open connection.",
    "file_hashes": "Value files whose tag was computed on a read.",
    "file_vouched": "Value files accepted on an identity another process vouched for.",
}
GAUGES = {
    "entries": "Entries stored now, expired ones not yet removed included.",
    "stored_bytes": "Bytes of the values stored now.",
    "disk_bytes": "Disk space of the cache's files now (blocks allocated).",
    "processes": "Processes with a row in the counters file (live, or not yet folded).",
}


@dataclass
class Family:
    """One metric: ``name`` without the prefix nor ``_total``; samples are
    ``((alias, backend), value)``."""

    name: str
    kind: str  # "counter" or "gauge"
    help: str
    samples: list[tuple[tuple[str, str], float]] = field(default_factory=list)

    @property
    def metric(self) -> str:
        return PREFIX + self.name


def families(stats: Sequence[AliasStats]) -> list[Family]:
    """The families of every alias that has a report (others have no sample)."""
    reports = [(s.alias, s.backend, s.report) for s in stats if s.report is not None]
    out: dict[str, Family] = {}
    extra: list[str] = []
    for _, _, report in reports:
        for name in report.get("counters") or {}:
            if name not in COMMON_COUNTERS and name not in extra:
                extra.append(name)
    for name in [*COMMON_COUNTERS, *extra]:
        out[name] = Family(name, "counter", COMMON_COUNTERS.get(name) or OTHER_HELP.get(
            name, f"The engine's {name} counter (see docs/settings.md, Statistics)."))
    for name, text in GAUGES.items():
        out[name] = Family(name, "gauge", text)
    for alias, backend, report in reports:
        labels = (alias, backend)
        for name, value in (report.get("counters") or {}).items():
            out[name].samples.append((labels, value))
        for name in GAUGES:
            if report.get(name) is not None:
                out[name].samples.append((labels, report[name]))
    return [f for f in out.values() if f.samples]


def _label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    return "NaN" if math.isnan(value) else repr(float(value))


def render_prometheus(stats: Sequence[AliasStats]) -> str:
    """The Prometheus text exposition format (0.0.4): HELP and TYPE per family,
    counters named ``..._total``, labels ``alias`` and ``backend``."""
    lines: list[str] = []
    for fam in families(stats):
        name = fam.metric + ("_total" if fam.kind == "counter" else "")
        lines.append(f"# HELP {name} {fam.help}")
        lines.append(f"# TYPE {name} {fam.kind}")
        for (alias, backend), value in fam.samples:
            lines.append(f'{name}{{alias="{_label_value(alias)}",'
                         f'backend="{_label_value(backend)}"}} {_number(value)}')
    return "\n".join(lines) + "\n"


def render_json(stats: Sequence[AliasStats]) -> str:
    return json.dumps({"aliases": [s.as_dict() for s in stats]}, indent=2, sort_keys=False)


def render_text(stats: Sequence[AliasStats]) -> str:
    """A block per alias: its counters (common ones first), then the gauges."""
    out: list[str] = []
    for s in stats:
        report = s.report
        if report is None:
            out.append(f"{s.alias} ({s.backend}): {s.note}")
            continue
        counters = report.get("counters")
        out.append(f"{s.alias} ({s.backend}): host-wide, "
                   f"{report.get('processes', 0)} process(es) counting")
        if counters is None:
            out.append(f"  counters unavailable: {report.get('problem')}")
            counters = {}
        names = [n for n in COMMON_COUNTERS if n in counters]
        names += [n for n in counters if n not in COMMON_COUNTERS]
        for name in names:
            out.append(f"  {name:<24}{counters[name]:>16,}")
        for name in ("entries", "stored_bytes", "disk_bytes"):
            if report.get(name) is not None:
                out.append(f"  {name:<24}{report[name]:>16,}")
    return "\n".join(out) + "\n"
