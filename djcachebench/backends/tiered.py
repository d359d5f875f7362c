"""``TieredCache``: an in-process L1 in front of any Django cache, coherent on the host.

Reads are answered from a per-process LRU map (``djcachebench.l1``) at dict
speed; every write goes to the L2 first and then stamps the key's slot in the
shared generation table (``djcachebench.coherence``), which every process
checks before it serves an L1 hit. The protocol, its guarantees and its limits
are in ``docs/tiered.md``; how the settings combine is in ``tiered_config``.

The adapter is thin on purpose, like Django's ``RedisCache``: it never makes a
key of its own. The caller's key and version go to the L2 unchanged, so the
tiered alias and its L2 alias address the same entries. The L1 is indexed by
``(key, version)`` for ``str``/``bytes`` keys, so that a hit skips Django's key making
and validation (~2 us of LocMemCache's ~3 us get); the L2's final key is made
only on a miss, to find the key's generation slot.
"""

from __future__ import annotations

import math
import pickle
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from decimal import Decimal
from typing import Any

from asgiref.sync import sync_to_async
from django.core.cache import caches
from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache, memcache_key_warnings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from djcachebench.backends.tiered_config import (
    TieredConfig,
    default_generation_path,
    read_config,
)
from djcachebench.backends.tiered_l2 import failure_probe, returns_what_was_set
from djcachebench.board import ABSENT, NOT_PUBLISHED, ValueBoard, encode
from djcachebench.coherence import EPOCH_OFFSET, TOKEN, GenerationTable, KeepFrom, Token
from djcachebench.l1 import L1Map

__all__ = ["TieredCache"]

_MISS: Any = object()
_ABSENT: Any = object()  # what _lookup() returns for a key the L1 knows is absent

# L1 items are (payload, kind, slot offset, epoch, slot token, key fingerprint): the
# token fields flat, so a hit reaches them in the one record tuple of the L1 map
# (records are (deadline, size, *item)). kind says what the payload is.
_OBJECT, _PICKLED, _ABSENCE = 0, 1, 2
_loads = pickle.loads
_token = TOKEN.unpack_from
_monotonic = time.monotonic
_getsizeof = sys.getsizeof

# Kept in L1 as the very object: nobody can change it behind the cache's back.
# Exact types only: a subclass may carry a mutable __dict__.
_IMMUTABLE = frozenset({str, bytes, int, float, bool, type(None), complex, Decimal})


def _l1key(key: Any, version: Any) -> tuple | None:
    """The L1's index for a caller's key, or None for keys the L1 does not keep.

    Only ``str`` and ``bytes`` keys: for them ``(key, version)`` determines the
    final key. Numbers do not qualify (``1``, ``1.0`` and ``True`` are equal
    dict keys but make different cache keys). Bytes get a 3-tuple so that a
    ``b"k"`` entry is never compared with a ``"k"`` one (equal hashes; the
    comparison would raise BytesWarning under ``python -b``).
    """
    kind = type(key)
    if kind is str:
        return (key, version)
    if kind is bytes:
        return (key, version, b"")
    return None


def _immutable_size(value: Any, depth: int = 0) -> int:
    """Approximate size of an immutable value, or -1 if anything in it is mutable."""
    kind = type(value)
    if kind in _IMMUTABLE:
        return _getsizeof(value)
    if (kind is tuple or kind is frozenset) and depth < 8:
        total = _getsizeof(value)
        for item in value:
            size = _immutable_size(item, depth + 1)
            if size < 0:
                return -1
            total += size
        return total
    return -1


@dataclass
class TieredStats:
    """Per-process counters of one tiered configuration (approximate under threads:
    plain ``+=``, no lock on the read path)."""

    l1_hits: int = 0  # values served from L1
    l1_misses: int = 0  # misses answered by L1 (the key was known to be absent)
    l2_hits: int = 0  # L1 could not answer, the L2 had the key
    l2_misses: int = 0  # L1 could not answer, the L2 did not have the key
    invalidations: int = 0  # L1 entry found, but its key was written since
    board_hits: int = 0  # ... and the new value (or absence) came from the value board
    published: int = 0  # values this process put on the value board
    no_expiry: int = 0  # L2 value not kept in L1: its L2 expiry was unknown


class _Shared:
    """What all instances (threads) of one configuration share in a process."""

    __slots__ = ("board", "l1", "l2_stamps", "stamps", "stats", "table")

    def __init__(self, l1: L1Map, table: GenerationTable, stamps: bool, l2_stamps: bool,
                 board: ValueBoard | None) -> None:
        self.l1 = l1
        self.board = board
        self.table = table
        self.stamps = stamps  # the adapter stamps its writes
        self.l2_stamps = l2_stamps  # the L2 stamps its own mutations
        self.stats = TieredStats()


_shared: dict[str, _Shared] = {}
_tables: dict[str, GenerationTable] = {}
_boards: dict[str, ValueBoard] = {}
_lock = threading.Lock()


def _open_shared(identity: str, config: TieredConfig, l2: BaseCache) -> _Shared:
    with _lock:
        shared = _shared.get(identity)
        if shared is not None:
            return shared
        own = getattr(l2, "coherence_table", None)
        l2_stamps = False
        if config.coherence == "none":
            table, stamps = GenerationTable.in_process(config.generation_slots), True
        elif isinstance(own, GenerationTable):
            if config.generation_path:
                raise ImproperlyConfigured(
                    f"{config.where}['GENERATION_PATH'] = {config.generation_path!r} is invalid; "
                    f"allowed: None (the L2 keeps its own table at {own.path}).")
            # The L2 stamps every mutation itself; the adapter stamps too only if
            # the L2 does not publish expiries (readers need them to keep values).
            table, stamps = own, not getattr(l2, "coherence_publishes_expiry", False)
            l2_stamps = True
        else:
            path = config.generation_path or default_generation_path(
                config.l2_backend, config.l2_location)
            table = _tables.get(path)
            if table is None:
                try:
                    table = GenerationTable(path, config.generation_slots)
                except (OSError, ValueError) as exc:
                    raise ImproperlyConfigured(
                        f"{config.where}['GENERATION_PATH']: cannot use {path!r}: {exc}") from exc
                _tables[path] = table
            stamps = True
        board = None
        if config.coherence == "host" and config.shared_value_bytes and table.path:
            board_path = table.path + ".values"
            board = _boards.get(board_path)
            if board is None:
                try:
                    board = ValueBoard(board_path, table.slots, config.shared_value_bytes)
                except (OSError, ValueError) as exc:
                    raise ImproperlyConfigured(
                        f"{config.where}['SHARED_VALUE_BYTES']: cannot use the value board "
                        f"{board_path!r}: {exc}") from exc
                _boards[board_path] = board
        l1 = L1Map(config.l1_max_entries, config.l1_max_bytes)
        shared = _shared[identity] = _Shared(l1, table, stamps, l2_stamps, board)
        return shared


def _build_l2(config: TieredConfig) -> BaseCache:
    if config.l2_alias is not None:
        # A private instance (Django builds one per thread anyway): attributes the
        # tests poke, like _max_entries, must not leak into caches[alias].
        return caches.create_connection(config.l2_alias)
    try:
        backend_cls = import_string(config.l2_backend)
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"{config.where}['L2']['BACKEND'] = {config.l2_backend!r} cannot be imported: {exc}"
        ) from exc
    return backend_cls(config.l2_location, dict(config.l2_params))


def _l2_attribute(name: str, clears_l1: bool) -> property:
    """An attribute of BaseCache that is really the L2's (keys are the L2's)."""

    def fget(self: TieredCache) -> Any:
        return getattr(self._l2, name)

    def fset(self: TieredCache, value: Any) -> None:
        setattr(self._l2, name, value)
        if name == "version":
            self._version = value
        if clears_l1:  # the L1 maps (key, version) to entries made under the old rule
            self._l1.clear()

    return property(fget, fset, doc=f"The L2's ``{name}``.")


class TieredCache(BaseCache):
    """A process-local L1 (LRU, bounded) in front of the cache ``OPTIONS["L2"]``."""

    # BaseCache.__init__ would assign these; they are the L2's (see module doc).
    key_func = _l2_attribute("key_func", clears_l1=True)
    key_prefix = _l2_attribute("key_prefix", clears_l1=True)
    version = _l2_attribute("version", clears_l1=True)
    default_timeout = _l2_attribute("default_timeout", clears_l1=False)
    _max_entries = _l2_attribute("_max_entries", clears_l1=False)
    _cull_frequency = _l2_attribute("_cull_frequency", clears_l1=False)

    def __init__(self, location: str, params: dict[str, Any]) -> None:
        # BaseCache.__init__ is not called: all it does is set the attributes
        # above, which belong to the L2 here.
        config = read_config(location, params)
        self._config = config
        self._l2 = _build_l2(config)
        shared = _open_shared(repr((location, params)), config, self._l2)
        self._l1 = shared.l1
        self._table = shared.table
        self._stats = shared.stats
        self._stamps = shared.stamps
        # Bound once: each attribute lookup saved is ~20 ns on the hit path.
        self._l1_get = shared.l1.get
        self._records_get = shared.l1.records.get  # for the inlined hot path
        self._records_touch = shared.l1.records.move_to_end
        self._buffer = shared.table.buffer
        self._board = shared.board
        self._version = self._l2.version
        self._l1_timeout = math.inf if config.l1_timeout is None else config.l1_timeout
        # COHERENCE="none" is documented as "fresh by L1_TIMEOUT only".
        self._trust_unknown_expiry = config.coherence == "none"
        self._failure_probe = failure_probe(self._l2)
        # Write-through: the writer keeps what it wrote (see _through_begin).
        # Over a ShardedSQLiteCache that does not stamp its own culls yet, a
        # written-through value could outlive its cull in L1 (Django's test_cull
        # notices), so it waits for the table; other L2s: see docs, "evictions".
        sqlite_unwired = (type(self._l2).__name__ == "ShardedSQLiteCache"
                          and not shared.l2_stamps)
        self._write_through = (self._failure_probe is not None and config.l1_max_entries > 0
                               and returns_what_was_set(self._l2) and not sqlite_unwired)
        self._max_stamps = int(shared.stamps) + int(shared.l2_stamps)

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
        # L2 reads in between, that is ~40% of an L1 hit).
        if version is None:
            version = self._version
        kind = type(key)
        if kind is str:  # _l1key(), inlined
            l1key: tuple = (key, version)
        elif kind is bytes:
            l1key = (key, version, b"")
        else:
            return self._get_through(key, default, version, None)
        record = self._records_get(l1key)
        if record is not None:
            # record: (deadline, size, payload, kind, offset, epoch, token, fp)
            buffer = self._buffer
            if (_token(buffer, record[4])[0] == record[6]
                    and _token(buffer, EPOCH_OFFSET)[0] == record[5]):
                if record[0] > _monotonic():
                    try:  # noqa: SIM105 - contextlib.suppress costs ~0.2 us here
                        self._records_touch(l1key)
                    except KeyError:  # evicted by another thread meanwhile
                        pass
                    kind = record[3]
                    if kind == _OBJECT:
                        self._stats.l1_hits += 1
                        return record[2]
                    if kind == _PICKLED:
                        self._stats.l1_hits += 1
                        return _loads(record[2])
                    self._stats.l1_misses += 1
                    return default
                self._l1.get(l1key)  # expired: the map drops and counts it
            else:
                self._stats.invalidations += 1
                if self._board is not None:
                    value = self._from_board(l1key, record[4], record[7])
                    if value is not _MISS:
                        return default if value is _ABSENT else value
                self._l1.pop(l1key)
        return self._get_through(key, default, version, l1key)

    def _lookup(self, key: Any, version: Any) -> tuple[Any, tuple | None]:
        """(value, _ABSENT or _MISS, L1 key or None) from the L1 alone.

        ``_MISS``: the L1 cannot answer (a stale entry is dropped on the way).
        """
        l1key = _l1key(key, version)
        if l1key is None:
            return _MISS, None
        item = self._l1_get(l1key)
        if item is not None:
            if self._current(item):
                kind = item[1]
                if kind == _ABSENCE:
                    self._stats.l1_misses += 1
                    return _ABSENT, l1key
                self._stats.l1_hits += 1
                return (_loads(item[0]) if kind == _PICKLED else item[0]), l1key
            self._stats.invalidations += 1
            if self._board is not None:
                value = self._from_board(l1key, item[2], item[5])
                if value is not _MISS:
                    return value, l1key
            self._l1.pop(l1key)
        return _MISS, l1key

    def _from_board(self, l1key: tuple, offset: int, fp: int) -> Any:
        """After an invalidation: the key's new value (or ``_ABSENT``) from the
        value board, kept in L1; ``_MISS`` if the board cannot tell."""
        buffer = self._buffer
        token = (offset, _token(buffer, EPOCH_OFFSET)[0], _token(buffer, offset)[0])
        got, expires = self._board.fetch(  # type: ignore[union-attr]
            GenerationTable.slot_index(offset), token[2], token[1], fp)
        if got is NOT_PUBLISHED:
            return _MISS
        self._stats.board_hits += 1
        if got is ABSENT:
            self._stats.l1_misses += 1
            self._keep_absence(l1key, token, fp)
            return _ABSENT
        life = min(self._l1_timeout, expires - time.time())
        if life <= 0:  # expired in the L2 by now: let the L2 say so
            return _MISS
        self._stats.l1_hits += 1
        # Board values are plain immutable scalars: no copy, no size walk.
        self._l1.put(l1key, (got, _OBJECT, *token, fp),
                     _getsizeof(got) + _getsizeof(l1key[0]), _monotonic() + life)
        return got

    def _current(self, item: tuple) -> bool:
        """Is this L1 item's token still the slot's (``is_current``, inlined)?"""
        buffer = self._buffer
        return (_token(buffer, item[2])[0] == item[4]
                and _token(buffer, EPOCH_OFFSET)[0] == item[3])

    def _reading(self, key: Any, version: Any) -> tuple[Token, float | None, int] | None:
        """Token and published expiry, taken BEFORE the L2 read; None: keep out of L1.

        Only keys whose final key Django would not warn about go to L1: an L1
        hit skips validation, so it must have nothing to warn about.
        """
        if not self._l1.max_entries:
            return None
        final = self._l2.make_key(key, version=version)
        if type(final) is not str or next(memcache_key_warnings(final), None) is not None:
            return None
        off, fp = self._table.locate(final)
        token, expires = self._table.read_at(off, fp)
        return token, expires, fp

    def _get_through(self, key: Any, default: Any, version: Any, l1key: tuple | None) -> Any:
        reading = None if l1key is None else self._reading(key, version)
        probe = None if reading is None else self._failure_probe
        failures = 0 if probe is None else probe()
        value = self._l2.get(key, _MISS, version=version)
        if value is _MISS:
            self._stats.l2_misses += 1
            if probe is not None and probe() == failures:  # a real miss, not a masked failure
                self._keep_absence(l1key, reading[0], reading[2])  # type: ignore[arg-type, index]
            return default
        self._stats.l2_hits += 1
        if reading is not None:
            self._fill(l1key, reading, value)  # type: ignore[arg-type]
        return value

    def _fill(self, l1key: tuple, reading: tuple[Token, float | None, int],
              value: Any) -> None:
        """Keep a value read from L2 (never one from a failed read: callers only
        get here with a value the L2 returned)."""
        token, expires, fp = reading
        life = self._l1_timeout
        if expires is None:
            if not self._trust_unknown_expiry:
                self._stats.no_expiry += 1
                return
        else:
            life = min(life, expires - time.time())
        self._keep(l1key, token, fp, value, life)

    def _keep(self, l1key: tuple, token: Token, fp: int, value: Any, life: float) -> None:
        """Put a value in L1 for ``life`` seconds under ``token``."""
        if life <= 0:
            return
        size = _immutable_size(value)
        if size >= 0:
            item = (value, _OBJECT, *token, fp)
        else:
            # Mutable: keep it pickled, so mutating what get() returned cannot
            # change what the next get() returns.
            try:
                blob = pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
            except Exception:  # the L2 stored it some other way; just do not keep it
                return
            item, size = (blob, _PICKLED, *token, fp), _getsizeof(blob)
        self._l1.put(l1key, item, size + _getsizeof(l1key[0]), _monotonic() + life)

    def _keep_absence(self, l1key: tuple, token: Token, fp: int) -> None:
        """Remember that the key is absent, until its slot is stamped.

        Safe for the same reason as a value: the token was taken before the L2
        read, and no key appears in the L2 without a write, which stamps. Its
        life is L1_TIMEOUT (an absence has no L2 expiry).
        """
        self._l1.put(l1key, (None, _ABSENCE, *token, fp), _getsizeof(l1key[0]) + 64,
                     _monotonic() + self._l1_timeout)

    def get_many(self, keys: Iterable[Any], version: int | None = None) -> dict[Any, Any]:
        if version is None:
            version = self._version
        found: dict[Any, Any] = {}
        missing: dict[Any, tuple | None] = {}
        for key in keys:
            value, l1key = self._lookup(key, version)
            if value is _MISS:
                missing[key] = l1key
            elif value is not _ABSENT:
                found[key] = value
        if missing:
            readings = {k: None if l1key is None else self._reading(k, version)
                        for k, l1key in missing.items()}
            probe = self._failure_probe
            failures = 0 if probe is None else probe()
            got = self._l2.get_many(list(missing), version=version)
            trust_misses = probe is not None and probe() == failures
            for key, l1key in missing.items():
                reading = readings[key]
                if key in got:
                    self._stats.l2_hits += 1
                    if reading is not None:
                        self._fill(l1key, reading, got[key])  # type: ignore[arg-type]
                else:
                    self._stats.l2_misses += 1
                    if reading is not None and trust_misses:
                        self._keep_absence(l1key, reading[0], reading[2])  # type: ignore[arg-type]
            found.update(got)
        return found

    def has_key(self, key: Any, version: int | None = None) -> bool:
        if version is None:
            version = self._version
        l1key = _l1key(key, version)
        if l1key is not None:
            item = self._l1_get(l1key)
            if item is not None and self._current(item):
                return item[1] != _ABSENCE
        return self._l2.has_key(key, version=version)

    # -- writes: L2 first, then stamp -------------------------------------------

    def _expires_at(self, timeout: Any) -> float:
        """Wall-clock L2 expiry of a write, taken before it (so never too late)."""
        if timeout is DEFAULT_TIMEOUT:
            timeout = self._l2.default_timeout
        if timeout is None:
            return math.inf
        return time.time() + timeout

    def _written(self, key: Any, version: Any, expires: Any, final: str | None = None) -> None:
        """The L2 write of ``key`` is over (or failed): make every L1 drop it."""
        if self._stamps:
            if final is None:
                final = self._l2.make_key(key, version=version)
            self._table.stamp(final, expires)
        l1key = _l1key(key, version)
        if l1key is not None:
            self._l1.pop(l1key)

    def _through_begin(self, key: Any, version: Any) -> tuple | None:
        """Before a write: what keeping the written value needs, or None.

        Write-through is a compare-and-stamp (``GenerationTable.chained``): the
        slot's token is read before the L2 write, and the value is kept only if
        every stamp since then was this write's own. Otherwise another write of
        the key completed in between and may be the L2's latest, so the writer
        refills from L2 like everyone else. It also needs an L2 that cannot
        hide a failed write (the failure probe) and that gives back what was
        set (``returns_what_was_set``).
        """
        if not self._write_through:
            return None
        l1key = _l1key(key, version)
        if l1key is None:
            return None
        final = self._l2.make_key(key, version=version)
        if type(final) is not str or next(memcache_key_warnings(final), None) is not None:
            return None
        off, fp = self._table.locate(final)
        since = self._table.read_at(off, fp)[0]
        failures = self._failure_probe()  # type: ignore[misc]
        GenerationTable.begin_chain()
        return l1key, final, since, failures, fp

    def _through_end(self, through: tuple, value: Any, expires: float) -> None:
        """After a successful write: keep ``value`` (``ABSENT`` for a delete) in
        this L1 and publish it on the value board, if the compare-and-stamp
        holds."""
        l1key, _, since, failures, fp = through
        links = GenerationTable.end_chain()
        if self._failure_probe() != failures:  # type: ignore[misc]
            return
        token = self._table.chained(links, since, self._max_stamps)
        if token is None:
            return
        if value is ABSENT:
            self._keep_absence(l1key, token, fp)
        else:
            self._keep(l1key, token, fp, value, min(self._l1_timeout, expires - time.time()))
        board = self._board
        if board is not None:
            encoded = encode(value)
            if (encoded is not None and len(encoded[1]) <= board.max_value
                    and self._table.publish(board, token, expires, fp, *encoded)):
                self._stats.published += 1

    def set(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT,
            version: int | None = None) -> None:
        if version is None:
            version = self._version
        expires = self._expires_at(timeout)
        through = self._through_begin(key, version)
        final = None if through is None else through[1]
        try:
            self._l2.set(key, value, timeout, version=version)
        except BaseException:
            if through is not None:
                GenerationTable.end_chain()
            self._written(key, version, None, final)  # the L2 may or may not hold it
            raise
        self._written(key, version, expires, final)
        if through is not None:
            self._through_end(through, value, expires)

    def add(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT,
            version: int | None = None) -> bool:
        if version is None:
            version = self._version
        expires = self._expires_at(timeout)
        through = self._through_begin(key, version)
        final = None if through is None else through[1]
        try:
            added = self._l2.add(key, value, timeout, version=version)
        except BaseException:
            if through is not None:
                GenerationTable.end_chain()
            self._written(key, version, None, final)
            raise
        if added:  # a refused add changed nothing: no process needs to drop anything
            self._written(key, version, expires, final)
            if through is not None:
                self._through_end(through, value, expires)
        elif through is not None:
            GenerationTable.end_chain()
        return added

    def touch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        if version is None:
            version = self._version
        expires = self._expires_at(timeout)
        touched = False
        try:
            touched = self._l2.touch(key, timeout, version=version)
        finally:
            # Even a failed touch stamps: the key may be gone from the L2 (evicted)
            # while some L1 still holds it.
            self._written(key, version, expires if touched else None)
        return touched

    def delete(self, key: Any, version: int | None = None) -> bool:
        if version is None:
            version = self._version
        through = self._through_begin(key, version)
        final = None if through is None else through[1]
        try:
            deleted = self._l2.delete(key, version=version)
        except BaseException:
            if through is not None:
                GenerationTable.end_chain()
            self._written(key, version, None, final)
            raise
        # Stamped even when the L2 says there was nothing to delete: the L2
        # may have evicted it while L1s elsewhere still hold it.
        self._written(key, version, None, final)
        if through is not None:
            self._through_end(through, ABSENT, 0.0)
        return deleted

    def incr(self, key: Any, delta: int = 1, version: int | None = None) -> Any:
        return self._counter("incr", key, delta, version)

    def decr(self, key: Any, delta: int = 1, version: int | None = None) -> Any:
        return self._counter("decr", key, delta, version)

    def _counter(self, op: str, key: Any, delta: int, version: Any) -> Any:
        """incr/decr keep the key's L2 expiry: publish the one known before, if
        no other write of the key came in between (``KeepFrom``)."""
        if version is None:
            version = self._version
        final = self._l2.make_key(key, version=version) if self._stamps else None
        keep = None
        if final is not None:
            token, expires = self._table.read(final)
            keep = KeepFrom(token, expires)
            GenerationTable.begin_chain()
        try:
            return getattr(self._l2, op)(key, delta, version=version)
        finally:
            self._written(key, version, keep, final)
            if final is not None:
                GenerationTable.end_chain()

    def set_many(self, data: Mapping[Any, Any], timeout: Any = DEFAULT_TIMEOUT,
                 version: int | None = None) -> list[Any]:
        if version is None:
            version = self._version
        expires = self._expires_at(timeout)
        try:
            failed = self._l2.set_many(data, timeout, version=version)
        except BaseException:
            for key in data:
                self._written(key, version, None)
            raise
        refused = set(failed or ())
        for key in data:
            self._written(key, version, None if key in refused else expires)
        return failed

    def delete_many(self, keys: Iterable[Any], version: int | None = None) -> None:
        if version is None:
            version = self._version
        keys = list(keys)
        try:
            self._l2.delete_many(keys, version=version)
        finally:
            for key in keys:
                self._written(key, version, None)

    def incr_version(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        """The L2's own ``incr_version`` (redis renames, keeping the TTL), then both
        versions are stamped. The new entry's expiry is not known to the adapter."""
        if version is None:
            version = self._version
        try:
            return self._l2.incr_version(key, delta, version=version)
        finally:
            self._written(key, version, None)
            self._written(key, version + delta, None)

    def decr_version(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        return self.incr_version(key, -delta, version)

    def clear(self) -> None:
        try:
            self._l2.clear()
        finally:
            self._table.stamp_all()
            self._l1.clear()

    def close(self, **kwargs: Any) -> None:
        """Django calls this after every request: it closes the L2 only. The L1
        and the table are the process's, and stay warm."""
        self._l2.close(**kwargs)

    # -- async: an L1 hit needs no thread hop ---------------------------------------

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
        for key in keys:
            value, _ = self._lookup(key, version)
            if value is _MISS:
                rest.append(key)
            elif value is not _ABSENT:
                found[key] = value
        if rest:
            found.update(await sync_to_async(self.get_many, thread_sensitive=True)(rest, version))
        return found

    async def ahas_key(self, key: Any, version: int | None = None) -> bool:
        if version is None:
            version = self._version
        l1key = _l1key(key, version)
        if l1key is not None:
            item = self._l1_get(l1key)
            if item is not None and self._current(item):
                return item[1] != _ABSENCE
        return await sync_to_async(self.has_key, thread_sensitive=True)(key, version)

    # -- beyond Django's API ------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """This process's counters for this configuration (see ``TieredStats``)."""
        out = asdict(self._stats)
        out["misses"] = out["l1_misses"] + out["l2_misses"]
        l1 = self._l1
        out.update(
            l1_evictions=l1.stats.evictions,
            l1_expirations=l1.stats.expirations,
            l1_rejected=l1.stats.rejected,
            l1_entries=len(l1),
            l1_bytes=l1.nbytes,
        )
        return out

    @property
    def generation_table(self) -> GenerationTable:
        """The table this instance checks (the L2's own when it keeps one)."""
        return self._table
