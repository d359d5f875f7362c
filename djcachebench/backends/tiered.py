"""``TieredCache``: an in-process L1 in front of any Django cache, coherent on the host.

Reads are answered from a per-process LRU map (``djcachebench.l1``) at dict
speed; every write goes to the L2 first and then stamps the key's slot in the
shared generation table (``djcachebench.coherence``), which every process
checks before it serves an L1 hit. The protocol, its guarantees and its limits
are in ``docs/architecture.md`` (TieredCache); how the settings combine is in
``djcachebench.tiered.config``.

The adapter is thin on purpose, like Django's ``RedisCache``: it never makes a
key of its own. The caller's key and version go to the L2 unchanged, so the
tiered alias and its L2 alias address the same entries. The L1 is indexed by
``(key, version)`` for ``str``/``bytes`` keys, so that a hit skips Django's key making
and validation (most of LocMemCache's get; docs/benchmarks.md); the L2's final key is made
only on a miss, to find the key's generation slot.

Besides values read from the L2, the L1 keeps known absences, the writer's own
values (write-through: ``djcachebench.tiered.write_through``) and values other
processes published on the value board (``djcachebench.coherence.board``).

This class is the hit path and the whole Django API, sync and async. It is built
from one ``Wiring`` (``tiered/wiring.py``); its misses fill the L1 through
``tiered/fill.py`` and every write goes through the ``Writer`` (``tiered/writes.py``).
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable, Iterable
from typing import Any

from asgiref.sync import sync_to_async
from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache

from djcachebench.abandon import run_abandonable
from djcachebench.coherence import EPOCH_OFFSET, TOKEN, U64, GenerationTable
from djcachebench.hoststats.publish import tick as host_stats_tick
from djcachebench.stampede import protected_get_or_set
from djcachebench.store.retry import not_a_wait, within_budget
from djcachebench.tiered.breaker import L2Unavailable, guarded_read, guarded_read_many
from djcachebench.tiered.cluster import cluster_stats
from djcachebench.tiered.l2 import adapter_for
from djcachebench.tiered.state import (
    ABSENCE,
    ABSENT_HIT,
    MISS,
    OBJECT,
    PICKLED,
    TieredStats,
    host_report,
    l2_attribute,
)
from djcachebench.tiered.wiring import wire
from djcachebench.tiered.writes import Writer

__all__ = ["TieredCache", "TieredStats"]

# Module globals for the hot path (a global is one dict probe; an attribute chain more).
_MISS = MISS
_ABSENT = ABSENT_HIT
#: What a read refused by the L2's open breaker gives, over an L2 that masks its
#: failures (tiered/breaker.py): a miss that is not a known absence.
_REFUSED: Any = object()
_OBJECT, _PICKLED, _ABSENCE = OBJECT, PICKLED, ABSENCE
_loads = pickle.loads
_token = TOKEN.unpack_from
_u64 = U64.unpack_from
_monotonic = time.monotonic


class TieredCache(BaseCache):
    """A process-local L1 (LRU, bounded) in front of the cache ``OPTIONS["L2"]``."""

    # BaseCache.__init__ would assign these; they are the L2's (see module doc).
    key_func = l2_attribute("key_func", clears_l1=True)
    key_prefix = l2_attribute("key_prefix", clears_l1=True)
    version = l2_attribute("version", clears_l1=True)
    default_timeout = l2_attribute("default_timeout", clears_l1=False)
    _max_entries = l2_attribute("_max_entries", clears_l1=False)
    _cull_frequency = l2_attribute("_cull_frequency", clears_l1=False)
    # Not kept on the instance, whose attributes are the hot paths' (l2/nested.py asks it).
    l2_adapter = property(lambda self: adapter_for(self._l2), doc="The L2's adapter (tiered/l2/).")

    def __init__(self, location: str, params: dict[str, Any]) -> None:
        # BaseCache.__init__ is not called: all it does is set the attributes
        # above, which belong to the L2 here.
        wiring = wire(location, params)
        shared = wiring.shared
        self._config = wiring.config
        self._l2 = wiring.l2
        self._wiring = wiring  # the cold paths read it; the hot ones keep what they use
        self._l1 = shared.l1
        self._table = shared.table
        self._stats = shared.stats
        # Bound once: the hit path saves an attribute lookup at each use.
        self._l1_get = shared.l1.get
        self._records_get = shared.l1.records.get  # for the inlined hot path
        self._records_touch = shared.l1.records.move_to_end
        self._buffer = shared.table.buffer
        self._board = shared.board
        self._gate = shared.gate
        self._door = shared.door
        # The store beneath: a TieredCache over this one binds its board values to it.
        self.store_identity = shared.store
        self._version = self._l2.version
        self._index = wiring.index
        self._by_call = wiring.index.by_call
        filler = wiring.filler
        self._admits = filler.admits
        self._reading = filler.reading
        self._fill_epoch = filler.fill_epoch
        self._fill = filler.fill
        self._from_board = filler.from_board
        self._keep_absence = filler.keep_absence
        # What is known of the L2 (tiered/l2/), asked once: hot paths hold its answers.
        self._read_probe = wiring.read_probe
        if wiring.failure_probe is not None:  # declared as its L2 does (stampede.py)
            self.tiered_failure_count = wiring.failure_probe
        self._read_with_expiry = wiring.read_with_expiry
        self._read_pickle = wiring.read_pickle
        self._l2_call = wiring.read_l2  # through the L2's circuit breaker, when there is one
        self._stale_for = wiring.stale_for
        self._stale = wiring.stale
        writer = self._writer = Writer(wiring)
        # Bound once, linked (Writer.linked): set, add and delete, the hot writes,
        # call the Writer's method itself unless COHERENCE is "cluster".
        self._set = writer.linked(writer.set)
        self._add = writer.linked(writer.add)
        self._delete = writer.linked(writer.delete)
        self._refused = writer.refused

    def _l1_by_final(self) -> None:
        """``key_func`` or ``key_prefix`` was reassigned on this instance: index
        its L1 entries by final key from now on (``L1Index``)."""
        self._index.by_call = self._by_call = False

    @property
    def write_through(self) -> bool:
        """Does a write keep its value in this L1 (and publish it on the board)?"""
        return self._wiring.write_through

    @property
    def l2(self) -> BaseCache:
        """This instance's L2 backend."""
        return self._l2

    # -- keys: the L2's --------------------------------------------------------

    def make_key(self, key: Any, version: int | None = None) -> str:
        return self._l2.make_key(key, version=version)

    def validate_key(self, key: Any) -> None:
        self._l2.validate_key(key)

    def get_backend_timeout(self, timeout: Any = DEFAULT_TIMEOUT) -> Any:
        return self._l2.get_backend_timeout(timeout)

    # -- reads -----------------------------------------------------------------

    def get(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        # The hot path. L1Map.get and GenerationTable.is_current are inlined
        # here (two Python calls fewer: under load, with caches cold from the
        # L2 reads in between, that is a large share of an L1 hit).
        if version is None:
            version = self._version
        kind = type(key)
        vkind = type(version)
        if not self._by_call or (vkind is not int and vkind is not str):
            l1key: tuple = self._index.by_final(key, version)
        elif kind is str:  # L1Index, inlined
            l1key = (key, version)
        elif kind is bytes:
            l1key = (key, version, b"")
        else:
            l1key = self._index.by_final(key, version)
        record = self._records_get(l1key)
        if record is not None:
            # record: (deadline, size, payload, kind, offset, epoch, token, final key)
            buffer = self._buffer
            if (_token(buffer, record[4]) == record[6]
                    and _u64(buffer, EPOCH_OFFSET)[0] == record[5]):
                now = _monotonic()
                if now >= self._table._check_at:  # the file is due a check first
                    return self._get_after_check(key, default, version)
                if record[0] > now:
                    try:  # noqa: SIM105 - contextlib.suppress adds a call to the hit path
                        self._records_touch(l1key)
                    except KeyError:  # evicted by another thread meanwhile
                        pass
                    kind = record[3]
                    if kind == _OBJECT:
                        self._stats.l1_hits += 1
                        return record[2]
                    if kind == _PICKLED:
                        try:
                            value = _loads(record[2])
                        except Exception:  # pickles but does not unpickle: as the L2 says
                            self._stats.bad_pickles += 1
                            self._l1.pop(l1key)
                            return self._get_through(key, default, version, l1key)
                        self._stats.l1_hits += 1
                        return value
                    self._stats.l1_misses += 1
                    return default
                if self._stale_for and record[0] + self._stale_for > now:
                    value = self._stale.value(record, l1key)  # type: ignore[union-attr]
                    if value is not _MISS:
                        return default if value is _ABSENT else value
                self._l1.get(l1key)  # expired: the map drops and counts it
                self._door.seen(l1key)  # read again after it expired: admit its refill
            else:
                self._stats.invalidations += 1
                # The board is a hit path too: only while the L1 may serve.
                if self._board is not None and self._may_serve():
                    value = self._from_board(buffer, l1key, record[4], record[7])
                    if value is not _MISS:
                        return default if value is _ABSENT else value
                self._l1.pop(l1key)
                self._door.seen(l1key)  # read again after a write: admit its refill
        return self._get_through(key, default, version, l1key)

    def _get_after_check(self, key: Any, default: Any, version: Any) -> Any:
        """A hit found the table due a check (``GenerationTable.check``, at most
        every ``CHECK_EVERY``): run it, so a table file deleted, replaced or
        truncated under this process is noticed before its entries are served,
        then answer through the slow path on the (possibly new) mapping. While
        the table's cross-host guard fails (``serving``), the L2 answers alone.
        The host-wide counters ride on this check too (a flush when one is due)."""
        host_stats_tick()
        table = self._table
        if not table.check() or not table.serving():
            self._stats.unserved += 1
            return self._get_through(key, default, version, None)
        self._buffer = table.buffer
        value, l1key = self._lookup(key, version)
        if value is _ABSENT:
            return default
        if value is not _MISS:
            return value
        return self._get_through(key, default, version, l1key)

    def _may_serve(self) -> bool:
        """May the L1 (or the value board) answer now? While a passed check of the
        table stands (at most ``CHECK_EVERY`` old), and across hosts the guard
        (heartbeat, lease) passes. Every L1 answer but ``get``'s inlined hit path
        asks here; that one checks the same deadline itself."""
        table = self._table
        return _monotonic() < table._check_at or (table.check() and table.serving())

    def _lookup(self, key: Any, version: Any) -> tuple[Any, tuple | None]:
        """(value, _ABSENT or _MISS, L1 key or None) from the L1 alone.

        ``_MISS``: the L1 cannot answer (a stale entry is dropped on the way).
        """
        l1key = self._index(key, version)
        if not self._may_serve():
            self._stats.unserved += 1
            return _MISS, l1key
        item = self._l1_get(l1key) if self._stale is None else self._stale.item(l1key)
        if item is not None:
            if self._current(item):
                kind = item[1]
                if kind == _ABSENCE:
                    self._stats.l1_misses += 1
                    return _ABSENT, l1key
                if kind != _PICKLED:
                    self._stats.l1_hits += 1
                    return item[0], l1key
                try:
                    value = _loads(item[0])
                except Exception:  # pickles but does not unpickle: as the L2 says
                    self._stats.bad_pickles += 1
                    self._l1.pop(l1key)
                    return _MISS, l1key
                self._stats.l1_hits += 1
                return value, l1key
            self._stats.invalidations += 1
            if self._board is not None:
                value = self._from_board(self._buffer, l1key, item[2], item[5])
                if value is not _MISS:
                    return value, l1key
            self._l1.pop(l1key)
            self._door.seen(l1key)
        return _MISS, l1key

    def _current(self, item: tuple) -> bool:
        """Is this L1 item's token still the slot's (``is_current``, inlined)?"""
        buffer = self._buffer
        return (_token(buffer, item[2]) == item[4]
                and _u64(buffer, EPOCH_OFFSET)[0] == item[3])

    def _get_through(self, key: Any, default: Any, version: Any, l1key: tuple | None) -> Any:
        host_stats_tick()  # a flush of the host-wide counters, when one is due
        reading = None if l1key is None or not self._admits(l1key) else self._reading(key, version)
        if reading is not None:
            self._buffer = self._table.buffer  # the check may have moved to a new file
        probe = None if reading is None else self._read_probe
        failures = 0 if probe is None else probe()
        reader = None if reading is None else self._read_with_expiry
        pickled = None
        if self._l2_call is not None:  # through the L2's circuit breaker
            value, expires, pickled = guarded_read(
                self._l2_call, self._l2.get, None if reader is None else self._read_pickle,  # type: ignore[arg-type]
                reader, key, version, _MISS, _REFUSED)
            if value is _REFUSED:
                return default
        elif reader is None:
            value, expires = self._l2.get(key, _MISS, version=version), None
        elif self._read_pickle is not None:
            value, expires, pickled = self._read_pickle(key, _MISS, version)
        else:
            value, expires = reader(key, _MISS, version)
        if reading is not None and reading[0][1] != self._fill_epoch():
            reading = None  # read under a file replaced meanwhile: keep nothing
        if value is _MISS:
            self._stats.l2_misses += 1
            if reading is not None and probe is not None and probe() == failures:
                # a real miss, not a masked failure
                self._keep_absence(l1key, reading[0], reading[1])  # type: ignore[arg-type]
            return default
        self._stats.l2_hits += 1
        if reading is not None:
            self._fill(l1key, reading, value, expires, pickled)  # type: ignore[arg-type]
        return value

    def get_many(self, keys: Iterable[Any], version: int | None = None) -> dict[Any, Any]:
        if version is None:
            version = self._version
        keys = list(keys)
        found: dict[Any, Any] = {}
        missing: dict[Any, tuple | None] = {}
        named: dict[Any, tuple] = {}
        repeated: list[Any] = []
        for key in keys:
            value, l1key = self._lookup(key, version)
            if key in named:
                repeated.append(key)
            if named.setdefault(key, l1key) != l1key:
                # Two keys asked for are equal dict keys that name different
                # entries (1 and 1.0): answer as BaseCache does, one get per key
                # in order, so that no entry is filled from the other's value.
                return BaseCache.get_many(self, keys, version)
            if value is _MISS:
                missing[key] = l1key
            elif value is not _ABSENT:
                found[key] = value
        finals: dict[Any, str] = {}
        if len(missing) > 1:
            make_key = self._l2.make_key
            finals = {key: make_key(key, version=version) for key in missing}
            if len(set(finals.values())) < len(finals):
                # Two keys asked for make one cache key ("1" and 1): an L2 that
                # answers by cache key (Django's RedisCache) names the value after
                # one of them only, and the other would be taken for absent and
                # remembered so. One get per key, in order, as BaseCache answers.
                return BaseCache.get_many(self, keys, version)
        if missing:
            readings = {k: None if l1key is None or not self._admits(l1key)
                        else self._reading(k, version, finals.get(k))
                        for k, l1key in missing.items()}
            if any(r is not None for r in readings.values()):
                self._buffer = self._table.buffer  # the checks may have moved to a new file
            probe = self._read_probe
            failures = 0 if probe is None else probe()
            got, expiries, refused = guarded_read_many(
                self._l2_call, self._l2.get_many, self._wiring.read_many_with_expiry, list(missing),
                version)
            trust_misses = not refused and probe is not None and probe() == failures
            if any(r is not None for r in readings.values()):
                epoch = self._fill_epoch()  # one stat for the batch
                readings = {k: r if r is not None and r[0][1] == epoch else None
                            for k, r in readings.items()}
            for key, l1key in missing.items():
                reading = readings[key]
                if key in got:
                    self._stats.l2_hits += 1
                    if reading is not None:
                        self._fill(l1key, reading, got[key],  # type: ignore[arg-type]
                                   expiries.get(key))
                else:
                    self._stats.l2_misses += 1
                    if reading is not None and trust_misses:
                        self._keep_absence(l1key, reading[0], reading[1])  # type: ignore[arg-type]
            found.update(got)
            for key in repeated:
                if key in missing:
                    # The L2 was asked once for a key given twice; Django's
                    # get_many validates (and warns about) each one given.
                    self._l2.make_and_validate_key(key, version=version)
        if not missing:
            return found  # L1 hits only: already in the order asked
        # In the order asked, as BaseCache answers (the L1's hits came first).
        return {key: found[key] for key in keys if key in found}

    def has_key(self, key: Any, version: int | None = None) -> bool:
        if version is None:
            version = self._version
        known = self._l1_has(key, version)
        if known is not None:
            return known
        if self._l2_call is None:
            return self._l2.has_key(key, version=version)
        return bool(self._l2_call(False, self._l2.has_key, key,  # type: ignore[misc]
                                  version=version))

    def _l1_has(self, key: Any, version: Any) -> bool | None:
        """What a current L1 entry says of ``key`` (present or known absent), else None.

        Only while the table is trusted and serving (its check, and across hosts
        the heartbeat and lease), as for ``get``: otherwise ``has_key`` would
        answer ``True`` from a host whose subscriber is stopped, after another
        host's delete."""
        if not self._may_serve():
            self._stats.unserved += 1
            return None
        item = self._l1_get(self._index(key, version))
        if item is not None and self._current(item):
            return item[1] != _ABSENCE
        return None

    # -- get_or_set: one caller computes (djcachebench.stampede) ----------------------

    @within_budget  # over ShardedSQLiteCache, its writes share one wait budget
    def get_or_set(self, key: Any, default: Any, timeout: Any = DEFAULT_TIMEOUT,
                   version: int | None = None) -> Any:
        default = not_a_wait(default)
        lease = self._config.stampede_lease
        if lease is None:
            return super().get_or_set(key, default, timeout, version)
        return protected_get_or_set(self, key, default, timeout, version, lease, _MISS,
                                    early=self._config.early_refresh, scope=self._wiring.scope)

    def readable_after_set(self, seconds: float) -> bool:
        """Does the L2 keep a value set with a timeout of ``seconds`` at all? Not
        with less than a second where it keeps whole seconds (Django's
        ``RedisCache``, memcached): ``get_or_set``'s waiters must not wait for it."""
        now = time.time()
        return self._wiring.written_expiry(seconds, now) > now

    # -- writes: the Writer's (L2 first, then stamp) ---------------------------------

    def set(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT,
            version: int | None = None) -> Any:
        if version is None:
            version = self._version
        try:
            return self._set(key, value, timeout, version)
        except L2Unavailable:
            return self._refused("set", ())

    def add(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT,
            version: int | None = None) -> bool:
        if version is None:
            version = self._version
        try:
            return self._add(key, value, timeout, version)
        except L2Unavailable:
            return self._refused("add", ())

    def delete(self, key: Any, version: int | None = None) -> bool:
        if version is None:
            version = self._version
        try:
            return self._delete(key, version)
        except L2Unavailable:
            return self._refused("delete", ())

    def _write(self, write: Callable[..., Any], *args: Any) -> Any:
        """``write(*args)``, one of the Writer's methods, linked (``Writer.linked``);
        refused by the L2's open breaker, answered as ``Writer.refused`` says."""
        try:
            return self._writer.linked(write)(*args)
        except L2Unavailable:
            return self._refused(write.__name__, args)

    def touch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        return self._write(self._writer.touch, key, timeout,
                           self._version if version is None else version)

    def incr(self, key: Any, delta: int = 1, version: int | None = None) -> Any:
        return self._write(self._writer.incr, key, delta,
                           self._version if version is None else version)

    def decr(self, key: Any, delta: int = 1, version: int | None = None) -> Any:
        return self._write(self._writer.decr, key, delta,
                           self._version if version is None else version)

    def set_many(self, data: Any, timeout: Any = DEFAULT_TIMEOUT,
                 version: int | None = None) -> list[Any]:
        return self._write(self._writer.set_many, data, timeout,
                           self._version if version is None else version)

    def delete_many(self, keys: Iterable[Any], version: int | None = None) -> Any:
        return self._write(self._writer.delete_many, keys,
                           self._version if version is None else version)

    def incr_version(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        return self._write(self._writer.incr_version, key, delta,
                           self._version if version is None else version)

    def decr_version(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        return self.incr_version(key, -delta, version)

    def clear(self) -> None:
        self._write(self._writer.clear)

    def close(self, **kwargs: Any) -> None:
        """Django calls this after every request: it closes the L2 only. The L1
        and the table are the process's, and stay warm."""
        self._writer.close(**kwargs)

    # -- async: an L1 hit without the thread hop (sync_to_async) of BaseCache's a* --
    # Writes and what the L1 cannot answer keep the hop: they go to the L2 anyway.

    async def aget(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        if version is None:
            version = self._version
        value, _ = self._lookup(key, version)
        if value is _ABSENT:
            return default
        if value is not _MISS:
            return value
        return await sync_to_async(self.get, thread_sensitive=True)(key, default, version)

    async def aget_many(self, keys: Iterable[Any], version: int | None = None) -> dict[Any, Any]:
        if version is None:
            version = self._version
        keys = list(keys)
        found: dict[Any, Any] = {}
        rest = []
        named: dict[Any, tuple] = {}
        for key in keys:
            value, l1key = self._lookup(key, version)
            if named.setdefault(key, l1key) != l1key:  # 1 and 1.0: see get_many
                return await sync_to_async(self.get_many, thread_sensitive=True)(keys, version)
            if value is _MISS:
                rest.append(key)
            elif value is not _ABSENT:
                found[key] = value
        if not rest:
            return found  # L1 hits only: already in the order asked
        found.update(await sync_to_async(self.get_many, thread_sensitive=True)(rest, version))
        # In the order asked, as get_many answers (not the L1's hits first).
        return {key: found[key] for key in keys if key in found}

    async def ahas_key(self, key: Any, version: int | None = None) -> bool:
        if version is None:
            version = self._version
        known = self._l1_has(key, version)
        if known is not None:
            return known
        return await sync_to_async(self.has_key, thread_sensitive=True)(key, version)

    # set_many and delete_many return what the L2's do (the keys it failed to
    # write; django-redis's count): Django's defaults loop over aset and adelete
    # and return [] and None whatever the L2 said. One hop for the whole batch.

    async def aset_many(self, data: Any, timeout: Any = DEFAULT_TIMEOUT,
                        version: int | None = None) -> list[Any]:
        return await sync_to_async(self.set_many, thread_sensitive=True)(data, timeout, version)

    async def adelete_many(self, keys: Iterable[Any], version: int | None = None) -> Any:
        return await sync_to_async(self.delete_many, thread_sensitive=True)(keys, version)

    async def aincr(self, key: Any, delta: int = 1, version: int | None = None) -> Any:
        """As atomic as :meth:`incr` (Django's default reads, adds and sets)."""
        return await sync_to_async(self.incr, thread_sensitive=True)(key, delta, version)

    async def adecr(self, key: Any, delta: int = 1, version: int | None = None) -> Any:
        return await sync_to_async(self.decr, thread_sensitive=True)(key, delta, version)

    async def aget_or_set(self, key: Any, default: Any, timeout: Any = DEFAULT_TIMEOUT,
                          version: int | None = None) -> Any:
        value = await self.aget(key, _MISS, version)
        # A hit returns here unless early refresh may recompute it: that is
        # get_or_set's decision (returning every hit here, aget_or_set would
        # never refresh early).
        if value is not _MISS and (self._config.early_refresh is None or not callable(default)):
            return value
        return await run_abandonable(lambda: self.get_or_set(key, default, timeout, version))

    # -- beyond Django's API ------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """This process's counters for this configuration (``Shared.report``), and
        across hosts the link's, prefixed ``cluster_``."""
        out = self._wiring.shared.report()
        if self._config.coherence == "cluster":
            out.update({f"cluster_{k}": v for k, v in cluster_stats(self._table).items()})
        return out

    def host_stats(self) -> dict[str, Any]:
        """Every process's counters on this host, summed (``tiered.state.host_report``)."""
        return host_report(self._wiring.shared, self._l2)

    @property
    def generation_table(self) -> GenerationTable:
        """The table this instance checks (the L2's own when it keeps one)."""
        return self._table
