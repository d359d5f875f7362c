"""The write side of TieredCache: L2 first, then stamp.

Every mutation of the Django cache API, with its L1 effect: the L2 write, then
the stamp that makes every L1 on the host drop the key (and, under
``COHERENCE="cluster"``, the other hosts', through the table's outlet). A write
that can be proved to be the key's latest keeps its value instead of dropping
it: how, and when, is ``write_through.py``'s. TieredCache calls each write
``linked`` (under ``COHERENCE="cluster"`` it returns once its invalidations were
handed to redis) and answers one the open breaker refused as ``refused`` says.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from django.core.cache.backends.base import DEFAULT_TIMEOUT

from djcachebench.coherence import GenerationTable
from djcachebench.coherence.board import ABSENT
from djcachebench.hoststats.publish import tick as host_stats_tick
from djcachebench.tiered.breaker import refused_write
from djcachebench.tiered.wiring import Wiring
from djcachebench.tiered.write_through import WriteThrough


class Writer:
    """Every mutation of the Django cache API, with its L1 effect.

    TieredCache builds one per instance from its ``Wiring`` (``tiered/wiring.py``).
    Callers pass the version already resolved (``None`` is the instance's default).
    """

    def __init__(self, wiring: Wiring) -> None:
        shared = wiring.shared
        # The L2 the writes go to: through the circuit breaker when there is one
        # (tiered/breaker.py's GuardedL2); what is known of the L2 is read from
        # the L2 itself.
        self._l2 = wiring.write_l2
        self._stats = shared.stats
        # How clear empties the L2 (tiered/cluster.py, l2_clear).
        self._clear_l2 = wiring.clear_l2
        # The L2's set that gives back the pickle it stored (L2Adapter.pickle_returning):
        # a mutable value written through is kept as those bytes, not pickled again.
        self._set_pickle = wiring.set_pickle
        # How the L1 names a call's entry: the reading side's rule, shared.
        self._index = wiring.index
        # COHERENCE="cluster" over the redis that carries the invalidations: a
        # set publishes in its own round trip (inline.py).
        self._inline = wiring.inline
        # Writes through it when the L2 stamps inside its transactions and the
        # L1 keeps anything (write_through.py).
        self._stamper = wiring.stamper
        self._l1 = shared.l1
        self._table = shared.table
        self._stamps = shared.stamps  # the adapter stamps (the L2 does not stamp its own writes)
        self._written_expiry = wiring.written_expiry
        through = WriteThrough(wiring)
        # Bound once: the hot writes call them without another attribute lookup.
        self._kept_as = through.kept_as
        self._through_begin = through.begin
        self._write_through_done = through.done
        self._announced = through.announced
        # COHERENCE="cluster": the link that carries this process's stamps to
        # the other hosts (linked).
        self._link = wiring.link
        self._strict = wiring.link is not None and bool(wiring.config.strict_lease)
        self._refuses_quietly = wiring.breaker is not None and wiring.breaker.masks

    # -- as TieredCache calls them ------------------------------------------------

    def linked(self, write: Callable[..., Any]) -> Callable[..., Any]:
        """``write`` (one of this Writer's methods) as TieredCache calls it: under
        ``COHERENCE="cluster"`` it returns only once the write's cross-host
        invalidations were handed to redis, so that the cross-host bound counts
        from the acknowledgement; with ``STRICT_LEASE``, once every live host
        applied them. Otherwise ``write`` itself: no frame added."""
        link = self._link
        if link is None:
            return write
        if self._strict:
            strict = link.strict_write

            def strict_write(*args: Any) -> Any:
                return strict(lambda: write(*args))

            return strict_write
        flush, mark = link.flush, link.mark

        def flushed_write(*args: Any) -> Any:
            since = mark()
            try:
                result = write(*args)
            except BaseException:
                flush()
                raise
            # Raises PublicationDropped if a message that may carry this write's
            # invalidation was dropped: never acknowledged without its PUBLISH.
            flush(since)
            return result

        return flushed_write

    def refused(self, method: str, args: tuple[Any, ...]) -> Any:
        """Called while handling the ``L2Unavailable`` of a write the L2's open
        breaker refused (its keys are stamped): raised again, or, over an L2 that
        answers its own failed writes instead of raising, answered as it would
        (``breaker.refused_write``)."""
        if not self._refuses_quietly:
            raise  # the L2Unavailable the caller is handling
        return refused_write(method, args)

    # -- writes: L2 first, then stamp -------------------------------------------

    def _expires_at(self, timeout: Any) -> float:
        """Wall-clock L2 expiry of a write, taken before it (so never too late),
        for the L1 copy the writer may keep: never later than the L2's own, for
        L2s that keep whole seconds too (``written_expiry``).

        A timeout that is not a number, or is NaN, is refused here, before
        anything is written: ``time.time() + nan`` would keep a copy forever.
        """
        if timeout is DEFAULT_TIMEOUT:
            timeout = self._l2.default_timeout
        if timeout is None:
            return math.inf
        try:
            seconds = float(timeout)
        except (TypeError, ValueError):
            # Not a number ("abc"): the L2's own error, as Django would raise it
            # (a TypeError from BaseCache); never float()'s ValueError.
            self._l2.get_backend_timeout(timeout)
            raise TypeError(f"timeout must be a number of seconds or None, "
                            f"got {timeout!r}") from None
        except OverflowError:
            # An int past any float (10**400): the L2 decides whether it takes it
            # (PyLibMCCache does, and keeps nothing); for the L1 it is "never",
            # as far as the L2's rule (written_expiry) allows.
            seconds = math.inf
        if seconds != seconds:
            # What the L2 refuses, it refuses with its own error (a Decimal NaN is a
            # TypeError to Django's BaseCache, as every Decimal is); a float NaN,
            # which it would take, is refused here.
            self._l2.get_backend_timeout(timeout)
            raise ValueError(f"timeout must be a number of seconds or None, got {timeout!r}")
        return self._written_expiry(seconds, time.time())

    def _written(self, key: Any, version: Any, final: str | None = None) -> None:
        """The L2 write of ``key`` is over (or failed): make every L1 drop it."""
        if self._stamps:
            if final is None:
                final = self._l2.make_key(key, version=version)
            self._table.stamp(final)
        self._l1.pop(self._index(key, version))

    def set(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT,
            version: Any = None) -> Any:
        """The L2's ``set``; returns what it returned (None for Django's own
        backends, True for django-redis and diskcache), also when the write went
        inline (``tiered/inline.py``)."""
        self._stats.sets += 1
        host_stats_tick()
        expires = self._expires_at(timeout)
        l1key = self._kept_as(key, version)
        if l1key is not None and self._stamper is not None:
            if self._set_pickle is not None:  # it returns the pickle, set returns None
                self._announced(self._set_pickle, key, version, value, expires,
                                (value, timeout), l1key, True)
                return None
            return self._announced(self._l2.set, key, version, value, expires,
                                   (value, timeout), l1key)
        through = (None if l1key is None
                   else self._through_begin(key, version, value, expires, l1key))
        final = None if through is None else through[1]
        inline = self._inline
        covered = result = None
        try:
            if inline is None:
                result = self._l2.set(key, value, timeout, version=version)
            else:
                covered, result = inline.set(key, value, timeout, version, final)
        except BaseException:
            if through is not None:
                GenerationTable.end_chain()
            self._written(key, version, final)  # the L2 may or may not hold it
            raise
        try:
            if through is None:
                self._written(key, version, covered)
            else:
                self._write_through_done(key, version, through, value, expires)
        finally:
            if covered is not None:
                inline.done()  # type: ignore[union-attr]
        return result

    def add(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT,
            version: Any = None) -> bool:
        expires = self._expires_at(timeout)
        l1key = self._kept_as(key, version)
        if l1key is not None and self._stamper is not None:
            return bool(self._announced(self._l2.add, key, version, value, expires,
                                        (value, timeout), l1key))
        through = (None if l1key is None
                   else self._through_begin(key, version, value, expires, l1key))
        final = None if through is None else through[1]
        try:
            added = self._l2.add(key, value, timeout, version=version)
        except BaseException:
            if through is not None:
                GenerationTable.end_chain()
            self._written(key, version, final)
            raise
        if not added:  # a refused add changed nothing: no process needs to drop anything
            if through is not None:
                GenerationTable.end_chain()
        elif through is None:
            self._written(key, version)
        else:
            self._write_through_done(key, version, through, value, expires)
        return added

    def touch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: Any = None) -> bool:
        self._expires_at(timeout)  # refuses NaN before the L2 sees it
        try:
            return bool(self._l2.touch(key, timeout, version=version))
        finally:
            # Even a failed touch stamps: the key may be gone from the L2 (evicted)
            # while some L1 still holds it.
            self._written(key, version)

    def delete(self, key: Any, version: Any = None) -> bool:
        self._stats.deletes += 1
        host_stats_tick()
        l1key = self._kept_as(key, version)
        if l1key is not None and self._stamper is not None:
            return bool(self._announced(self._l2.delete, key, version, ABSENT, 0.0, (),
                                        l1key))
        through = (None if l1key is None
                   else self._through_begin(key, version, ABSENT, 0.0, l1key))
        final = None if through is None else through[1]
        try:
            deleted = self._l2.delete(key, version=version)
        except BaseException:
            if through is not None:
                GenerationTable.end_chain()
            self._written(key, version, final)
            raise
        # Stamped even when the L2 says there was nothing to delete: the L2
        # may have evicted it while L1s elsewhere still hold it.
        if through is None:
            self._written(key, version)
        else:
            self._write_through_done(key, version, through, ABSENT, 0.0)
        return deleted

    def incr(self, key: Any, delta: int = 1, version: Any = None) -> Any:
        return self._counter("incr", key, delta, version)

    def decr(self, key: Any, delta: int = 1, version: Any = None) -> Any:
        return self._counter("decr", key, delta, version)

    def _counter(self, op: str, key: Any, delta: int, version: Any = None) -> Any:
        """incr/decr: the L2's own atomic operation, then every L1 drops the key."""
        try:
            return getattr(self._l2, op)(key, delta, version=version)
        finally:
            self._written(key, version)

    def set_many(self, data: Mapping[Any, Any], timeout: Any = DEFAULT_TIMEOUT,
                 version: Any = None) -> list[Any]:
        self._expires_at(timeout)  # refuses NaN before the L2 sees it
        try:
            return self._l2.set_many(data, timeout, version=version)
        finally:
            for key in data:
                self._written(key, version)

    def delete_many(self, keys: Iterable[Any], version: Any = None) -> Any:
        """The L2's ``delete_many``; returns what it returned (a count for
        django-redis, None for Django's own backends)."""
        keys = list(keys)
        try:
            return self._l2.delete_many(keys, version=version)
        finally:
            for key in keys:
                self._written(key, version)

    def incr_version(self, key: Any, delta: int = 1, version: Any = None) -> int:
        """The L2's own ``incr_version`` (redis renames, keeping the TTL), then both
        versions are stamped. The new entry's expiry is not known to the adapter."""
        try:
            return self._l2.incr_version(key, delta, version=version)
        finally:
            self._written(key, version)
            try:
                moved_to = version + delta
            except TypeError:  # the L2 could not make it either: nothing written there
                pass
            else:
                self._written(key, moved_to)

    def decr_version(self, key: Any, delta: int = 1, version: Any = None) -> int:
        return self.incr_version(key, -delta, version)

    def clear(self) -> None:
        try:
            self._clear_l2()
        finally:
            self._table.stamp_all()
            self._l1.clear()

    def close(self, **kwargs: Any) -> None:
        """Django calls this after every request: it closes the L2 only. The L1
        and the table are the process's, and stay warm."""
        self._l2.close(**kwargs)
