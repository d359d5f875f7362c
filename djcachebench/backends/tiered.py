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
values (write-through, by compare-and-stamp: ``djcachebench.tiered.writes``) and
values other processes published on the value board
(``djcachebench.coherence.board``). This class is the read side and the Django
API; its internals are in ``djcachebench.tiered``.
"""

from __future__ import annotations

import pickle
import sys
import time
from collections.abc import Iterable
from typing import Any

from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache

from djcachebench.coherence import EPOCH_OFFSET, TOKEN, U64, GenerationTable, Token
from djcachebench.coherence.board import ABSENT, EXPIRY_ONLY, NOT_PUBLISHED
from djcachebench.hoststats.publish import tick as host_stats_tick
from djcachebench.stampede import protected_get_or_set
from djcachebench.store.retry import not_a_wait, within_budget
from djcachebench.tiered.aio import AsyncL1
from djcachebench.tiered.breaker import guarded_read
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
    locate_for_l1,
)
from djcachebench.tiered.wiring import wire
from djcachebench.tiered.write_api import WriteAPI
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
_getsizeof = sys.getsizeof


class TieredCache(AsyncL1, WriteAPI, BaseCache):
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
        self._scope = wiring.scope
        self._shared = shared
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
        self._l1_timeout = wiring.l1_timeout
        self._fill = wiring.filler.fill
        self._keep_absence = wiring.filler.keep_absence
        # What is known of the L2 (tiered/l2/), asked once: hot paths hold its answers.
        self._read_probe = wiring.read_probe
        if wiring.failure_probe is not None:  # declared as its L2 does (stampede.py)
            self.tiered_failure_count = wiring.failure_probe
        self._read_with_expiry = wiring.read_with_expiry
        self._read_many_with_expiry = wiring.read_many_with_expiry
        self._read_pickle = wiring.read_pickle
        self._written_expiry = wiring.written_expiry
        self._write_through = wiring.write_through
        self._breaker = wiring.breaker
        self._l2_call = wiring.read_l2
        self._stale_for = wiring.stale_for
        self._stale = wiring.stale
        self._refuses_quietly = wiring.breaker is not None and wiring.breaker.masks
        self._writer = Writer(wiring)
        link = wiring.link
        self._flush = None if link is None else link.flush
        self._flush_mark = None if link is None else link.mark
        self._strict = (None if link is None or not wiring.config.strict_lease
                        else link.strict_write)

    def _l1_by_final(self) -> None:
        """``key_func`` or ``key_prefix`` was reassigned on this instance: index
        its L1 entries by final key from now on (``L1Index``)."""
        self._index.by_call = self._by_call = False

    @property
    def write_through(self) -> bool:
        """Does a write keep its value in this L1 (and publish it on the board)?"""
        return self._write_through

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
                    value = self._from_board(l1key, record[4], record[7])
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
                value = self._from_board(l1key, item[2], item[5])
                if value is not _MISS:
                    return value, l1key
            self._l1.pop(l1key)
            self._door.seen(l1key)
        return _MISS, l1key

    def _from_board(self, l1key: tuple, offset: int, final: bytes) -> Any:
        """After an invalidation: the key's new value (or ``_ABSENT``) from the
        value board, kept in L1; ``_MISS`` if the board cannot tell. The board
        answers only for the very final key asked for (compared in full)."""
        buffer = self._buffer
        token = (offset, _u64(buffer, EPOCH_OFFSET)[0], _token(buffer, offset))
        got, expires = self._board.fetch(  # type: ignore[union-attr]
            GenerationTable.slot_index(offset), token[2], token[1], final)
        if got is NOT_PUBLISHED or got is EXPIRY_ONLY:
            return _MISS
        if got is ABSENT:
            self._stats.board_hits += 1
            self._stats.l1_misses += 1
            self._keep_absence(l1key, token, final)
            return _ABSENT
        life = min(self._l1_timeout, expires - time.time())
        if life <= 0:  # expired in the L2 by now: let the L2 say so
            return _MISS
        self._stats.board_hits += 1
        self._stats.l1_hits += 1
        # Board values are plain immutable scalars: no copy, no size walk.
        self._l1.put(l1key, (got, _OBJECT, *token, final),
                     _getsizeof(got) + _getsizeof(l1key[0]), _monotonic() + life)
        return got

    def _current(self, item: tuple) -> bool:
        """Is this L1 item's token still the slot's (``is_current``, inlined)?"""
        buffer = self._buffer
        return (_token(buffer, item[2]) == item[4]
                and _u64(buffer, EPOCH_OFFSET)[0] == item[3])

    def _reading(self, key: Any, version: Any,
                 final: str | None = None) -> tuple[Token, bytes] | None:
        """The slot's token, taken BEFORE the L2 read, and the final key; None:
        keep out of L1 (``locate_for_l1``)."""
        if not self._l1.max_entries:
            return None
        located = locate_for_l1(self._l2, self._table, key, version, final)
        if located is None:
            return None
        self._buffer = self._table.buffer  # the check may have moved to a new file
        final, off = located
        return self._table.read_at(off), final.encode("utf-8", "surrogatepass")

    def _admit(self, l1key: tuple) -> bool:
        """Should a read that missed the L1 fill it? (``tiered/admission.py``): while
        the gate is open, and once the L1 is full, on the key's second miss. While
        the gate bypasses, a sampled miss fills it on the key's second sampled miss
        only, room or not: in a spread phase a key read once is rarely read again,
        and each fill costs more than the plain read it replaces."""
        stats = self._stats
        gate = self._gate
        if not gate.admit(stats.l1_hits + stats.l1_misses):  # board answers are in them
            return False
        if gate.bypassing:
            return self._door.admit(l1key)
        return self._door.lets_in(self._l1, l1key)

    def _get_through(self, key: Any, default: Any, version: Any, l1key: tuple | None) -> Any:
        host_stats_tick()  # a flush of the host-wide counters, when one is due
        reading = None if l1key is None or not self._admit(l1key) else self._reading(key, version)
        probe = None if reading is None else self._read_probe
        failures = 0 if probe is None else probe()
        reader = None if reading is None else self._read_with_expiry
        pickled = None
        breaker = self._breaker
        if breaker is not None:
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

    def _fill_epoch(self) -> int | None:
        """After an L2 read, before keeping what it read: the epoch a token must
        carry to be kept under, or None (keep nothing) if the table's file is no
        longer the one at its path (``confirm``: one ``stat``). A token taken by
        this thread while another moved the table to a new file came from the
        old mapping, which nobody stamps any more: its epoch is not this one."""
        table = self._table
        return _u64(table.buffer, EPOCH_OFFSET)[0] if table.confirm() else None

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
            readings = {k: None if l1key is None or not self._admit(l1key)
                        else self._reading(k, version, finals.get(k))
                        for k, l1key in missing.items()}
            probe = self._read_probe
            failures = 0 if probe is None else probe()
            batch = self._read_many_with_expiry
            read: Any = self._l2.get_many if batch is None else batch
            if self._breaker is None:
                answer = read(list(missing), version=version)
            else:
                answer = self._l2_call(_REFUSED, read, list(missing),  # type: ignore[misc]
                                       version=version)
            refused = answer is _REFUSED
            if refused:
                got, expiries = {}, {}
            elif batch is None:
                got, expiries = answer, {}
            else:
                got = {k: v for k, (v, _) in answer.items()}
                expiries = {k: e for k, (_, e) in answer.items()}
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
        if self._breaker is None:
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
                                    early=self._config.early_refresh, scope=self._scope)

    def readable_after_set(self, seconds: float) -> bool:
        """Does the L2 keep a value set with a timeout of ``seconds`` at all? Not
        with less than a second where it keeps whole seconds (Django's
        ``RedisCache``, memcached): ``get_or_set``'s waiters must not wait for it."""
        now = time.time()
        return self._written_expiry(seconds, now) > now

    # -- beyond Django's API ------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """This process's counters for this configuration (``Shared.report``), and
        across hosts the link's, prefixed ``cluster_``."""
        out = self._shared.report()
        if self._config.coherence == "cluster":
            out.update({f"cluster_{k}": v for k, v in cluster_stats(self._table).items()})
        return out

    def host_stats(self) -> dict[str, Any]:
        """Every process's counters on this host, summed (``tiered.state.host_report``)."""
        return host_report(self._shared, self._l2)

    @property
    def generation_table(self) -> GenerationTable:
        """The table this instance checks (the L2's own when it keeps one)."""
        return self._table
