"""What ``manage.py cachestats`` and ``djcachebench.metrics`` report of each alias.

A backend that keeps host-wide counters says so by offering ``host_stats()``
(ShardedSQLiteCache, TieredCache): a dict with ``backend`` (the ``backend``
label), ``counters`` (summed over the host's processes; None when its file is
unusable, with ``problem`` saying why), ``processes``, and the gauges read at
report time (``entries``, ``stored_bytes``, ``disk_bytes``) where it has them.
Any other backend has no host-wide stats: listed as such, never guessed at.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.cache import caches

__all__ = ["AliasStats", "UnknownAlias", "collect"]

log = logging.getLogger("djcachebench.stats")


class UnknownAlias(KeyError):
    """An alias that ``CACHES`` does not define."""


@dataclass
class AliasStats:
    alias: str
    backend: str  # the ``backend`` label, or the BACKEND setting where there is no report
    report: dict[str, Any] | None  # ``host_stats()``; None: no host-wide stats
    note: str | None = None  # why there is no report

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"alias": self.alias, "backend": self.backend}
        if self.report is None:
            out.update(counters=None, problem=self.note)
        else:
            out.update({k: v for k, v in self.report.items() if k != "backend"})
        return out


def collect(aliases: Sequence[str] | None = None) -> list[AliasStats]:
    """The report of each alias (default: every alias of ``CACHES``, in order).
    ``UnknownAlias`` names the first alias ``CACHES`` lacks, before any cache
    is built."""
    configured = settings.CACHES
    names = list(configured) if not aliases else list(dict.fromkeys(aliases))
    for alias in names:
        if alias not in configured:
            raise UnknownAlias(alias)
    return [_one(alias, configured[alias].get("BACKEND", "?")) for alias in names]


def _one(alias: str, backend: str) -> AliasStats:
    try:
        cache = caches[alias]
    except Exception as exc:  # a broken alias is reported, not raised
        return AliasStats(alias, backend, None, f"cannot be built: {exc}")
    host_stats = getattr(cache, "host_stats", None)
    if not callable(host_stats):
        return AliasStats(alias, backend, None, "no host-wide stats")
    try:
        report = host_stats()
    except Exception as exc:  # a report never fails the others
        log.warning("host-wide stats of cache %r unavailable: %s", alias, exc)
        return AliasStats(alias, backend, None, f"stats unavailable: {exc}")
    return AliasStats(alias, str(report.get("backend", backend)), report)
