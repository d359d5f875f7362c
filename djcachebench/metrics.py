"""A ``prometheus_client`` collector of the host-wide cache counters.

For a site that already serves ``/metrics`` with ``prometheus_client``::

    from djcachebench.metrics import register
    register()                       # every alias with host-wide stats
    register(aliases=["default"])    # or some of them

Each scrape reports what ``manage.py cachestats --format prometheus`` prints
(the same families, labels ``alias`` and ``backend``): every process's
counts on the host, summed, not only the scraped process's. Needs the
``prometheus`` extra (``pip install djcachebench[prometheus]``); importing
``djcachebench`` does not.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from djcachebench.hoststats.formats import families
from djcachebench.hoststats.report import collect

__all__ = ["DjcachebenchCollector", "register"]


def _client() -> Any:
    try:
        import prometheus_client.core
    except ImportError as exc:
        raise ImportError("djcachebench.metrics needs prometheus_client: install the "
                          "'prometheus' extra (pip install 'djcachebench[prometheus]')") from exc
    return prometheus_client.core


class DjcachebenchCollector:
    """Yields the host-wide counters and gauges of ``aliases`` (default: every
    alias of ``CACHES`` that has them) at each collection."""

    def __init__(self, aliases: Sequence[str] | None = None) -> None:
        self._core = _client()
        self.aliases = list(aliases) if aliases else None

    def collect(self) -> Iterator[Any]:
        core = self._core
        for fam in families(collect(self.aliases)):
            kind = (core.CounterMetricFamily if fam.kind == "counter"
                    else core.GaugeMetricFamily)
            metric = kind(fam.metric, fam.help, labels=["alias", "backend"])
            for labels, value in fam.samples:
                metric.add_metric(list(labels), value)
            yield metric

    def describe(self) -> list[Any]:
        # Nothing at registration: describing would build every cache then.
        return []


def register(aliases: Sequence[str] | None = None, registry: Any = None) -> DjcachebenchCollector:
    """Register a :class:`DjcachebenchCollector` (in ``prometheus_client``'s
    default registry unless ``registry`` is given) and return it."""
    collector = DjcachebenchCollector(aliases)
    (registry or _client().REGISTRY).register(collector)
    return collector
