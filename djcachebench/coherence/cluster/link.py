"""A generation table linked to the other hosts: guard, outlet, publisher, subscriber.

:func:`link_table` is what a backend calls once per table and process (idempotent):
it opens the host file beside the table, installs the table's ``guard`` (L1 hits
only while the host's heartbeat is fresh) and ``outlet`` (this process's stamps
go to its publisher), and enters this process in the election of the host's
subscriber. The protocol, its guarantee and its limits: ``docs/architecture.md``,
Across hosts.

This module imports nothing from Django.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from djcachebench.coherence.cluster.channels import channel_id
from djcachebench.coherence.cluster.hostfile import STALE_AFTER, HostFile, open_host_file
from djcachebench.coherence.cluster.lease import Lease
from djcachebench.coherence.cluster.publisher import Publisher
from djcachebench.coherence.cluster.resp import parse_url
from djcachebench.coherence.cluster.strict import StrictWriter
from djcachebench.coherence.cluster.subscriber import Election, Subscriber
from djcachebench.coherence.shared_file import SharedFileError
from djcachebench.coherence.table import CHECK_EVERY, GenerationTable
from djcachebench.coherence.tokens import tokens

T = TypeVar("T")

__all__ = ["BOUND", "HEARTBEAT_EVERY", "STALE_AFTER", "ClusterLink", "link_table", "linked"]

log = logging.getLogger("djcachebench.coherence.cluster")

#: How often the subscriber pings through its subscription.
HEARTBEAT_EVERY: Final = 0.01
#: The propagation bound of the default link (:attr:`ClusterLink.bound`).
BOUND: Final = STALE_AFTER + CHECK_EVERY
#: How often a process that is not the subscriber tries to become it.
ELECT_EVERY: Final = 0.05


@dataclass
class ClusterLink:
    """What one process holds for one linked table."""

    table: GenerationTable
    url: str
    channel: str
    host: HostFile | None
    publisher: Publisher  # made even without a host file: the others must hear our writes
    election: Election | None
    stale_after: float
    strict_lease: float | None = None

    @property
    def bound(self) -> float:
        """The propagation bound (seconds): a read that starts on this host later
        than this after another host's ``PUBLISH`` of a write was answered never
        returns the older value. TieredCache acknowledges a write only after
        that answer, so the bound also counts from the acknowledgement."""
        return self.stale_after + CHECK_EVERY

    def mark(self) -> int:
        """A mark for :meth:`flush` (``Publisher.mark``)."""
        return self.publisher.mark()

    def flush(self, since: int | None = None) -> None:
        """Publish this process's queued stamps now, from the calling thread;
        raise ``PublicationDropped`` if a message was dropped since the mark
        ``since`` (``Publisher.flush``)."""
        self.publisher.flush(since)

    def strict_write(self, call: Callable[[], T]) -> T:
        """Run the write ``call``, then return only once every live host applied
        its stamps (``strict.py``); raises ``StrictWriteUnconfirmed`` if that
        cannot be told in time. A write that raised is published the ordinary
        way, and its error raised."""
        publisher = self.publisher
        publisher.strict_begin()
        try:
            result = call()
        except BaseException:
            publisher.strict_end(confirm=False)
            raise
        publisher.strict_end()
        return result

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"channel": self.channel,
                               "subscriber_here": bool(self.election and self.election.elected)}
        out.update(self.publisher.stats())
        out.update(self.host.stats() if self.host else {"host_fresh": False})
        return out

    def stop(self) -> None:
        """Leave the election and stop subscribing: tests, and a process's exit
        with strict writes (the subscriber then gives its lease back)."""
        if self.election is not None:
            self.election.stop()


_links: dict[int, ClusterLink] = {}
_lock = threading.Lock()


def _never_fresh() -> bool:
    return False


def link_table(table: GenerationTable, url: str, channel: str, *,
               heartbeat_every: float = HEARTBEAT_EVERY, stale_after: float = STALE_AFTER,
               elect_every: float = ELECT_EVERY,
               strict_lease: float | None = None,
               strict_keys: tuple[bytes, ...] = ()) -> ClusterLink:
    """Link ``table`` to the hosts that publish on ``channel`` at the redis ``url``.

    Idempotent per table in a process (the first call's arguments stay). Raises
    ``ValueError`` for a URL it cannot use. When the host file cannot be opened
    (disk full, a file of another user), the guard never passes: L1 hits stay
    off on this host (logged), never silently stale; its writes are still
    published (under a host id of the process's own), so that the other hosts
    hear them. ``strict_lease``: seconds of the host's lease for strict writes
    (``strict.py``); None, no strict writes and no lease. ``strict_keys``: the
    key that signs this host's lease values and acks, then any others accepted
    from other hosts (derived from ``SECRET_KEY`` and its fallbacks); required
    with ``strict_lease``.
    """
    if strict_lease is not None and not strict_keys:
        raise ValueError("strict writes need a key to sign leases and acks with")
    address = parse_url(url)
    with _lock:
        link = _links.get(id(table))
        if link is not None and link.table is table:
            return link
        try:
            host: HostFile | None = open_host_file(table.path)
        except (OSError, SharedFileError) as exc:
            log.error("cross-host coherence: cannot open %s.cluster (%s); L1 hits stay off",
                      table.path, exc)
            host = None
        # No host file, no host id: the process publishes under one of its own
        # (no host hears its echoes but itself, and it runs no subscriber).
        host_id = host.host_id if host is not None else tokens.next() or 1
        own = channel_id(host_id).hex()
        strict = (None if strict_lease is None
                  else StrictWriter(address, channel, own, strict_lease, strict_keys))
        publisher = Publisher(address, channel, host_id, strict=strict)
        table.outlet = publisher.enqueue
        if host is None:
            table.guard = _never_fresh
            link = ClusterLink(table, url, channel, None, publisher, None, stale_after,
                               strict_lease)
        else:
            lease = (None if strict_lease is None
                     else Lease(channel, own, strict_lease, strict_keys[0]))
            subscriber = Subscriber(address, channel, table, host, heartbeat_every, stale_after,
                                    lease)
            election = Election(table.path + ".cluster.lock", subscriber, elect_every)
            table.guard = host.guard(stale_after)
            link = ClusterLink(table, url, channel, host, publisher, election, stale_after,
                               strict_lease)
            election.start()
            if lease is not None:
                # A clean exit gives the lease back (Subscriber._withdraw), so
                # that a host whose processes all exit does not stall the other
                # hosts' strict writes for up to one lease.
                atexit.register(link.stop)
        _links[id(table)] = link
        return link


def linked(table: GenerationTable) -> ClusterLink | None:
    """The link of ``table`` in this process, if any."""
    link = _links.get(id(table))
    return link if link is not None and link.table is table else None
