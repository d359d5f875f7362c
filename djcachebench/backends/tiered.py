"""``TieredCache``: an in-process L1 in front of any Django cache, coherent on the host.

Reads are answered from a per-process LRU map (``djcachebench.l1``) at dict
speed; every write goes to the L2 first and then stamps the key's slot in the
shared generation table (``djcachebench.coherence``), which every process
checks before it serves an L1 hit. The protocol, its guarantees and its limits
are in ``docs/tiered.md``; how the settings combine is in ``tiered_config``.

The adapter is thin on purpose, like Django's ``RedisCache``: it never makes a
key of its own. The caller's key and version go to the L2 unchanged, so the
tiered alias and its L2 alias address the same entries. The L1 is indexed by
``(key, version)`` for ``str`` keys, which lets a hit skip Django's key making
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
from djcachebench.coherence import KEEP, GenerationTable, Token
from djcachebench.l1 import L1Map

__all__ = ["TieredCache"]

_MISS: Any = object()
_loads = pickle.loads
_monotonic = time.monotonic
_getsizeof = sys.getsizeof

# Kept in L1 as the very object: nobody can change it behind the cache's back.
# Exact types only: a subclass may carry a mutable __dict__.
_IMMUTABLE = frozenset({str, bytes, int, float, bool, type(None), complex, Decimal})


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

    l1_hits: int = 0  # get/get_many answered from L1
    l2_hits: int = 0  # L1 could not answer, the L2 had the key
    misses: int = 0  # neither had it
    invalidations: int = 0  # L1 entry found, but its key was written since
    no_expiry: int = 0  # L2 value not kept in L1: its L2 expiry was unknown


class _Shared:
    """What all instances (threads) of one configuration share in a process."""

    __slots__ = ("l1", "stamps", "stats", "table")

    def __init__(self, l1: L1Map, table: GenerationTable, stamps: bool) -> None:
        self.l1 = l1
        self.table = table
        self.stamps = stamps
        self.stats = TieredStats()


_shared: dict[str, _Shared] = {}
_tables: dict[str, GenerationTable] = {}
_lock = threading.Lock()


def _open_shared(identity: str, config: TieredConfig, l2: BaseCache) -> _Shared:
    with _lock:
        shared = _shared.get(identity)
        if shared is not None:
            return shared
        own = getattr(l2, "coherence_table", None)
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
        l1 = L1Map(config.l1_max_entries, config.l1_max_bytes)
        shared = _shared[identity] = _Shared(l1, table, stamps)
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
        self._is_current = shared.table.is_current
        self._version = self._l2.version
        self._l1_timeout = math.inf if config.l1_timeout is None else config.l1_timeout
        # COHERENCE="none" is documented as "fresh by L1_TIMEOUT only".
        self._trust_unknown_expiry = config.coherence == "none"

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
        if version is None:
            version = self._version
        if type(key) is str:
            item = self._l1_get((key, version))
            if item is not None:
                if self._is_current(None, item[2]):
                    self._stats.l1_hits += 1
                    return _loads(item[0]) if item[1] else item[0]
                self._stale((key, version))
        return self._get_through(key, default, version)

    def _stale(self, l1key: tuple[str, Any]) -> None:
        self._stats.invalidations += 1
        self._l1.pop(l1key)

    def _reading(self, key: Any, version: Any) -> tuple[Token, float | None] | None:
        """Token and published expiry, taken BEFORE the L2 read; None: keep out of L1.

        Only ``str`` keys whose final key Django would not warn about go to L1:
        an L1 hit skips validation, so it must have nothing to warn about.
        """
        if type(key) is not str or not self._l1.max_entries:
            return None
        final = self._l2.make_key(key, version=version)
        if type(final) is not str or next(memcache_key_warnings(final), None) is not None:
            return None
        return self._table.read(final)

    def _get_through(self, key: Any, default: Any, version: Any) -> Any:
        reading = self._reading(key, version)
        value = self._l2.get(key, _MISS, version=version)
        if value is _MISS:
            self._stats.misses += 1
            return default
        self._stats.l2_hits += 1
        if reading is not None:
            self._fill((key, version), reading, value)
        return value

    def _fill(self, l1key: tuple[str, Any], reading: tuple[Token, float | None],
              value: Any) -> None:
        """Keep a value read from L2 (never one from a failed read: callers only
        get here with a value the L2 returned)."""
        token, expires = reading
        life = self._l1_timeout
        if expires is None:
            if not self._trust_unknown_expiry:
                self._stats.no_expiry += 1
                return
        else:
            life = min(life, expires - time.time())
        if life <= 0:
            return
        size = _immutable_size(value)
        if size >= 0:
            item = (value, False, token)
        else:
            # Mutable: keep it pickled, so mutating what get() returned cannot
            # change what the next get() returns.
            try:
                blob = pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
            except Exception:  # the L2 stored it some other way; just do not keep it
                return
            item, size = (blob, True, token), _getsizeof(blob)
        self._l1.put(l1key, item, size + _getsizeof(l1key[0]), _monotonic() + life)

    def get_many(self, keys: Iterable[Any], version: int | None = None) -> dict[Any, Any]:
        if version is None:
            version = self._version
        found: dict[Any, Any] = {}
        missing: list[Any] = []
        for key in keys:
            if type(key) is str:
                item = self._l1_get((key, version))
                if item is not None:
                    if self._is_current(None, item[2]):
                        self._stats.l1_hits += 1
                        found[key] = _loads(item[0]) if item[1] else item[0]
                        continue
                    self._stale((key, version))
            missing.append(key)
        if missing:
            readings = {k: self._reading(k, version) for k in missing}
            got = self._l2.get_many(missing, version=version)
            for key in readings:
                if key in got:
                    self._stats.l2_hits += 1
                    reading = readings[key]
                    if reading is not None:
                        self._fill((key, version), reading, got[key])
                else:
                    self._stats.misses += 1
            found.update(got)
        return found

    def has_key(self, key: Any, version: int | None = None) -> bool:
        if version is None:
            version = self._version
        if type(key) is str:
            item = self._l1_get((key, version))
            if item is not None and self._is_current(None, item[2]):
                return True
        return self._l2.has_key(key, version=version)

    # -- writes: L2 first, then stamp -------------------------------------------

    def _expires_at(self, timeout: Any) -> float:
        """Wall-clock L2 expiry of a write, taken before it (so never too late)."""
        if timeout is DEFAULT_TIMEOUT:
            timeout = self._l2.default_timeout
        if timeout is None:
            return math.inf
        return time.time() + timeout

    def _written(self, key: Any, version: Any, expires: Any) -> None:
        """The L2 write of ``key`` is over (or failed): make every L1 drop it."""
        if self._stamps:
            self._table.stamp(self._l2.make_key(key, version=version), expires)
        if type(key) is str:
            self._l1.pop((key, version))

    def set(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT,
            version: int | None = None) -> None:
        if version is None:
            version = self._version
        expires = self._expires_at(timeout)
        try:
            self._l2.set(key, value, timeout, version=version)
        except BaseException:
            self._written(key, version, None)  # the L2 may or may not hold it
            raise
        self._written(key, version, expires)

    def add(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT,
            version: int | None = None) -> bool:
        if version is None:
            version = self._version
        expires = self._expires_at(timeout)
        try:
            added = self._l2.add(key, value, timeout, version=version)
        except BaseException:
            self._written(key, version, None)
            raise
        if added:  # a refused add changed nothing: no process needs to drop anything
            self._written(key, version, expires)
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
        try:
            return self._l2.delete(key, version=version)
        finally:
            # Stamped even when the L2 says there was nothing to delete: the L2
            # may have evicted it while L1s elsewhere still hold it.
            self._written(key, version, None)

    def incr(self, key: Any, delta: int = 1, version: int | None = None) -> Any:
        if version is None:
            version = self._version
        try:
            return self._l2.incr(key, delta, version=version)
        finally:
            self._written(key, version, KEEP)

    def decr(self, key: Any, delta: int = 1, version: int | None = None) -> Any:
        if version is None:
            version = self._version
        try:
            return self._l2.decr(key, delta, version=version)
        finally:
            self._written(key, version, KEEP)

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
        if type(key) is str:
            item = self._l1_get((key, version))
            if item is not None and self._is_current(None, item[2]):
                self._stats.l1_hits += 1
                return _loads(item[0]) if item[1] else item[0]
        return await sync_to_async(self.get, thread_sensitive=True)(key, default, version)

    async def aget_many(self, keys: Iterable[Any], version: int | None = None) -> dict[Any, Any]:
        if version is None:
            version = self._version
        keys = list(keys)
        found: dict[Any, Any] = {}
        for key in keys:
            if type(key) is str:
                item = self._l1_get((key, version))
                if item is not None and self._is_current(None, item[2]):
                    self._stats.l1_hits += 1
                    found[key] = _loads(item[0]) if item[1] else item[0]
        if len(found) < len(keys):
            rest = [k for k in keys if k not in found]
            found.update(await sync_to_async(self.get_many, thread_sensitive=True)(rest, version))
        return found

    async def ahas_key(self, key: Any, version: int | None = None) -> bool:
        if version is None:
            version = self._version
        if type(key) is str:
            item = self._l1_get((key, version))
            if item is not None and self._is_current(None, item[2]):
                return True
        return await sync_to_async(self.has_key, thread_sensitive=True)(key, version)

    # -- beyond Django's API ------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """This process's counters for this configuration (see ``TieredStats``)."""
        out = asdict(self._stats)
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
