"""What TieredCache instances of one configuration share in a process, and helpers.

Django builds a backend instance per thread; the L1 map, the generation table,
the value board and the counters are per process (like LocMemCache's store),
so they live here, found again by the configuration's identity.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, fields
from decimal import Decimal
from typing import Any

from django.core.cache import caches
from django.core.cache.backends.base import MEMCACHE_MAX_KEY_LENGTH, BaseCache, default_key_func
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from djcachebench.coherence import GenerationTable, open_table
from djcachebench.coherence.board import ValueBoard, board_key, open_board
from djcachebench.coherence.registry import Registry
from djcachebench.coherence.stamper import EngineStamper
from djcachebench.conf import signing_secrets
from djcachebench.hoststats import publish as host_stats
from djcachebench.hoststats.file import read_totals
from djcachebench.hoststats.publish import departed
from djcachebench.keys import MEMCACHE_BAD_CHARS
from djcachebench.l1 import L1Map
from djcachebench.tiered.admission import Doorkeeper, Gate
from djcachebench.tiered.cluster import attach_cluster
from djcachebench.tiered.config import TieredConfig
from djcachebench.tiered.locations import default_generation_path, store_identity

_monotonic = time.monotonic
MISS: Any = object()
ABSENT_HIT: Any = object()  # what _lookup() returns for a key the L1 knows is absent

# L1 items are (payload, kind, slot offset, epoch, slot token, final key): the
# token fields flat, so a hit reaches them in the one record tuple of the L1 map
# (records are (deadline, size, *item)). kind says what the payload is; the
# final key (UTF-8 bytes) is what the value board compares, byte for byte.
OBJECT, PICKLED, ABSENCE = 0, 1, 2
#: Where each field sits in an L1 *record* (the map's ``(deadline, size, *item)``).
#: ``TieredCache.get`` inlines these as literal indices (a global lookup per field
#: costs more than the field read); ``tests/tiered/test_tiered.py`` pins that it agrees
#: with the slow path, which goes through ``L1Map.get`` and item indices.
R_DEADLINE, R_SIZE, R_PAYLOAD, R_KIND, R_OFFSET, R_EPOCH, R_TOKEN, R_FINAL = range(8)
#: The same fields in an *item* (what ``L1Map.get`` returns: the record minus two).
I_PAYLOAD, I_KIND, I_OFFSET, I_EPOCH, I_TOKEN, I_FINAL = range(6)
_getsizeof = sys.getsizeof

# Kept in L1 as the very object: nobody can change it behind the cache's back.
# Exact types only: a subclass may carry a mutable __dict__.
IMMUTABLE = frozenset({str, bytes, int, float, bool, type(None), complex, Decimal})




def would_warn(final: Any) -> bool:
    """Would Django's ``memcache_key_warnings`` warn about this final key?

    The same two conditions, with a compiled pattern: Django's own generator
    goes through a lazily compiled regex proxy, a few microseconds on every
    write. An L1 hit skips validation, so only keys with nothing to warn about
    are kept in L1.
    """
    return (type(final) is not str or len(final) > MEMCACHE_MAX_KEY_LENGTH
            or MEMCACHE_BAD_CHARS(final) is not None)


def locate_for_l1(l2: BaseCache, table: GenerationTable, key: Any,
                  version: Any, final: str | None = None) -> tuple[str, int] | None:
    """``(final key, slot offset)`` of a key the L1 may keep, or None.

    Only keys whose final key Django would not warn about go to L1 (an L1 hit
    skips validation, so it must have nothing to warn about), and nothing is
    kept while the shared table cannot be trusted (``check``), nor, in a
    table a storage engine stamps, in the moment after this process mapped its
    file (``keep_after``: an engine's writer that has not looked since the file
    it maps was replaced by this one may still write without stamping this
    one; see ``coherence/stamper.py``).
    ``final``: the final key, where the caller has made it already.
    """
    if final is None:
        final = l2.make_key(key, version=version)
    if would_warn(final) or not table.check():
        return None
    if _monotonic() < table.keep_after and table.engine_stamped():
        return None
    return final, table.locate(final)


def l1_index(key: Any, version: Any) -> tuple | None:
    """The L1's index for a call, where ``(key, version)`` alone determines the
    final key (see :class:`L1Index`); None where it may not.

    Only ``str`` and ``bytes`` keys with an ``int`` or ``str`` version, exact
    types: equal numbers of other types are equal dict keys but make other
    cache keys (version ``1``, ``1.0`` and ``True`` make ``:1:k``, ``:1.0:k``
    and ``:True:k``; an index that took them for one served version 1's value
    to a caller asking for version ``True``). Bytes get a 3-tuple so that a
    ``b"k"`` entry is never compared with a ``"k"`` one (equal hashes; the
    comparison would raise BytesWarning under ``python -b``).
    """
    kind = type(version)
    if kind is not int and kind is not str:
        return None
    kind = type(key)
    if kind is str:
        return (key, version)
    if kind is bytes:
        return (key, version, b"")
    return None


def makes_keys_from_call(l2: BaseCache) -> bool:
    """Does the L2 make its final keys from key, version and its prefix alone?

    Only with Django's own ``make_key`` and default ``KEY_FUNCTION``. A custom
    key function may read more than its arguments: django-tenants' reads the
    current schema, so one ``(key, version)`` names a different entry per
    tenant, and an L1 indexed by the call served one tenant's value to another.
    """
    return (type(l2).make_key is BaseCache.make_key
            and getattr(l2, "key_func", None) is default_key_func)


class L1Index:
    """How the L1 names the entry of a call: one rule for reads and writes.

    By the call (:func:`l1_index`) where the L2 makes keys from its arguments
    alone (:func:`makes_keys_from_call`), so that a hit makes no key; by the
    final key otherwise (a ``make_key`` per hit, and always correct). The two
    shapes never meet: a final-key index is ``(final, None)`` and a call's
    version is never None. ``by_call`` turns off for good when the instance's
    ``key_func`` or ``key_prefix`` is reassigned, because other threads'
    instances share this L1 under the old rule.
    """

    __slots__ = ("_make_key", "by_call")

    def __init__(self, l2: BaseCache) -> None:
        self._make_key = l2.make_key
        self.by_call = makes_keys_from_call(l2)

    def __call__(self, key: Any, version: Any) -> tuple:
        if self.by_call:
            index = l1_index(key, version)
            if index is not None:
                return index
        return self.by_final(key, version)

    def by_final(self, key: Any, version: Any) -> tuple:
        """The index of the entry under its final key."""
        return (self._make_key(key, version=version), None)


def immutable_size(value: Any, depth: int = 0) -> int:
    """Approximate size of an immutable value, or -1 if anything in it is mutable."""
    kind = type(value)
    if kind in IMMUTABLE:
        return _getsizeof(value)
    if (kind is tuple or kind is frozenset) and depth < 8:
        total = _getsizeof(value)
        for item in value:
            size = immutable_size(item, depth + 1)
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
    #                     (each also counted in l1_hits or l1_misses)
    published: int = 0  # values this process put on the value board
    no_expiry: int = 0  # L2 value not kept in L1: its L2 expiry was unknown
    bad_pickles: int = 0  # a kept copy that would not unpickle: dropped, read from L2
    unserved: int = 0  # reads sent to the L2 because the table could not be trusted
    #                    (damaged, or the cross-host guard failing)
    sets: int = 0  # set() calls through this adapter
    deletes: int = 0  # delete() calls through this adapter
    breaker_opened: int = 0  # times this process opened the L2's circuit breaker
    fast_failures: int = 0  # calls refused at once while the breaker was open
    stale_served: int = 0  # L1 copies served past their L1 expiry (SERVE_STALE)

    def __del__(self) -> None:
        departed(self)  # its last counts, into the host-wide sums (hoststats/publish.py)


#: The counters a TieredCache adds to the host-wide sums, in the file beside
#: its generation table (``<table>.stats``): its own (``TieredStats``), then
#: the table's lock give-ups.
HOST_COUNTERS = (*(f.name for f in fields(TieredStats)), "coherence_lock_give_ups")


class Shared:
    """What all instances (threads) of one configuration share in a process."""

    __slots__ = ("__weakref__", "board", "breaker", "door", "gate", "l1", "l2_stamps", "stamper",
                 "stamps", "stats", "store", "table")

    def __init__(self, l1: L1Map, table: GenerationTable, stamps: bool, l2_stamps: bool,
                 board: ValueBoard | None, stamper: EngineStamper | None = None,
                 store: bytes | None = None) -> None:
        self.l1 = l1
        self.store = store  # the L2's store (locations.store_identity)
        # The L2's engine stamper, when the L2 stamps from inside its own write
        # transactions (coherence/stamper.py): writes announce themselves to it.
        self.stamper = stamper
        self.board = board
        self.table = table
        self.stamps = stamps  # the adapter stamps its writes
        self.l2_stamps = l2_stamps  # the L2 stamps its own mutations
        self.stats = TieredStats()
        # The L2's circuit breaker (tiered/breaker.py), made by the first instance.
        self.breaker: Any = None
        self.gate = Gate()  # fills the L1 only while it pays (admission.py)
        self.door = Doorkeeper(l1.max_entries)  # once full, on a key's second miss

    def report(self) -> dict[str, int]:
        """What ``TieredCache.stats()`` shows of this configuration in this process:
        its counters (``TieredStats``), and its L1's, table's, admission's and
        board's."""
        out = asdict(self.stats)
        out["misses"] = out["l1_misses"] + out["l2_misses"]
        l1, table = self.l1, self.table
        out.update(
            l1_evictions=l1.stats.evictions,
            l1_expirations=l1.stats.expirations,
            l1_rejected=l1.stats.rejected,
            l1_entries=len(l1),
            l1_bytes=l1.nbytes,
            coherence_lock_give_ups=table.stats.lock_give_ups,
            coherence_repairs=table.stats.repairs,
            coherence_faults=table.stats.faults,
            coherence_clock_steps=table.stats.clock_steps,
            l1_bypassed=self.gate.bypassed,
            l1_bypass_windows=self.gate.windows,
            l1_kept_out=self.door.kept_out,
            # Board slots whose tag did not verify (another SECRET_KEY, or altered).
            board_forged=0 if self.board is None else self.board.forged,
        )
        return out


#: The process's L1 (and what goes with it) per configuration, shared by the
#: instances Django builds per thread, and kept while any uses it or it is one
#: of the most recent (``coherence/registry.py``): instances made per request
#: find it warm; a process that goes through many configurations (a temporary
#: LOCATION per test) does not keep every L1 and table it ever made.
_shared: Registry[str, Shared] = Registry()
_private_tables: Registry[tuple[str, int], GenerationTable] = Registry()


def open_shared(identity: str, config: TieredConfig, l2: BaseCache) -> Shared:
    with _shared.lock:
        shared = _shared.find(identity)
        if shared is not None:
            return shared
        own = getattr(l2, "coherence_table", None)
        stamper = getattr(l2, "coherence_stamper", None)
        if not isinstance(stamper, EngineStamper) or stamper.table is not own:
            stamper = None
        l2_stamps = False
        store = store_identity(config.l2_backend, config.l2_location, config.l2_params, l2)
        if config.coherence == "none":
            # One private table per store and slot count in the process: two
            # configurations over one L2 (two aliases) see each other's writes
            # at once, as "a process sees its own writes" promises (with a table
            # each, either would serve the other's replaced values until
            # L1_TIMEOUT).
            private = (store, config.generation_slots)
            with _private_tables.lock:
                table = _private_tables.find(private)
                if table is None:
                    table = _private_tables.add(
                        private, GenerationTable.in_process(config.generation_slots))
            stamps = True
        elif isinstance(own, GenerationTable):
            if config.generation_path:
                raise ImproperlyConfigured(
                    f"{config.where}['GENERATION_PATH'] = {config.generation_path!r} is invalid; "
                    f"allowed: None (the L2 keeps its own table at {own.path}).")
            # The L2 stamps every mutation it commits (deletes that found nothing
            # too), so the adapter adds no stamp of its own.
            table, stamps, l2_stamps = own, False, True
            # Before any read through this adapter: from now on the L2 stamps
            # its own writes too (it may skip them while nobody watches).
            own.watch()
        else:
            path = config.generation_path or default_generation_path(
                config.l2_backend, config.l2_location, config.l2_params.get("OPTIONS"), l2)
            # A file that cannot be had now (disk full, damaged) gives a table
            # that stays unusable, this L1 off, until it can be.
            table = open_table(path, config.generation_slots)
            if table.engine_stamped():
                raise ImproperlyConfigured(
                    f"{config.where}['GENERATION_PATH'] = {path!r} is invalid: that table is "
                    f"stamped by a ShardedSQLiteCache from inside its transactions; allowed: a "
                    f"path no storage engine uses (or None for the default).")
            stamps = True
            # Guard, outlet, publisher and the host's subscriber election (cluster.py).
            attach_cluster(config, table)
        board = None
        # Sound under "cluster" too: a remote stamp moves the slot's pair, so a
        # value published under the old pair is no longer taken. Values are
        # bound to the store they came from: stores may share a table.
        if config.coherence in ("host", "cluster") and config.shared_value_bytes and table.path:
            secret = _secret_key()
            if secret is not None:
                board = open_board(table.path + ".values", table.slots,
                                   config.shared_value_bytes, board_key(secret), store)
        l1 = L1Map(config.l1_max_entries, config.l1_max_bytes)
        shared = Shared(l1, table, stamps, l2_stamps, board,
                        stamper if l2_stamps else None, store)
        path = host_stats_path(table)
        if path is not None:
            host_stats.attach(path, HOST_COUNTERS, shared.stats, HOST_COUNTERS[:-1])
            host_stats.attach(path, HOST_COUNTERS, table.stats, ("lock_give_ups",),
                              ("coherence_lock_give_ups",))
        return _shared.add(identity, shared)


def host_report(shared: Shared, l2: BaseCache) -> dict[str, Any]:
    """``TieredCache.host_stats()``: every process's counters of the TieredCaches
    over this table, summed (``<table>.stats``), with ``hits`` and ``misses``
    (L1 and L2 together) and ``lock_give_ups`` (the table's); and, where the L2
    reports host-wide stats of its own (a ShardedSQLiteCache), its ``culled``,
    ``entries``, ``stored_bytes`` and ``disk_bytes``, and its report as ``l2``."""
    host_stats.flush_all()
    out: dict[str, Any] = {"backend": "tiered", "counters": None, "processes": 0,
                           "problem": None}
    path = host_stats_path(shared.table)
    if path is None:
        out["problem"] = "COHERENCE='none': no shared table, so no host-wide counters"
    else:
        try:
            totals = read_totals(path)
        except OSError as exc:  # StatsFileError: damaged, or not this user's
            out["problem"] = str(exc)
        else:
            counters = dict.fromkeys(HOST_COUNTERS, 0)
            if totals is not None:
                counters.update(totals.counters)
                out["processes"] = totals.processes
            counters.update(hits=counters["l1_hits"] + counters["l2_hits"],
                            misses=counters["l1_misses"] + counters["l2_misses"],
                            lock_give_ups=counters["coherence_lock_give_ups"])
            out["counters"] = counters
    beneath = getattr(l2, "host_stats", None)
    if callable(beneath):
        below = beneath()
        out["l2"] = below
        if out["counters"] is not None and below.get("counters") is not None:
            out["counters"]["culled"] = below["counters"].get("culled", 0)
        for gauge in ("entries", "stored_bytes", "disk_bytes"):
            if gauge in below:
                out[gauge] = below[gauge]
    return out


def host_stats_path(table: GenerationTable) -> str | None:
    """Where the host-wide sums of the TieredCaches over ``table`` live: beside
    its file; None for a table in this process's memory (``COHERENCE="none"``)."""
    return None if not table.path else table.path + ".stats"


def _secret_key() -> bytes | None:
    """SECRET_KEY as bytes, the root of the value board's tag key; None (no board:
    readers go to the L2) when it is empty, as its tags would then be forgeable."""
    return signing_secrets()[0] or None


def build_l2(config: TieredConfig) -> BaseCache:
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
    if not (isinstance(backend_cls, type) and issubclass(backend_cls, BaseCache)):
        raise ImproperlyConfigured(
            f"{config.where}['L2']['BACKEND'] = {config.l2_backend!r} is not a Django cache "
            f"backend; allowed: the dotted path of a subclass of "
            f"django.core.cache.backends.base.BaseCache.")
    try:
        return backend_cls(config.l2_location, dict(config.l2_params))
    except ImportError as exc:
        # Django's memcached backends import their client library here, not at
        # module level: a missing pylibmc was a bare ModuleNotFoundError.
        raise ImproperlyConfigured(
            f"{config.where}['L2']['BACKEND'] = {config.l2_backend!r} needs a module that "
            f"cannot be imported: {exc}") from exc


def l2_attribute(name: str, clears_l1: bool) -> property:
    """An attribute of BaseCache that is really the L2's (keys are the L2's)."""

    def fget(self: Any) -> Any:
        return getattr(self._l2, name)

    def fset(self: Any, value: Any) -> None:
        setattr(self._l2, name, value)
        if name == "version":
            self._version = value
        if clears_l1:  # the L1 maps (key, version) to entries made under the old rule
            if name != "version":
                self._l1_by_final()
            self._l1.clear()

    return property(fget, fset, doc=f"The L2's ``{name}``.")


