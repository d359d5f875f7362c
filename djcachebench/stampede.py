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
* A waiter waits at most twice the lease time in all; then it does what
  Django's ``get_or_set`` would have done: reads the key (a process that took
  the lease over may have stored it), and computes only on a miss (a stuck or
  very slow computation costs at most one extra computation per waiter, never
  a hang).
* If the lease cannot be taken because the cache fails (an exception from
  ``add``), the caller computes without protection: the cache being down must
  not make a request fail that Django's own ``get_or_set`` would serve.

Callers of one process wait together: the first caller of the process that
misses a key (its *leader*) takes part in the protocol above for all of them,
and the others block on an event it sets when it returns, then read the key
once. So a process of many threads (gunicorn's ``gthread`` workers, an ASGI
server's thread pool) makes one caller's cache reads while it waits, not one
per thread; threads that woke every few milliseconds to poll the cache took
the CPU and the GIL from the requests still being read, in the very processes
that were to serve the value. A thread that calls ``get_or_set`` of the key it
is computing (from inside its own ``default``) computes it unprotected at once
instead of waiting for itself. A leader that returns without a value the others
can read (its computation raised, or the store did not keep what it stored)
wakes them, and they start over: one of them leads. If that one fails too, the
rest compute each for itself, side by side (an outage must not make callers
take turns failing); across processes, such computations are counted in the
store (:data:`FAILED_PREFIX`) for the same rule, which every leader reads
before it takes a lease, waking its process's waiting callers before it
computes itself. So during an outage a caller waits for at most two failed
computations, then computes beside the others. A timeout of 0 or less stores
nothing there is to wait for, nor does less than a second in a store that
keeps whole seconds (``readable_after_set``): every caller computes, as in
Django. Followers keep the bound below: they wait at most twice the lease time
in all, then do what Django's ``get_or_set`` does (read, then compute).

``aget_or_set`` runs the same protocol in asgiref's thread-sensitive thread,
as Django runs every sync cache call of an async view. If the task awaiting it
is cancelled (an ASGI server cancels a view whose client went away), it
returns at once, and the thread stops waiting at its next poll
(``djcachebench/abandon.py``): asgiref alone would hold both the cancelled
task and the thread until the wait's bound, twice the lease. A computation already
running is not interrupted; its value is stored for the others, as usual.

What a waiter gets is the value the computing caller stored (the same object
``get`` would return). A non-callable default needs no protection (nothing to
compute) and follows Django's ``get_or_set`` exactly.

Early refresh (``OPTIONS["EARLY_REFRESH"] = beta``, off by default): the lease
keeps an expiry from making N computations, but every caller that asks after it
still waits one whole computation. With early refresh, a hit may recompute the
value *before* it expires, with a probability that rises as the expiry nears
and with the computation's cost (the XFetch rule of Vattani, Chierichetti and
Lowenstein, "Optimal Probabilistic Cache Stampede Prevention", VLDB 2015): a
caller refreshes when ``now - delta * beta * ln(u) >= expiry``, ``u`` uniform
in (0, 1], ``delta`` the last computation's duration. beta = 1 is the paper's
choice; larger refreshes earlier. The refreshing caller takes the same lease
(so one refresh at a time across the store) and replaces the value with
``set``, unless the key was written or deleted while it computed (its value
is then newer than what the refresh computed from, and stays); every other
caller keeps getting the current value meanwhile, without waiting. ``delta``
and the expiry live in a side key (:func:`side_key`:
:data:`XFETCH_PREFIX` and the key, at a version of their own) with the value's
timeout, never inside the value: a plain ``get`` of the key returns exactly
what was stored. A refresh whose computation raises
logs it and returns the value it had, which has not expired.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import pickle
import random
import threading
import time
import uuid
from collections.abc import Callable, Hashable
from typing import Any

from django.core.cache.backends.base import DEFAULT_TIMEOUT

from djcachebench import abandon
from djcachebench.keys import MEMCACHE_BAD_CHARS

__all__ = ["EARLY_REFRESH_ALLOWED", "FAILED_PREFIX", "LEASE_PREFIX", "SIDE_VERSION",
           "SIDE_VERSION_BASE", "XFETCH_PREFIX", "check_early_refresh", "protected_get_or_set",
           "side_key"]

log = logging.getLogger("djcachebench.stampede")

#: The lease key is this prefix and the caller's key (at the side version, below).
LEASE_PREFIX = "djcb-lease:"
#: Early refresh: (delta seconds, expiry as a Unix time, digest) of the key's value.
XFETCH_PREFIX = "djcb-xfetch:"
#: How many computations of the key raised lately (life: one lease), across processes.
FAILED_PREFIX = "djcb-failed:"
#: The side keys' version is this less the caller's (an int version), or the
#: caller's with ``-djcb`` appended (any other version). Why a version of their
#: own: a site may store keys a visitor chose (a slug, a search term); at the
#: caller's own version ``djcb-lease:popular`` could be such a key, and then
#: every ``get_or_set`` of ``popular`` waited its whole bound for a lease nobody
#: held. Why an int for an int: a custom ``KEY_FUNCTION`` may format the
#: version as a number (``"%s:%d:%s"``), and a string version would make every
#: ``get_or_set`` miss raise ``TypeError``.
#: No site counts its versions down past -2**31.
SIDE_VERSION_BASE = -(2**31)
SIDE_VERSION = "-djcb"

#: What ``OPTIONS["EARLY_REFRESH"]`` accepts (both backends).
EARLY_REFRESH_ALLOWED = ("a number > 0 (the XFetch beta; 1.0 is the usual choice), or None "
                         "(the default) to turn it off")


#: Django warns about (and memcached refuses) final keys longer than this.
_KEY_ROOM = 250


def side_key(cache: Any, prefix: str, key: str, version: Any = None) -> tuple[str, Any]:
    """``(key, version)`` of the side key ``prefix`` (a lease or an early-refresh
    note) of ``key`` at ``version`` (``None``: the cache's own).

    A caller's key close to the length limit would make a side key past it:
    Django would warn three times per ``get_or_set`` of a valid key, and
    memcached would refuse the lease, leaving the key unprotected. Such a side
    key names a digest of the key instead,
    after the prefix with ``#`` for its colon: no caller's key can make that
    name, since every other side key has the colon there.
    """
    side = side_version(cache.version if version is None else version)
    name = prefix + key
    if _warned(key) or len(cache.make_key(name, version=side)) > _KEY_ROOM:
        digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16)
        name = f"{prefix[:-1]}#{digest.hexdigest()}"
    return name, side


def side_version(version: Any) -> Any:
    """The side keys' version for the caller's ``version`` (see SIDE_VERSION_BASE)."""
    if isinstance(version, int):
        return SIDE_VERSION_BASE - version
    return f"{version}{SIDE_VERSION}"


def _warned(key: str) -> bool:
    """Would Django warn about a character of ``key``? Its side keys then get the
    digest name: the caller is warned about its own key once per call, not again
    for each side key, which would make a ``get_or_set`` warn more than Django's."""
    return MEMCACHE_BAD_CHARS(key) is not None


def lease_seconds(lease: float) -> int:
    """The lease as it is stored: whole seconds, at least one (a lease may only
    be longer than asked, never shorter)."""
    return max(1, math.ceil(lease))


def check_early_refresh(early: float | None, lease: float | None, where: str) -> str | None:
    """Why these options cannot go together (None: they can). Early refresh
    takes the stampede lease, so it needs one."""
    if early is not None and lease is None:
        return (f"{where}['EARLY_REFRESH'] = {early!r} needs the stampede lease; allowed with "
                f"{where}['STAMPEDE_LEASE'] = None: only None.")
    return None

_FIRST_PAUSE = 0.001
# One caller per process polls (the others wait on its event), so a short cap
# costs little and brings the value to every waiter of the process sooner.
_LONGEST_PAUSE = 0.005
# How often a waiter reads the lease (to take over a lease that expired with its
# holder, or was dropped without a value): not at every poll, since every read
# of a waiter takes CPU from the one computation all of them wait for.
_LEASE_CHECK_EVERY = 0.1


class _Flight:
    """The callers of this process waiting for one key: its leader's thread, the
    event the leader sets when it returns (or raises), and whether it returned
    because its async caller was cancelled (not a failure: see
    ``protected_get_or_set``)."""

    __slots__ = ("abandoned", "done", "leader")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.leader = threading.get_ident()
        self.abandoned = False


# (scope, final key) -> the flight of this process for that key.
_flights: dict[tuple[Hashable, str], _Flight] = {}
_flights_lock = threading.Lock()


def _forget_flights() -> None:
    """In a forked child: its parent's flights have no leader thread here, and the
    lock may have been held by a thread that did not come along."""
    global _flights_lock
    _flights.clear()
    _flights_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_flights)


def protected_get_or_set(cache: Any, key: Any, default: Any, timeout: Any, version: Any,
                         lease: float, missing: Any,
                         sleep: Callable[[float], None] = time.sleep,
                         early: float | None = None,
                         uniform: Callable[[], float] = random.random,
                         scope: Hashable = None) -> Any:
    """Django's ``get_or_set`` on ``cache``, with one computation of ``default``
    across every caller that shares the cache's store (see the module doc).

    ``missing`` is a sentinel no cached value can be; ``lease`` the lease time in
    seconds; ``early`` the early-refresh beta (None: off); ``uniform`` draws in
    [0, 1). ``scope`` names the store (callers of one process with the same
    scope and final key wait together); any scope is safe, since a follower
    reads its own cache after waking, but two stores under one scope would wait
    for each other's computations needlessly.
    """
    value = cache.get(key, missing, version=version)
    if value is not missing:
        # Only a call that would store may refresh: with a timeout of 0 or
        # less, Django's get_or_set of a hit writes nothing, and a refresh
        # would delete the live key.
        if (early is not None and callable(default) and isinstance(key, str)
                and _stores(cache, timeout)):
            return _maybe_refresh(cache, key, value, default, timeout, version, lease,
                                  early, uniform)
        return value
    if not callable(default) or not isinstance(key, str) or not _stores(cache, timeout):
        return _unprotected(cache, key, default, timeout, version)
    # The lease is stored in whole seconds (memcached and redis keep no less),
    # and the bound must count in that lease: at 0.5 s or less, twice the
    # lease as set would end every wait before a dead holder's lease could
    # expire, so every waiter would compute.
    lease = lease_seconds(lease)
    give_up_at = time.monotonic() + 2 * lease
    flight_key = (scope, cache.make_key(key, version=version))
    empty_wakes = 0
    while True:
        with _flights_lock:
            flight = _flights.get(flight_key)
            if flight is None:
                flight = _flights[flight_key] = _Flight()
                leads = True
            else:
                leads = False
        if leads:
            def release(flight: _Flight = flight) -> None:
                """Wake this process's callers waiting for ``flight`` (and let a
                new caller start a flight of its own)."""
                with _flights_lock:
                    if _flights.get(flight_key) is flight:
                        del _flights[flight_key]
                flight.done.set()

            try:
                return _lead(cache, key, default, timeout, version, lease, missing, sleep,
                             early, give_up_at, release)
            except abandon.Abandoned:
                flight.abandoned = True
                raise
            finally:
                release()
        if flight.leader == threading.get_ident():
            # Called from inside this thread's own computation of the key: nobody
            # else will compute it for this call.
            return _unprotected(cache, key, default, timeout, version)
        if not abandon.wait(flight.done, max(0.0, give_up_at - time.monotonic())):
            # Django's get_or_set reads first: the value may be there by now,
            # stored by a process that took over.
            return _unprotected(cache, key, default, timeout, version, read_first=missing)
        value = cache.get(key, missing, version=version)
        if value is not missing:
            return value
        # The leader returned without a value the others can read (its
        # computation raised, or the cache did not keep what it stored). Once,
        # start over: one of this process's callers leads, so that a passing
        # failure costs one more computation, not one per caller. A second
        # time, each caller computes for itself, as Django's get_or_set would
        # have: taking turns, the k-th caller would wait k computations during an
        # outage. A leader whose async caller was cancelled stopped waiting; it
        # did not fail.
        if flight.abandoned:
            continue
        empty_wakes += 1
        if empty_wakes >= 2 or _failed_lately(cache, key, version) >= 2:
            return _unprotected(cache, key, default, timeout, version)


def _failed_lately(cache: Any, key: str, version: Any) -> int:
    """How many computations of ``key`` raised within the last lease time, in
    any process (0 if the cache cannot tell)."""
    try:
        fail_key, side = side_key(cache, FAILED_PREFIX, key, version)
        count = cache.get(fail_key, 0, version=side)
    except Exception:
        return 0
    return count if type(count) is int else 0


def _count_failure(cache: Any, key: str, version: Any, life: int) -> None:
    """A computation of ``key`` raised: count it for the other processes' waiters
    (:func:`_failed_lately`), for one lease time."""
    try:
        fail_key, side = side_key(cache, FAILED_PREFIX, key, version)
        if not cache.add(fail_key, 1, life, version=side):
            cache.incr(fail_key, version=side)
    except Exception:  # expired in between, or the cache fails: the count is advice
        pass


def _stores(cache: Any, timeout: Any) -> bool:
    """Will a value stored with ``timeout`` be readable at all? Not with a
    timeout of 0 or less (Django: expire at once): then there is nothing for
    waiters to wait for, and each caller computes, as Django's get_or_set.

    Nor, where the store keeps whole seconds (Django's ``RedisCache`` and the
    memcached backends, under a TieredCache), with less than a second: such a
    store keeps nothing, and the callers would queue for leases that never
    leave a value, one computation after another.
    A cache says so through ``readable_after_set(seconds)``."""
    seconds = cache.default_timeout if timeout is DEFAULT_TIMEOUT else timeout
    if seconds is None:
        return True
    try:
        seconds = float(seconds)
    except (TypeError, ValueError):
        return True  # the cache's own set will say what is wrong with it
    if not seconds > 0:
        return False
    readable = getattr(cache, "readable_after_set", None)
    return True if readable is None else bool(readable(seconds))


def _lead(cache: Any, key: str, default: Callable[[], Any], timeout: Any, version: Any,
          lease: float, missing: Any, sleep: Callable[[float], None], early: float | None,
          give_up_at: float, release: Callable[[], None]) -> Any:
    """The protocol of the module doc for this process's callers of ``key``:
    take the lease and compute, or poll the value until its holder stores it.
    ``release()`` wakes this process's other callers early (an outage: see below)."""
    lease_key, side = side_key(cache, LEASE_PREFIX, key, version)
    # Whole seconds: memcached and redis keep no less, and a lease may only be longer.
    lease_timeout = lease_seconds(lease)
    holder = uuid.uuid4().hex
    pause = _FIRST_PAUSE
    try_lease = True
    lease_check_at = 0.0  # the first poll reads it
    # Backends that turn a failure into a refusal (ShardedSQLiteCache's add is
    # False when its shard cannot be reached) say so through their failure
    # count: a lease that could not be taken for that reason is not one that
    # somebody holds, and waiting for it would wait out the whole bound. Both
    # backends of this package declare it (a TieredCache its L2's, where the
    # L2 can tell); other backends' refusals are taken as held leases.
    failures = getattr(cache, "tiered_failure_count", None)
    while True:
        if try_lease:
            if _failed_lately(cache, key, version) >= 2:
                # Two computations raised within a lease (an outage): each caller
                # computes for itself, as Django's get_or_set would. Taking turns
                # at the lease, the k-th waiting process would wait k computations
                # (the same rule as this process's callers follow after a second
                # empty wake, above). Checked before every lease, a first one
                # included, and this process's callers are woken first, to compute
                # beside this one rather than after it (else they would still
                # compute one after another).
                release()
                return _unprotected(cache, key, default, timeout, version)
            before = None if failures is None else failures()
            try:
                won = cache.add(lease_key, holder, lease_timeout, version=side)
            except Exception:  # the cache is failing: do what Django's get_or_set does
                return _unprotected(cache, key, default, timeout, version)
            if not won and failures is not None and failures() != before:
                return _unprotected(cache, key, default, timeout, version)
            if won:
                try:
                    # The value may have been stored, and its lease dropped, between
                    # this caller's last read and its add: a lease won after a
                    # finished computation must not start another one.
                    value = cache.get(key, missing, version=version)
                    if value is not missing:
                        return value
                    started = time.monotonic()
                    try:
                        computed = default()
                    except BaseException:
                        _count_failure(cache, key, version, lease_timeout)
                        raise
                    cache.add(key, computed, timeout=timeout, version=version)
                    stored = cache.get(key, missing, version=version)
                    if stored is missing:
                        # Nothing the waiters can read (a store that dropped it):
                        # counted as a failure, so that they do not queue for the
                        # lease one computation after another.
                        _count_failure(cache, key, version, lease_timeout)
                        return computed
                    if early is not None:
                        _note(cache, key, computed, time.monotonic() - started, timeout,
                              version)
                    return stored
                finally:
                    _release(cache, lease_key, holder, side)
        abandon.pause(sleep, pause)
        pause = min(pause * 2, _LONGEST_PAUSE)
        value = cache.get(key, missing, version=version)
        if value is not missing:
            return value
        if time.monotonic() >= give_up_at:
            return _unprotected(cache, key, default, timeout, version)
        # Waiters read; only when the lease is gone (released without a value, or
        # expired with its holder) do they race for it again. A write per poll
        # from every waiter would slow the one computation they wait for, and so
        # would a read of the lease at every poll: it is read every
        # _LEASE_CHECK_EVERY, which a takeover (after a lease time) hardly notices.
        now = time.monotonic()
        try_lease = False
        if now >= lease_check_at:
            lease_check_at = now + _LEASE_CHECK_EVERY
            try_lease = cache.get(lease_key, None, version=side) is None


def _maybe_refresh(cache: Any, key: str, value: Any, default: Callable[[], Any],
                   timeout: Any, version: Any, lease: float, beta: float,
                   uniform: Callable[[], float]) -> Any:
    """A hit: ``value``, or a fresh one if this caller draws an early refresh and
    wins the lease (see the module doc)."""
    try:
        note_key, side = side_key(cache, XFETCH_PREFIX, key, version)
        noted = cache.get(note_key, None, version=side)
    except Exception:  # the side key is an optimisation: never fail a hit for it
        return value
    if not (isinstance(noted, (tuple, list)) and len(noted) == 3  # msgpack gives a list
            and type(noted[0]) is float and type(noted[1]) is float
            and type(noted[2]) is str):
        return value  # nothing noted (a value set by other code), or not ours
    delta, expires, digest = noted
    if time.time() - delta * beta * math.log(1.0 - uniform()) < expires:
        return value
    if _digest(value) != digest or not _noted_write(cache, key, version, expires):
        # Not the write the note was made for: another write replaced it since
        # (a plain set, of a value that may never expire), and the note's expiry
        # is not its own: refreshed, such a value would expire with the note's
        # timeout. The digest alone is not enough: a set of an *equal* value
        # passes it.
        return value
    lease_key, side = side_key(cache, LEASE_PREFIX, key, version)
    holder = uuid.uuid4().hex
    try:
        if not cache.add(lease_key, holder, lease_seconds(lease), version=side):
            return value  # another caller refreshes (or computes) it now
    except Exception:
        return value
    try:
        started = time.monotonic()
        try:
            computed = default()
        except Exception:
            log.exception("early refresh of %r failed; serving the value it has", key)
            return value
        # A write of the key while we computed (a set, a delete) is newer than
        # what we computed from: storing ours would undo it until it expires.
        current = cache.get(key, _GONE, version=version)
        if not _unchanged(current, value):
            return computed if current is _GONE else current
        if not _noted_write(cache, key, version, expires):
            # An equal value set, or a touch, while we computed: its expiry is
            # not the note's, and the refresh would undo it (a set with
            # timeout=None would then expire).
            return current
        cache.set(key, computed, timeout=timeout, version=version)
        _note(cache, key, computed, time.monotonic() - started, timeout, version)
        return computed
    finally:
        _release(cache, lease_key, holder, side)


_GONE = object()

#: How far the stored expiry of the noted write may be from the note's (the
#: note is made just after the write, from the same timeout).
_NOTE_SLACK = 1.0


def _noted_write(cache: Any, key: str, version: Any, noted_expiry: float) -> bool:
    """Is the key's value still the one the note was made for, as far as its
    stored expiry can tell? Where the cache returns a value's expiry with the
    value (ShardedSQLiteCache, TieredCache over an L2 that does), a value that
    never expires, or expires elsewhen than the note says, was written by
    another write since: a digest names the content, not the write, and a
    plain ``set`` of an equal value with ``timeout=None`` passed it. Where the
    cache cannot tell (memcached), the digest alone decides."""
    read = getattr(cache, "get_with_expiry", None)  # ShardedSQLiteCache
    if read is None:
        read = getattr(cache, "_read_with_expiry", None)  # TieredCache: from its L2
    if read is None:
        return True
    try:
        value, expires = read(key, _GONE, version)
    except Exception:  # the refresh is an optimisation: when unsure, do not
        return False
    if value is _GONE:
        return False
    if expires is None:
        return True
    return abs(expires - noted_expiry) <= _NOTE_SLACK


def _unchanged(current: Any, value: Any) -> bool:
    """Is ``current`` (read just before a refresh stores) still the ``value`` the
    refresh began from? By identity, else by pickled bytes (values read back
    are new objects), else by equality."""
    if current is value:
        return True
    if current is _GONE:
        return False
    try:
        return pickle.dumps(current, pickle.HIGHEST_PROTOCOL) == pickle.dumps(
            value, pickle.HIGHEST_PROTOCOL)
    except Exception:
        try:
            return bool(current == value)
        except Exception:
            return False


def _digest(value: Any) -> str | None:
    """What names a value across processes: a hash of its pickle (None if it has
    none). Computed only when a note is made and when a refresh is drawn."""
    try:
        data = pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
    except Exception:
        return None
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _note(cache: Any, key: str, value: Any, delta: float, timeout: Any, version: Any) -> None:
    """Keep what early refresh needs of ``value``, just stored: how long it took
    to compute, when it expires (nothing for a value that never expires), and
    its digest, so that a value another write put there since is never taken
    for it. A value that cannot be pickled is never refreshed early."""
    seconds = cache.default_timeout if timeout is DEFAULT_TIMEOUT else timeout
    if seconds is None or seconds <= 0:
        return
    digest = _digest(value)
    if digest is None:
        return
    try:
        note_key, side = side_key(cache, XFETCH_PREFIX, key, version)
        cache.set(note_key, (float(delta), time.time() + float(seconds), digest),
                  timeout=timeout, version=side)
    except Exception:  # the value is stored; early refresh just skips this one
        log.warning("could not note the computation time of %r for early refresh", key)


def _unprotected(cache: Any, key: Any, default: Any, timeout: Any, version: Any,
                 read_first: Any = None) -> Any:
    """Django's ``get_or_set`` after its read said "missing"; with ``read_first``
    (the miss sentinel), its read too."""
    if read_first is not None:
        value = cache.get(key, read_first, version=version)
        if value is not read_first:
            return value
    if callable(default):
        default = default()
    cache.add(key, default, timeout=timeout, version=version)
    return cache.get(key, default, version=version)


def _release(cache: Any, lease_key: str, holder: str, side: str) -> None:
    """Drop the lease if it is still ours (it may have expired and been taken).

    Read-then-delete is not atomic: a computation that outlived its lease can,
    in that narrow window, drop the lease of the caller that took over, letting a
    third caller compute as well. Never a wrong value, at most one more run.
    """
    try:
        if cache.get(lease_key, None, version=side) == holder:
            cache.delete(lease_key, version=side)
    except Exception:  # the lease expires by itself
        pass
