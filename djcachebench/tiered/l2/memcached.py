"""Django's memcached backends as the L2 (``PyMemcacheCache``, ``PyLibMCCache``).

memcached cannot tell the expiry of what a read returns (the L1 keeps only
values whose expiry is known from the write: its own, or one published on the
value board), keeps whole seconds counted on a clock that ticks once a second,
and a server spelled without a port is on 11211. Those two hold for every
subclass of ``BaseMemcachedCache``: they are the server's. How a client fails
is its own: ``PyLibMCCache`` raises on writes but answers a read of a server
that stopped answering with a miss, ``PyMemcacheCache`` raises unless its
``ignore_exc`` option turns failures into misses.
"""

from __future__ import annotations

import math
import time
from typing import Any

from djcachebench.tiered.l2.base import FailureProbe, L2Adapter, WrittenExpiry, never_fails
from djcachebench.tiered.l2.generic import GenericAdapter

__all__ = ["CLASSES"]

#: memcached takes an expiry over 30 days as a Unix time, in 32 bits.
_RELATIVE_MAX = 30 * 24 * 3600
_TIME_MAX = 2**31 - 1


def _memcached_life(timeout: float) -> float:
    """memcached's rule: past 30 days the timeout becomes a Unix time (Django
    adds the current one), and one past 2**31 - 1 is a value memcached does not
    keep at all (it answers a miss at once): then the L1 keeps nothing either,
    or its writer would serve what no other process can read."""
    if timeout > _RELATIVE_MAX and (
            not math.isfinite(timeout) or int(timeout) + int(time.time()) > _TIME_MAX):
        return 0.0
    return float(math.floor(timeout) - 1)


def _written_expiry(timeout: float, now: float) -> float:
    return now + _memcached_life(timeout)


class MemcachedDescendant(GenericAdapter):
    """Any memcached backend: how the server keeps time, nothing of the client."""

    default_port = 11211

    def written_expiry(self) -> WrittenExpiry:
        return _written_expiry


class PyLibMCAdapter(MemcachedDescendant):
    descendant = MemcachedDescendant

    def known_failure_probe(self) -> FailureProbe | None:
        return never_fails  # its writes raise (ServerDown, ...)

    def known_read_failure_probe(self) -> FailureProbe | None:
        # Its get of a server that stopped answering returns the default after
        # its poll timeout, as for a missing key: an absence kept from such a
        # read would be served after the server is back, though the key was
        # written before (until a write of the key, or L1_TIMEOUT).
        return None


class PyMemcacheAdapter(MemcachedDescendant):
    descendant = MemcachedDescendant

    def known_failure_probe(self) -> FailureProbe | None:
        # Reads the backend's private ``_options``: the client options Django
        # keeps from OPTIONS, where ``ignore_exc`` is; no public attribute has them.
        options: Any = getattr(self.l2, "_options", {})
        return None if options.get("ignore_exc") else never_fails


MemcachedDescendant.descendant = MemcachedDescendant

CLASSES: dict[str, type[L2Adapter]] = {
    "django.core.cache.backends.memcached.BaseMemcachedCache": MemcachedDescendant,
    "django.core.cache.backends.memcached.PyMemcacheCache": PyMemcacheAdapter,
    "django.core.cache.backends.memcached.PyLibMCCache": PyLibMCAdapter,
}
