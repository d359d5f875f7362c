"""A circuit breaker in front of a TieredCache's L2: while the L2 is down, fail at once.

Why: a *hung* L2 (stopped, swapping, behind a dropped network path) answers
nothing, and every call that reaches it waits its whole socket timeout
(forever without one). Every worker of every process does the same, so a site
stops serving within a second of the hang, while a refused connection (a
killed server) costs under a millisecond. The breaker turns the first kind
into the second.

States, for one L2 store on one host:

* **closed**: calls go to the L2. Each process counts its failed reads and its
  failed writes (:func:`is_outage`) since the last success of each kind: a
  successful read resets the reads' count only, a write the writes'. Apart,
  because an L2 may fail one kind only: a shard whose write lock a stopped
  process holds still serves reads, and the reads that succeed between the
  failed writes must not hide them.
* **open**: once the two counts of a process add up to ``BREAKER_THRESHOLD``.
  Calls that would reach the L2 fail at once, in every process of the host:
  they raise :class:`L2Unavailable`, or, for an L2 that turns its own failures
  into misses and ``False`` (ShardedSQLiteCache), answer as it answers a
  failure. What the L1 holds is served as usual, and with ``SERVE_STALE`` even
  past its L1 expiry (``backends/tiered.py``).
* **half-open**: ``BREAKER_COOLDOWN`` seconds after it opened, one call on the
  host (the *probe*) goes to the L2 while the others still fail at once. Its
  success closes the breaker for every process; its failure opens it for
  another cooldown. A probe that never returns (its process killed, an L2
  without a socket timeout) lets another through after a cooldown.

Why the state is shared by the host's processes: the process that meets the
outage first spares the others their timeouts, and one probe per cooldown
reaches the hung L2 instead of one per process (with a sync worker per
process, each probe holds a whole worker for a socket timeout). It lives in
two words of the generation table's header (``coherence/layout.py``), which
every TieredCache over the same L2 store maps already; a table that could not
be shared (a private mapping) keeps it per process. The words hold wall-clock
nanoseconds; a word further ahead than a cooldown (the clock was set back) is
taken as due.

A write while the breaker is open is never acknowledged: it fails as any
failed write does, and the key is stamped, so that no L1 of the host serves
the value it meant to replace (``tiered/writes.py``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from djcachebench.coherence import U64, GenerationTable
from djcachebench.coherence.layout import BREAKER_AT, PROBE_AT
from djcachebench.tiered.l2.base import never_fails

__all__ = ["RAISE", "Breaker", "GuardedInline", "GuardedL2", "L2Unavailable", "breaker_for",
           "guarded", "guarded_read", "is_outage", "refused_write"]

log = logging.getLogger("djcachebench.tiered")

_u64 = U64.unpack_from
_pack = U64.pack_into
_now_ns = time.time_ns


#: ``Breaker.call``'s ``refused`` for a call that raises even over an L2 that
#: masks its failures (writes: see :func:`refused_write`).
RAISE: Any = object()


class L2Unavailable(ConnectionError):
    """A call that would have reached the L2 failed at once: the circuit breaker
    is open (``OPTIONS["BREAKER_THRESHOLD"]``). A ``ConnectionError``, as the
    L2's own would be (``except OSError`` catches both)."""


# Exception classes (or any of their bases) that say the L2 could not be
# reached or did not answer in time, by name: redis-py's, django-redis's,
# pylibmc's and pymemcache's live in packages that may not be installed.
_OUTAGE_NAMES = frozenset({
    "ConnectionError", "TimeoutError", "BusyLoadingError",  # redis-py
    "ConnectionInterrupted",  # django-redis
    "ServerDown", "ServerDead", "SocketCreateError", "ConnectionBindError",
    "HostLookupError", "NoServers", "ReadError", "WriteError",
    "UnknownReadFailure",  # pylibmc
    "MemcacheUnexpectedCloseError", "MemcacheServerError",  # pymemcache
    "OperationalError", "InterfaceError",  # DB-API (DatabaseCache)
    "CacheUnavailable",  # ShardedSQLiteCache with RAISE_ON_TIMEOUT
})


def is_outage(exc: BaseException) -> bool:
    """Does ``exc`` say the L2 is unreachable (not that the call was wrong)?

    A refused or timed-out connection is; a bad key, a value that does not
    pickle, ``incr`` of a missing key are the caller's, and the L2 answered."""
    if isinstance(exc, OSError):
        return True
    return any(cls.__name__ in _OUTAGE_NAMES for cls in type(exc).__mro__)


class Breaker:
    """The breaker of one TieredCache configuration in this process (module doc).

    ``masks``: the L2 answers its own failures with a miss or ``False`` instead
    of raising; a call refused by the open breaker answers the same. Each
    instance calls through its own :meth:`callers`: the breaker is the
    configuration's, and must not keep an instance's L2 alive (its connections
    are its thread's)."""

    __slots__ = ("_cooldown_ns", "_failed_calls", "_lock", "_masks", "_name",
                 "_stats", "_table", "_threshold")

    def __init__(self, threshold: int, cooldown: float, table: GenerationTable, stats: Any,
                 name: str, masks: bool) -> None:
        self._threshold = threshold
        self._cooldown_ns = max(1, int(cooldown * 1e9))
        self._table = table
        self._stats = stats
        self._name = name
        self._masks = masks
        self._failed_calls = [0, 0]  # consecutive reads, writes: in this process
        self._lock = threading.Lock()

    @property
    def masks(self) -> bool:
        return self._masks

    def is_open(self) -> bool:
        """Open or half-open: the L2 is taken for unreachable (``SERVE_STALE`` applies)."""
        return _u64(self._table.buffer, BREAKER_AT)[0] != 0

    def callers(self, failures: Callable[[], int] | None
                ) -> tuple[Callable[..., Any], Callable[..., Any]]:
        """An instance's ``(call, call_write)``: ``call(refused, fn, *args)`` runs the
        L2 read ``fn(*args)`` counted (``call_write`` a call that changes the L2);
        while the breaker is open, ``refused`` (for an L2 that masks its failures)
        or :class:`L2Unavailable`, at once. ``failures``: the instance's L2's count
        of failures it masked (``tiered_failure_count``), compared around each
        call, or None."""
        if not self._masks:
            failures = None

        def call(refused: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            return self._call(0, failures, refused, fn, args, kwargs)

        def call_write(refused: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            return self._call(1, failures, refused, fn, args, kwargs)

        return call, call_write

    def _call(self, kind: int, count: Callable[[], int] | None, refused: Any,
              fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        buffer = self._table.buffer
        probe = False
        if _u64(buffer, BREAKER_AT)[0]:
            admitted = self._admit(buffer)
            if admitted is None:
                self._stats.fast_failures += 1
                if self._masks and refused is not RAISE:
                    return refused
                raise L2Unavailable(f"the L2 of {self._name} is taken for unreachable "
                                    f"(circuit breaker open); the call was not sent")
            probe = admitted
        before = 0 if count is None else count()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            if is_outage(exc):
                self._failed(kind, probe, exc)
            else:
                self._succeeded(kind, probe)  # the L2 answered, with an error of the call's
            raise
        if count is not None and count() != before:
            self._failed(kind, probe, None)
        elif probe or self._failed_calls[kind]:
            self._succeeded(kind, probe)
        return result

    def _admit(self, buffer: Any) -> bool | None:
        """The breaker was seen open: True if this call is the probe (the cooldown
        is over and no other probe is under way on the host; taking it writes its
        deadline), False if it goes as usual (closed meanwhile), None if it is
        refused."""
        with self._lock:
            now = _now_ns()
            horizon = now + self._cooldown_ns
            until = _u64(buffer, BREAKER_AT)[0]
            if not until:
                return False
            if now < until <= horizon:
                return None
            probing = _u64(buffer, PROBE_AT)[0]
            if now < probing <= horizon:
                return None
            _pack(buffer, PROBE_AT, horizon)
            return True

    def _failed(self, kind: int, probe: bool, exc: BaseException | None) -> None:
        failed = self._failed_calls
        failed[kind] += 1
        if not probe and failed[0] + failed[1] < self._threshold:
            return
        with self._lock:
            failed[0] = failed[1] = 0
            buffer = self._table.buffer
            was = _u64(buffer, BREAKER_AT)[0]
            _pack(buffer, BREAKER_AT, _now_ns() + self._cooldown_ns)
            _pack(buffer, PROBE_AT, 0)
        if not was:
            self._stats.breaker_opened += 1
            why = "a failure it masked" if exc is None else f"{type(exc).__name__}: {exc}"
            log.warning("the L2 of %s failed %d calls (the last: a %s, %s); calls that "
                        "would reach it fail at once, and one is let through every "
                        "%.3g s to see whether it is back", self._name, self._threshold,
                        "write" if kind else "read", why, self._cooldown_ns / 1e9)

    def _succeeded(self, kind: int, probe: bool) -> None:
        self._failed_calls[kind] = 0
        buffer = self._table.buffer
        if not (probe or _u64(buffer, BREAKER_AT)[0]):
            return
        with self._lock:
            was = _u64(buffer, BREAKER_AT)[0]
            _pack(buffer, BREAKER_AT, 0)
            _pack(buffer, PROBE_AT, 0)
        if was:
            log.warning("the L2 of %s answers again; the circuit breaker is closed",
                        self._name)


def breaker_for(config: Any, shared: Any, probe: Callable[[], int] | None) -> Breaker | None:
    """The breaker of a TieredCache configuration in this process (one for all its
    instances, on ``shared``, so that failures count per process), or None when
    ``BREAKER_THRESHOLD`` is off. ``probe``: the L2 adapter's failure probe (told
    apart only: never kept)."""
    if config.breaker_threshold is None:
        return None
    if shared.breaker is None:
        # An L2 that raises its failures has a probe that never changes; any
        # other answers a failure with a miss or False (or cannot say).
        masks = probe is not never_fails
        shared.breaker = Breaker(
            config.breaker_threshold, config.breaker_cooldown, shared.table, shared.stats,
            name=config.where.removesuffix("['OPTIONS']"), masks=masks)
    return shared.breaker  # type: ignore[no-any-return]


def refused_write(method: str, args: tuple[Any, ...]) -> Any:
    """What a write refused by the open breaker answers over an L2 that masks its
    failures: what that L2 answers when its own write fails (a ``set`` that
    returns normally, ``False`` from ``add``, ``touch`` and ``delete``, every key
    from ``set_many``). The write went no further than the stamp that makes every
    L1 of the host drop the key (``Writer``), so it is not acknowledged."""
    if method == "set_many":
        return list(args[0])
    if method in ("add", "touch", "delete"):
        return False
    return None


class GuardedL2:
    """The L2 as TieredCache's write side sees it: each call that reaches the L2
    goes through the breaker and, refused, raises (:class:`L2Unavailable`), so
    that the ``Writer`` takes it for the failed write it is (it stamps the key
    and keeps nothing). Everything else (``make_key``, ``default_timeout``...) is
    the L2's own."""

    def __init__(self, l2: Any, call_write: Callable[..., Any]) -> None:
        self._l2 = l2
        self._call = call_write

    def __getattr__(self, name: str) -> Any:
        return getattr(self._l2, name)

    def set(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(RAISE, self._l2.set, *args, **kwargs)

    def add(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(RAISE, self._l2.add, *args, **kwargs)

    def touch(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(RAISE, self._l2.touch, *args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(RAISE, self._l2.delete, *args, **kwargs)

    def incr(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(RAISE, self._l2.incr, *args, **kwargs)

    def decr(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(RAISE, self._l2.decr, *args, **kwargs)

    def set_many(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(RAISE, self._l2.set_many, *args, **kwargs)

    def delete_many(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(RAISE, self._l2.delete_many, *args, **kwargs)

    def incr_version(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(RAISE, self._l2.incr_version, *args, **kwargs)

    def clear(self) -> Any:
        return self._call(RAISE, self._l2.clear)


def guarded_read(call: Callable[..., Any], get: Callable[..., Any],
                 read_pickle: Callable[..., Any] | None, reader: Callable[..., Any] | None,
                 key: Any, version: Any, missing: Any,
                 refused: Any) -> tuple[Any, float | None, bytes | None]:
    """TieredCache's L2 read of a miss through ``call`` (a breaker's read call):
    ``(value, expiry, pickle)`` from the pickle-returning read, the expiry reader,
    or the plain ``get`` (the first of them given); the value ``refused`` when the
    open breaker answered for an L2 that masks its failures (nothing to keep: not
    a known absence)."""
    if reader is None:
        return call(refused, get, key, missing, version=version), None, None
    if read_pickle is not None:
        return call((refused, None, None), read_pickle, key, missing,  # type: ignore[no-any-return]
                    version)
    value, expires = call((refused, None), reader, key, missing, version)
    return value, expires, None


#: What ``call`` answers a batch read the open breaker refused (``guarded_read_many``).
_REFUSED_BATCH: Any = object()


def guarded_read_many(call: Callable[..., Any] | None, get_many: Callable[..., Any],
                      with_expiry: Callable[..., Any] | None, keys: list[Any], version: Any
                      ) -> tuple[dict[Any, Any], dict[Any, float | None], bool]:
    """TieredCache's L2 read of a batch of misses, through ``call`` (a breaker's
    read call; None: no breaker): ``(values, expiries, refused)`` from the batch
    expiry reader, or the plain ``get_many`` (no expiries) without one;
    ``refused``: the open breaker answered for an L2 that masks its failures
    (nothing was read, so no miss is a known absence)."""
    read = get_many if with_expiry is None else with_expiry
    if call is None:
        answer = read(keys, version=version)
    else:
        answer = call(_REFUSED_BATCH, read, keys, version=version)
        if answer is _REFUSED_BATCH:
            return {}, {}, True
    if with_expiry is None:
        return answer, {}, False
    return ({k: v for k, (v, _) in answer.items()},
            {k: e for k, (_, e) in answer.items()}, False)


def guarded(call: Callable[..., Any], fn: Callable[..., Any] | None) -> Callable[..., Any] | None:
    """``fn`` (an L2 write the Writer is handed apart from the L2: its clear, its
    pickle-returning set) through ``call`` (a breaker's ``call_write``), refused
    with a raise."""
    if fn is None:
        return None

    def through(*args: Any, **kwargs: Any) -> Any:
        return call(RAISE, fn, *args, **kwargs)

    return through


class GuardedInline:
    """An ``InlineSet`` (``tiered/inline.py``) whose sends go through the breaker."""

    def __init__(self, inline: Any, call_write: Callable[..., Any]) -> None:
        self._inline = inline
        self._call = call_write

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inline, name)

    def set(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(RAISE, self._inline.set, *args, **kwargs)
