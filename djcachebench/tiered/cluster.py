"""The Django side of cross-host coherence (``OPTIONS["COHERENCE"] = "cluster"``).

The transport itself is Django-free (``djcachebench.coherence.cluster``). This
module turns a validated :class:`TieredConfig` into a link of the host's
generation table: the redis URL (``COHERENCE_URL``, by default the L2's own redis,
resolved and validated in ``config.py``) and the channel.

Wiring: :func:`attach_cluster` runs once the table is open (``state.open_shared``),
for ``COHERENCE="cluster"``; it is idempotent per table in a process.

Why one channel base for every cache: messages carry final keys, which already
hold each cache's prefix and version, so a host applying a key of a cache it
does not have only invalidates a slot for nothing. One fixed name means two
hosts can never disagree on it. Under it, each host has a channel of its own, so
that no host's subscriber is woken for its own host's writes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from djcachebench.coherence import GenerationTable
from djcachebench.coherence.cluster import ClusterLink, link_table, linked
from djcachebench.conf import signing_secrets
from djcachebench.serializers import derive_tag_key
from djcachebench.tiered.config import TieredConfig
from djcachebench.tiered.l2 import adapter_for

__all__ = ["CHANNEL", "attach_cluster", "cluster_link", "cluster_stats", "strict_keys"]

#: Domain separation: the strict-write key is derived from SECRET_KEY, never
#: SECRET_KEY itself, and never another part's key.
_STRICT_CONTEXT = b"djcachebench.strict.v1"

#: The base of the pub/sub channels of every cluster-coherent TieredCache on a
#: redis: each host publishes on ``CHANNEL:<host id>`` and hears every other
#: host's (``coherence/cluster/channels.py``).
CHANNEL = "djcachebench:coherence"


def attach_cluster(config: TieredConfig, table: GenerationTable) -> None:
    """Link ``table`` to the other hosts (guard, outlet, publisher, subscriber election).

    A no-op unless ``config.coherence == "cluster"``; idempotent per table and
    process. The table must be a shared file (an adapter-stamped
    ``GENERATION_PATH``): the subscriber's lock and heartbeat live beside it.
    """
    if config.coherence != "cluster":
        return
    if not table.path or table.engine_stamped():
        raise ImproperlyConfigured(
            f"{config.where}['COHERENCE'] = 'cluster' needs a generation table file that the "
            f"adapter stamps (GENERATION_PATH); got {table!r}.")
    assert config.coherence_url is not None  # resolved by read_config
    link = link_table(table, config.coherence_url, CHANNEL, strict_lease=config.strict_lease,
                      strict_keys=strict_keys(config) if config.strict_lease else ())
    if link.strict_lease != config.strict_lease:
        # One link per table and process, made by the first alias that opened it:
        # another alias on the same table cannot have other strict writes.
        raise ImproperlyConfigured(
            f"{config.where}['STRICT_LEASE'] = {config.strict_lease!r}, but another "
            f"TieredCache of this process shares its generation table ({table.path}) with "
            f"STRICT_LEASE = {link.strict_lease!r}; set the same value on both.")


def strict_keys(config: TieredConfig) -> tuple[bytes, ...]:
    """The key that signs this host's strict-write leases and acks, then the keys
    accepted from other hosts: derived from ``SECRET_KEY`` and its fallbacks, so
    that nobody without them can stand in for a host (``strict.py``, Trust)."""
    secret, older = signing_secrets()
    if not secret:
        raise ImproperlyConfigured(
            f"{config.where}['STRICT_LEASE'] needs SECRET_KEY: the hosts sign their leases "
            "and acknowledgements with a key derived from it; SECRET_KEY is empty.")
    return tuple(dict.fromkeys(derive_tag_key(s, _STRICT_CONTEXT) for s in (secret, *older)))


def l2_clear(l2: Any, link: ClusterLink | None) -> Callable[[], Any]:
    """How ``clear`` empties the L2: its own ``clear``, except under strict writes
    over a redis L2 whose write server and database hold the hosts' leases
    (the ``COHERENCE_URL``'s server, database 0): there one script flushes the
    database and keeps the leases (``StrictWriter.flush_keeping_members``), the
    same ``FLUSHDB`` the L2's ``clear`` sends, without taking the leases with it."""
    strict = None if link is None else link.publisher.strict
    if strict is None:
        return l2.clear  # type: ignore[no-any-return]
    client = adapter_for(l2).flushed_client()
    if client is None:
        return l2.clear  # type: ignore[no-any-return]
    try:
        kwargs = client().connection_pool.connection_kwargs
    except Exception:  # not the client we know: its own clear
        return l2.clear  # type: ignore[no-any-return]
    if int(kwargs.get("db") or 0) != 0:
        return l2.clear  # type: ignore[no-any-return]  # the leases are in database 0

    def clear() -> Any:
        """The same server is told by its ``run_id``, asked of both at the
        clear: host names, aliases and unix sockets spell one server many ways
        (``unix://...sock`` against ``redis://127.0.0.1:port``, ``localhost``
        against ``127.0.0.1``: compared by spelling, each would clear the leases
        with the L2). A server that does not answer gets the
        L2's own clear, which then fails as it would."""
        try:
            same = (client().info("server").get("run_id", "").encode()
                    == strict.server_id())
        except Exception:
            same = False
        return strict.flush_keeping_members() if same else l2.clear()

    return clear


def cluster_link(table: GenerationTable) -> ClusterLink | None:
    """This process's link of ``table`` (None when it is not cluster-coherent)."""
    return linked(table)


def cluster_stats(table: GenerationTable) -> dict[str, Any]:
    """Cross-host counters of ``table`` (``cache.generation_table``), {} when not linked
    (``TieredCache.stats()`` shows them prefixed ``cluster_``).

    This process's: ``invalidations_sent``, ``messages_sent``, ``messages_dropped``,
    ``publish_errors``, ``publish_lag_ms_mean``/``_max``, ``subscriber_here``. The
    host's (one subscriber writes them, every process reads the same):
    ``host_fresh``, ``invalidations_applied``, ``messages_applied``,
    ``epoch_bumps``, ``gaps``, ``own_echoes`` (this host's own messages that
    reached its subscriber: 0 unless the channel patterns fail), ``takeovers``,
    ``connects``, ``subscriber_pid``,
    ``degraded_seconds`` (L1 hits off on the host), and the propagation delay
    (writer's stamp to this host's apply): ``delay_ms_mean``, ``delay_ms_max``,
    ``delay_ms_p50_at_most``/``p99_at_most`` (upper edges of log2 buckets).
    """
    link = linked(table)
    return link.stats() if link is not None else {}
