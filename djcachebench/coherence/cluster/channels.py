"""Channel names: each host publishes on its own; each subscriber hears every other host's.

Why: with one channel for all hosts, redis delivers every message to every
subscriber, the writer's own host's included. That subscriber can only drop it
(its host's stamps are already in the table), but it is woken for it: a
process scheduled once per write of its own host, competing with the writer for
a core. Measured on a 2-core machine, that wake-up was the largest part of what
publishing added to a set (docs/benchmarks.md, TieredCache over redis).

So host ``h`` publishes on ``<base>:<h as 16 hex digits>``, and a subscriber
subscribes with one pattern per hex position ``i``: the channels whose host
part agrees with its own on the first ``i`` digits and differs at digit ``i``
(``<base>:<own[:i]>[^<own[i]>]*``). The 16 patterns are disjoint (a channel's
first differing digit is unique), so every other host's message arrives
exactly once, and they cover every host id but the subscriber's own, so its own
host's messages never leave redis. No registry of hosts is needed and a new
host is heard from its first message: the patterns match ids that do not exist
yet.

Cost on the server: a ``PUBLISH`` is matched against every pattern of every
subscriber, 16 per host (prefix comparisons, tens of nanoseconds each).

This module imports nothing from Django.
"""

from __future__ import annotations

from typing import Final

__all__ = ["DIGITS", "host_channel", "host_id_text", "other_hosts_patterns"]

#: Hex digits of a host id in its channel name (ids are 64-bit).
DIGITS: Final = 16
_GLOB_SPECIAL: Final = frozenset("*?[]\\^")


def _escape(text: str) -> str:
    """``text`` matched literally by a redis glob pattern."""
    return "".join("\\" + c if c in _GLOB_SPECIAL else c for c in text)


def host_id_text(host_id: int) -> str:
    """The host id as it appears in channel names."""
    if not 0 <= host_id < 1 << (4 * DIGITS):
        raise ValueError(f"host id out of range: {host_id!r}")
    return f"{host_id:0{DIGITS}x}"


def host_channel(base: str, host_id: int) -> str:
    """The channel host ``host_id`` publishes its invalidations on."""
    return f"{base}:{host_id_text(host_id)}"


def other_hosts_patterns(base: str, host_id: int) -> list[str]:
    """Patterns matching the channel of every host id but ``host_id``, each once."""
    own = host_id_text(host_id)
    prefix = _escape(base) + ":"
    return [f"{prefix}{own[:i]}[^{own[i]}]*" for i in range(DIGITS)]
