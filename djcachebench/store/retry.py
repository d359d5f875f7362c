"""Bounded waiting for a shard's lock: the retry policy and the give-up error.

Why not SQLite's own busy handler: ``sqlite3.connect(timeout=...)`` installs
SQLite's default busy handler, which sleeps 1, 2, 5, 10, ... milliseconds
between attempts. A write to a shard holds its lock for tens of microseconds,
so the first 1 ms sleep alone is many times the wait that was needed; such
sleeps make most of diskcache's set tail on a busy host (docs/benchmarks.md).
We open connections
with a zero busy timeout and wait in Python instead, starting at tens of
microseconds and doubling, so a waiter gets the lock soon after it is free.

A policy is: one *attempt* waits up to ``lock_timeout`` seconds for the lock
(short sleeps); when that is spent, up to ``retries`` further attempts follow,
each after an exponential, jittered back-off of ``backoff * 2**n`` seconds.
Nothing ever waits forever: the worst case is bounded by :meth:`worst_case`.
"""

from __future__ import annotations

import functools
import math
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar


class CacheUnavailable(Exception):
    """A cache operation could not be carried out (and RAISE_ON_TIMEOUT asked to know)."""


class ShardLockTimeout(CacheUnavailable):
    """A shard stayed locked for longer than the retry policy allows."""

    def __init__(self, path: str, waited: float) -> None:
        super().__init__(f"shard {path} stayed locked for {waited:.3f}s; gave up")
        self.path = path
        self.waited = waited


# For the first BUSY_SPIN seconds a waiter retries without sleeping: a shard's
# lock is usually held for tens of microseconds by a writer running on the
# other core, and a
# sleep costs a trip through the scheduler, which on an oversubscribed host
# can be milliseconds before the waiter runs again.
BUSY_SPIN = 60e-6
# Each retry of the spin first yields the core: on a host with more runnable
# processes than cores the lock's holder may be waiting for this very core,
# and a bare retry loop only burnt the time it needed (on an idle core the
# yield returns at once).
_yield = getattr(os, "sched_yield", lambda: None)
# The first in-attempt sleep and its cap. time.sleep() on Linux rounds so short
# a request up (timer slack), which still leaves it far below SQLite's 1 ms
# first step.
FIRST_SPIN = 20e-6
MAX_SPIN = 1e-3


@dataclass(frozen=True)
class RetryPolicy:
    """How long to wait for a busy shard before giving up."""

    lock_timeout: float = 0.25
    retries: int = 2
    backoff: float = 0.02

    def worst_case(self) -> float:
        """Upper bound, in seconds, of the time one operation may wait (jitter at most x1.5)."""
        backoffs = sum(self.backoff * 2**n * 1.5 for n in range(self.retries))
        return (self.retries + 1) * (self.lock_timeout + MAX_SPIN) + backoffs

    def backoff_delay(self, retry_index: int) -> float:
        """The jittered pause before further attempt ``retry_index`` (0-based)."""
        return self.backoff * 2**retry_index * (0.5 + random.random())


class CallBudget(threading.local):
    """One call's allowance for waiting on locks, across every shard it touches.

    Why: the policy bounds one attempt on one shard, but a call may wait on
    several: ``set_many`` over locked shards, a ``set`` whose cull meets the
    same locked shard twice. If each waited the whole policy, a call could
    wait many times :meth:`RetryPolicy.worst_case`. Between :meth:`enter` and
    :meth:`leave` (``within_budget``),
    all the waits of this thread share one budget of ``worst_case()``, counted
    from its first wait; past it, a busy shard gives up at once. ``until``:
    None outside a call, 0.0 in a call that has not waited yet, else the
    monotonic time the budget ends.
    """

    until: float | None = None

    def enter(self) -> bool:
        """Start a call's budget unless one is in force; True if this one did."""
        if self.until is not None:
            return False
        self.until = 0.0
        return True

    def leave(self, entered: bool) -> None:
        if entered:
            self.until = None

    def pause(self, seconds: float) -> None:
        """Time spent inside the call on something else than waiting for a lock
        (``get_or_set``'s computation) does not use up its budget."""
        if self.until:
            self.until += seconds

    def deadline(self, now: float, policy: RetryPolicy) -> float:
        """When waiting must end for this call (``inf`` outside one)."""
        until = self.until
        if until is None:
            return math.inf
        if not until:
            until = self.until = now + policy.worst_case()
        return until


budget = CallBudget()

F = TypeVar("F", bound=Callable[..., Any])


def within_budget(method: F) -> F:
    """Run a call that may wait on several shards under one :class:`CallBudget`."""

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        entered = budget.enter()
        try:
            return method(*args, **kwargs)
        finally:
            budget.leave(entered)

    return call  # type: ignore[return-value]


def not_a_wait(default: Any) -> Any:
    """``get_or_set``'s ``default``, made so that the time its computation takes
    does not use up the call's budget (:meth:`CallBudget.pause`): a slow view is
    not a wait on a lock. A value that is not callable is returned as it is."""
    if not callable(default):
        return default

    def compute() -> Any:
        started = time.monotonic()
        try:
            return default()
        finally:
            budget.pause(time.monotonic() - started)

    return compute


def spin_sleep(spin: float, deadline: float, started: float) -> float:
    """Wait before the next try: nothing at first, then ``spin`` seconds; return the next spin."""
    now = time.monotonic()
    if now - started < BUSY_SPIN:
        _yield()
        return spin
    remaining = deadline - now
    if remaining > 0:
        time.sleep(min(spin, remaining))
    return min(spin * 2, MAX_SPIN)
