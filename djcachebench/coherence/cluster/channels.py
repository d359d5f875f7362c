"""Channel names: each host publishes on its own; each subscriber hears every other host's.

Why: with one channel for all hosts, redis delivers every message to every
subscriber, the writer's own host's included. That subscriber can only drop it
(its host's stamps are already in the table), but it is woken for it: a
process scheduled once per write of its own host, competing with the writer for
a core (``bench/cluster_stress.py wakeup`` measures that CPU per message;
docs/benchmarks.md).

So host ``h`` publishes on ``<base>:<id>``, where ``id`` is :data:`ID_BYTES`
bytes derived from ``h``, and a subscriber subscribes with one pattern per byte
position ``i``: the channels whose id agrees with its own on the first ``i``
bytes and differs at byte ``i`` (``<base>:<own[:i]>[^<own[i]>]*``). The patterns
are disjoint (a channel's first differing byte is unique), so every other
host's message arrives exactly once, and together they match every id but the
subscriber's own, so its own host's messages never leave redis. No registry of
hosts is needed and a new host is heard from its first message: the patterns
match ids that do not exist yet.

Why raw bytes, and only 6 of them: redis matches every ``PUBLISH`` against every
pattern subscription, one pattern per id byte per host, and that is the cost
this scheme adds on the server (``bench/cluster_stress.py fanout``). Bytes give
the fewest symbols for an id; 48 bits keep two hosts of a 1,000-host cluster
from sharing an id with a probability of about 2e-9 (two that did would not
hear each other). The id is a hash of the 64-bit host id, so it is uniform
whatever the host ids look like.

This module imports nothing from Django.
"""

from __future__ import annotations

import hashlib
from typing import Final

__all__ = ["ID_BYTES", "channel_id", "host_channel", "other_hosts_patterns",
           "patterns_excluding"]

#: Bytes of a host's id in its channel name (one pattern each per subscriber).
ID_BYTES: Final = 6
#: Bytes a redis glob pattern reads as syntax; escaped with a backslash.
_SPECIAL: Final = frozenset(b"*?[]\\^-")


def _literal(data: bytes) -> bytes:
    """``data`` matched literally by a redis glob pattern (outside or inside ``[]``)."""
    return b"".join(b"\\" + bytes((c,)) if c in _SPECIAL else bytes((c,)) for c in data)


def channel_id(host_id: int) -> bytes:
    """The :data:`ID_BYTES` bytes naming host ``host_id``'s channel."""
    return hashlib.blake2b(host_id.to_bytes(8, "little"), digest_size=ID_BYTES,
                           person=b"djcb-channel").digest()


def host_channel(base: str, host_id: int) -> bytes:
    """The channel host ``host_id`` publishes its invalidations on."""
    return base.encode() + b":" + channel_id(host_id)


def patterns_excluding(base: str, own: bytes) -> list[bytes]:
    """Patterns that match ``<base>:<id>`` for every id of ``len(own)`` bytes but
    ``own``, each such channel by exactly one pattern."""
    prefix = _literal(base.encode() + b":")
    return [prefix + _literal(own[:i]) + b"[^" + _literal(own[i:i + 1]) + b"]*"
            for i in range(len(own))]


def other_hosts_patterns(base: str, host_id: int) -> list[bytes]:
    """The patterns of host ``host_id``'s subscriber: every other host's channel."""
    return patterns_excluding(base, channel_id(host_id))
