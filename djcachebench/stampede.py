"""Stampede protection for ``get_or_set``: one caller computes, the others wait for it.

Why: Django's ``get_or_set`` on a missing key runs the callable in every process
that asks at once. For a slow view behind ``cache_page`` or a heavy query behind
``get_or_set``, an expiry turns into N identical computations at the worst
moment (a dogpile). Here the first caller takes a *lease*: an ``add`` of a lease
key next to the value's key. ``add`` is atomic in the cache that holds it, so
exactly one caller wins it, on the host (ShardedSQLiteCache, TieredCache over
it) or across hosts (TieredCache over redis or memcached). The winner computes
and stores the value, then drops the lease; the others poll the value's key and
return the value as soon as it is there.

Bounds, so nothing waits forever:

* The lease key expires by itself after the lease time: if the computing process
  dies (SIGKILL), the next waiter whose ``add`` succeeds takes over, within one
  lease time.
* A waiter waits at most twice the lease time in all; then it computes the
  value itself, as Django's ``get_or_set`` would have (a stuck or very slow
  computation costs at most one extra computation per waiter, never a hang).
* If the lease cannot be taken because the cache fails (an exception from
  ``add``), the caller computes without protection: the cache being down must
  not make a request fail that Django's own ``get_or_set`` would serve.

What a waiter gets is the value the computing caller stored (the same object
``get`` would return). A non-callable default needs no protection (nothing to
compute) and follows Django's ``get_or_set`` exactly.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from typing import Any

__all__ = ["LEASE_PREFIX", "protected_get_or_set"]

#: The lease key is this prefix and the caller's key, with the caller's version.
LEASE_PREFIX = "djcb-lease:"
_FIRST_PAUSE = 0.001
_LONGEST_PAUSE = 0.01


def protected_get_or_set(cache: Any, key: Any, default: Any, timeout: Any, version: Any,
                         lease: float, missing: Any,
                         sleep: Callable[[float], None] = time.sleep) -> Any:
    """Django's ``get_or_set`` on ``cache``, with one computation of ``default``
    across every caller that shares the cache's store (see the module doc).

    ``missing`` is a sentinel no cached value can be; ``lease`` the lease time in
    seconds.
    """
    value = cache.get(key, missing, version=version)
    if value is not missing:
        return value
    if not callable(default) or not isinstance(key, str):
        return _unprotected(cache, key, default, timeout, version)
    lease_key = LEASE_PREFIX + key
    # Whole seconds: memcached and redis keep no less, and a lease may only be longer.
    lease_timeout = max(1, math.ceil(lease))
    give_up_at = time.monotonic() + 2 * lease
    holder = uuid.uuid4().hex
    pause = _FIRST_PAUSE
    try_lease = True
    while True:
        if try_lease:
            try:
                won = cache.add(lease_key, holder, lease_timeout, version=version)
            except Exception:  # the cache is failing: do what Django's get_or_set does
                return _unprotected(cache, key, default, timeout, version)
            if won:
                try:
                    # The value may have been stored, and its lease dropped, between
                    # this caller's last read and its add: a lease won after a
                    # finished computation must not start another one.
                    value = cache.get(key, missing, version=version)
                    if value is not missing:
                        return value
                    computed = default()
                    cache.add(key, computed, timeout=timeout, version=version)
                    return cache.get(key, computed, version=version)
                finally:
                    _release(cache, lease_key, holder, version)
        sleep(pause)
        pause = min(pause * 2, _LONGEST_PAUSE)
        value = cache.get(key, missing, version=version)
        if value is not missing:
            return value
        if time.monotonic() >= give_up_at:
            return _unprotected(cache, key, default, timeout, version)
        # Waiters read; only when the lease is gone (released without a value, or
        # expired with its holder) do they race for it again. A write per poll
        # from every waiter would slow the one computation they wait for.
        try_lease = cache.get(lease_key, None, version=version) is None


def _unprotected(cache: Any, key: Any, default: Any, timeout: Any, version: Any) -> Any:
    if callable(default):
        default = default()
    cache.add(key, default, timeout=timeout, version=version)
    return cache.get(key, default, version=version)


def _release(cache: Any, lease_key: str, holder: str, version: Any) -> None:
    """Drop the lease if it is still ours (it may have expired and been taken).

    Read-then-delete is not atomic: a computation that outlived its lease can,
    in that narrow window, drop the lease of the caller that took over, letting a
    third caller compute as well. Never a wrong value, at most one more run.
    """
    try:
        if cache.get(lease_key, None, version=version) == holder:
            cache.delete(lease_key, version=version)
    except Exception:  # the lease expires by itself
        pass
