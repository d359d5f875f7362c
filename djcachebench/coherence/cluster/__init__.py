"""Coherence across hosts: invalidations carried through Redis pub/sub.

One subscriber per host (elected by a lock file) stamps the host's generation
table with what the other hosts wrote; a heartbeat in a shared file beside the
table says whether it is connected and caught up, and the table's guard serves
L1 hits only while it is. ``link_table`` wires a table in. Django-free.
"""

from djcachebench.coherence.cluster.link import (
    BOUND,
    HEARTBEAT_EVERY,
    STALE_AFTER,
    ClusterLink,
    link_table,
    linked,
)

__all__ = ["BOUND", "HEARTBEAT_EVERY", "STALE_AFTER", "ClusterLink", "link_table", "linked"]
