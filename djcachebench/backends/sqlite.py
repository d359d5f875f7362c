"""``ShardedSQLiteCache``: the Django adapter over the sharded SQLite engine.

Following Django's own ``RedisCache``, this class only makes keys, converts
timeouts to absolute expiry and maps the engine's outcomes onto Django's
contract; the engine (``djcachebench.store``) knows nothing of Django.

What a failure looks like to the caller (the engine has already counted and
logged it): a read that cannot be served is a miss; ``add``/``delete``/
``touch`` return ``False``; ``set`` returns as usual (Django's ``set`` has no
result); ``set_many`` returns the keys it could not store. With
``RAISE_ON_TIMEOUT`` a give-up raises ``ShardLockTimeout`` instead.
``incr``/``decr`` have no failure value that could not be mistaken for a
count, so they raise ``CacheUnavailable`` when their shard is unreachable.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from asgiref.sync import sync_to_async
from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache
from django.core.exceptions import ImproperlyConfigured

from .. import conf
from ..abandon import run_abandonable
from ..coherence import GenerationTable, open_table
from ..coherence.stamper import EngineStamper
from ..hoststats import publish as host_stats
from ..hoststats.file import read_totals
from ..keys import FastKeyValidation
from ..serializers import SHORT_NAMES, Sealer, derive_tag_key, load_serializer
from ..stampede import (
    EARLY_REFRESH_ALLOWED,
    check_early_refresh,
    protected_get_or_set,
)
from ..store.codec import CUSTOM_SERIALIZER_ID, SERIALIZER_IDS, Codec
from ..store.layout import LayoutError, LayoutGuard, ensure_manifest, prepare_directory
from ..store.retry import (
    CacheUnavailable,
    RetryPolicy,
    ShardLockTimeout,
    not_a_wait,
    within_budget,
)
from ..store.shardset import MISSING, ShardSet
from ..store.stats import STATS_FILE
from ..store.vouch import BOARD_FILE, VouchBoard
from ..store.vouch import KEY_CONTEXT as VOUCH_CONTEXT

BACKEND_PATH = "djcachebench.backends.sqlite.ShardedSQLiteCache"
GENERATIONS_FILE = "generations.mmap"

OPTIONS = conf.OptionTable()
OPTIONS.add(conf.Option("SHARDS", 8, "an integer from 1 to 1024", conf.integer(1, 1024),
                        "Number of SQLite files; fixed for the life of the directory."))
OPTIONS.add(conf.Option("LOCK_TIMEOUT", 0.25, "a number of seconds >= 0 and <= 3600",
                        conf.number(0.0, 3600.0),
                        "How long one attempt waits for a busy shard."))
OPTIONS.add(conf.Option("RETRIES", 2, "an integer from 0 to 100", conf.integer(0, 100),
                        "Further attempts after the first one timed out."))
OPTIONS.add(conf.Option("RETRY_BACKOFF", 0.02, "a number of seconds >= 0 and <= 60",
                        conf.number(0.0, 60.0),
                        "Base pause before further attempt n: RETRY_BACKOFF * 2**n, jittered."))
OPTIONS.add(conf.Option("RAISE_ON_TIMEOUT", False, "True or False", conf.boolean,
                        "Raise ShardLockTimeout instead of a miss / failed write."))
# MAX_ENTRIES and CULL_FREQUENCY are Django's: every value BaseCache takes is taken.
OPTIONS.add(conf.MAX_ENTRIES)
OPTIONS.add(conf.CULL_FREQUENCY)
OPTIONS.add(conf.Option("SIZE_LIMIT", None, "an integer number of bytes >= 1, or None",
                        conf.optional(conf.integer(1)), "Bound on the stored bytes."))
_SERIALIZER = OPTIONS.add(conf.Option("SERIALIZER", "pickle",
                        "'pickle', 'msgpack', or a dotted path to a class with dumps()/loads()",
                        conf.string, "How values other than ints, bytes and str are stored."))
OPTIONS.add(conf.Option("INTEGRITY_KEY", None, "a str or bytes of at least 16 bytes, or None",
                        conf.optional(conf.secret),
                        "Key of the integrity tag; None derives one from SECRET_KEY."))
# Both bounded: SQLite takes cache_size as a 32-bit count of KiB and silently
# reads a larger one as 0 (no cache); 2**40 bytes is past any mapping it makes.
OPTIONS.add(conf.Option("MMAP_SIZE", 0, "an integer number of bytes from 0 to 2**40",
                        conf.integer(0, 2**40), "SQLite mmap_size per connection (0 = off)."))
OPTIONS.add(conf.Option("PAGE_CACHE", 32 * 2**20, "an integer number of bytes from 0 to 2**40",
                        conf.integer(0, 2**40),
                        "SQLite page cache per connection (0 = SQLite's default, ~2 MB)."))
OPTIONS.add(conf.Option("STAMPEDE_LEASE", 10.0,
                        "a number of seconds > 0 and at most 86400, or None to turn it off",
                        conf.optional(conf.number(0.0, 86400.0, lo_open=True)),
                        "get_or_set on a missing key: one caller computes, the others wait."))
OPTIONS.add(conf.Option("EARLY_REFRESH", None, EARLY_REFRESH_ALLOWED,
                        conf.optional(conf.number(0.0, lo_open=True)),
                        "get_or_set on a hit may recompute before expiry (XFetch beta)."))

# A default no stored value can be (get_or_set tells a miss from a stored None).
_MISSING_VALUE: Any = object()

# Our option names, recognised when misplaced at the top level of the alias
# (diskcache's DjangoCache reads SHARDS there, so this mistake is common).
_OPTION_NAMES = frozenset(OPTIONS.names())


_DJANGO_TIMEOUT = BaseCache.get_backend_timeout


class ShardedSQLiteCache(FastKeyValidation, BaseCache):
    """A Django cache on N SQLite files in the directory ``LOCATION``."""

    def __init__(self, location: str, params: dict[str, Any]) -> None:
        self._open(*self._configure(location, params))

    @classmethod
    def check_settings(cls, location: str, params: dict[str, Any]) -> None:
        """Raise ``ImproperlyConfigured`` as the constructor would for these settings,
        without opening the store: nothing is created or written on disk.

        For system checks (``djcachebench.E005``): Django builds caches to check
        them, but building this one creates its directory and files.
        """
        cls.__new__(cls)._configure(location, params)

    def _configure(self, location: str,
                   params: dict[str, Any]) -> tuple[Codec, bytes, str]:
        """Read and validate the settings, touching no file; what :meth:`_open` needs:
        the codec, the integrity secret and the alias's path for messages."""
        options = params.get("OPTIONS")
        options = {} if options is None else options  # [] or "" is refused, not read as {}
        where = conf.setting_path(BACKEND_PATH, location, options)
        alias_path = where.rsplit("['OPTIONS']", 1)[0]
        for name in params:
            if name in _OPTION_NAMES:
                raise ImproperlyConfigured(
                    f"{alias_path}[{name!r}] is not read by ShardedSQLiteCache; "
                    f"put it in {where}[{name!r}]."
                )
        # Parsed before BaseCache.__init__, which calls OPTIONS.get() and would
        # crash with an AttributeError on an OPTIONS that is not a dict.
        opts = OPTIONS.parse(options, where)
        # Django's three settings, read with Django's precedence (the legacy
        # lower-case top-level keys first); what Django would silently replace
        # by a default raises instead.
        conf.check_key_function(params.get("KEY_FUNCTION"), f"{alias_path}['KEY_FUNCTION']")
        timeout = conf.django_param(params, conf.TIMEOUT, alias_path)
        for name in ("MAX_ENTRIES", "CULL_FREQUENCY"):
            opts[name] = conf.django_param(params, OPTIONS[name], alias_path, opts[name])
        # OPTIONS None reads as no options (as above), for BaseCache too, which
        # would raise an AttributeError on it.
        super().__init__({**params, "OPTIONS": options})
        # BaseCache int()s TIMEOUT: 2.5 would become 2 and 0.5 would become 0,
        # i.e. nothing cached at all; and it guesses defaults for malformed
        # values. Ours were validated above, so they replace whatever it read.
        self.default_timeout = timeout
        self._max_entries = opts["MAX_ENTRIES"]
        self._cull_frequency = opts["CULL_FREQUENCY"]
        self._raise_on_timeout = opts["RAISE_ON_TIMEOUT"]
        self._stampede_lease = opts["STAMPEDE_LEASE"]
        self._early_refresh = opts["EARLY_REFRESH"]
        conflict = check_early_refresh(self._early_refresh, self._stampede_lease, where)
        if conflict is not None:
            raise ImproperlyConfigured(conflict)
        self.options = opts
        self.enable_key_memo()

        try:
            location = conf.file_path(location)
        except (TypeError, ValueError):
            raise ImproperlyConfigured(
                f"{alias_path}['LOCATION'] must name a directory for the shard files "
                f"(a path without NUL characters; a relative one is made absolute at "
                f"start-up), got {location!r}."
            ) from None
        self.location = location
        #: Names this store for ``get_or_set``'s callers of one process, who wait
        #: together for a key (``djcachebench.stampede``); so do a TieredCache's
        #: over this directory.
        self.stampede_scope = ("djcachebench.sqlite", os.path.realpath(location))
        try:
            serializer = load_serializer(opts["SERIALIZER"])
        except Exception as exc:  # whatever its import or constructor raises (ValueError...)
            raise ImproperlyConfigured(
                f"{where}['SERIALIZER'] = {opts['SERIALIZER']!r} cannot be loaded ({exc}); "
                f"allowed: {_SERIALIZER.allowed}."
            ) from exc
        serializer_id = SERIALIZER_IDS.get(opts["SERIALIZER"], CUSTOM_SERIALIZER_ID)
        secret = opts["INTEGRITY_KEY"]
        older: list[bytes] = []
        if secret is None:
            # As Django's signing: seal with SECRET_KEY, also accept values sealed
            # under SECRET_KEY_FALLBACKS, so the processes on each side of a key
            # rotation read each other's values. An explicit INTEGRITY_KEY is
            # not derived from SECRET_KEY, so SECRET_KEY's fallbacks do not apply.
            secret, older = conf.signing_secrets()
            if not secret:
                raise ImproperlyConfigured(
                    f"ShardedSQLiteCache signs stored values with a key derived from "
                    f"SECRET_KEY, which is empty; set SECRET_KEY or {where}['INTEGRITY_KEY']."
                )
        codec = Codec(serializer, serializer_id, Sealer(derive_tag_key(secret)),
                      [Sealer(derive_tag_key(k)) for k in older],
                      serializer_name=SHORT_NAMES.get(opts["SERIALIZER"], opts["SERIALIZER"]))
        return codec, secret, alias_path

    def _open(self, codec: Codec, secret: bytes, alias_path: str) -> None:
        """Create or open the store at ``self.location`` (directory, manifest, shared files)."""
        location, opts = self.location, self.options
        try:
            prepare_directory(location)
            _, manifest_id = ensure_manifest(location, opts["SHARDS"])
        except LayoutError as exc:
            raise ImproperlyConfigured(f"{alias_path}['LOCATION']: {exc}") from exc
        # Value files verified by one process are taken on their identity by the
        # others (store/vouch.py), under a key of its own derived from the secret.
        codec.share(VouchBoard(os.path.join(location, BOARD_FILE),
                               derive_tag_key(secret, VOUCH_CONTEXT)))
        # The generation table every TieredCache over this directory reads;
        # this backend stamps each change it commits (see docs/architecture.md),
        # so writes that do not go through a TieredCache keep L1s coherent too.
        # A multiple of the shard count: every key of a slot then lives in one
        # shard, whose write lock serialises the slot's board publishes. A file
        # that cannot be had now (disk full, damaged) gives a table that stays
        # unusable, L1s off, until it can be (GenerationTable.pending).
        shards = opts["SHARDS"]
        table = open_table(os.path.join(location, GENERATIONS_FILE),
                           -(-(1 << 16) // shards) * shards)
        self.coherence_table: GenerationTable = table
        #: What this backend's engine calls inside and after each write
        #: transaction (coherence/stamper.py); a TieredCache announces its
        #: writes to it (``expect``) to learn the token to keep them under.
        self.coherence_stamper = EngineStamper(table, opts["SHARDS"])
        self._store = ShardSet(
            location,
            opts["SHARDS"],
            codec=codec,
            policy=RetryPolicy(opts["LOCK_TIMEOUT"], opts["RETRIES"], opts["RETRY_BACKOFF"]),
            max_entries=opts["MAX_ENTRIES"],
            cull_frequency=opts["CULL_FREQUENCY"],
            size_limit=opts["SIZE_LIMIT"],
            mmap_size=opts["MMAP_SIZE"],
            page_cache=opts["PAGE_CACHE"],
            listener=self.coherence_stamper,
            layout=LayoutGuard(location, opts["SHARDS"], manifest_id),
        )
        # Dropped (Django's per-thread instance gone), this thread's shard
        # connections close at once, not at the store's collection (a cycle).
        weakref.finalize(self, self._store.pool.release)

    # -- failure mapping ----------------------------------------------------------

    def _gave_up(self, exc: CacheUnavailable) -> None:
        """Re-raise a give-up when RAISE_ON_TIMEOUT asks for it; otherwise swallow it."""
        if self._raise_on_timeout and isinstance(exc, ShardLockTimeout):
            raise exc

    def _or_false(self, op: Callable[..., bool], *args: Any) -> bool:
        """``op(*args)``, or ``False`` when the shard cannot be reached (see ``_gave_up``)."""
        try:
            return op(*args)
        except CacheUnavailable as exc:
            self._gave_up(exc)
            return False

    def _expiry(self, timeout: Any) -> float | None:
        """Django's ``get_backend_timeout``, refusing what is not a finite number.

        Django computes ``time.time() + timeout``: NaN would be bound as NULL
        (never expires) and then fail to be published to the coherence table
        after the commit, and ``inf`` reads as "never" while ``None`` is the
        documented way to say it. Both are refused here, before anything is
        written; non-numbers raise ``TypeError`` as in Django, with the setting
        named.
        """
        if type(self).get_backend_timeout is _DJANGO_TIMEOUT:
            # Django's own, inlined for the common timeouts (the write path's
            # frames are a share of its cost); anything else takes the long way.
            seconds = self.default_timeout if timeout is DEFAULT_TIMEOUT else timeout
            if type(seconds) is int and seconds > 0:
                return time.time() + seconds
            if seconds is None:
                return None
        try:
            expires = self.get_backend_timeout(timeout)
            finite = expires is None or math.isfinite(expires)
        except TypeError:
            raise TypeError(
                f"timeout={timeout!r} is invalid; allowed: a number of seconds, or None "
                f"for no expiry."
            ) from None
        if not finite:
            raise ValueError(
                f"timeout={timeout!r} is invalid; allowed: a finite number of seconds, or "
                f"None for no expiry."
            )
        return expires

    # -- the Django cache API ------------------------------------------------------

    def get(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        key = self.make_and_validate_key(key, version=version)
        try:
            value = self._store.get(key)
        except CacheUnavailable as exc:
            self._store.stats.misses += 1
            self._gave_up(exc)
            return default
        return default if value is MISSING else value

    def get_with_expiry(self, key: Any, default: Any = None,
                        version: int | None = None) -> tuple[Any, float | None]:
        """``(value, expires_at)``: the value as :meth:`get` returns it, and the
        wall-clock time its row expires (``math.inf``: never), from the same
        SELECT; ``(default, None)`` on a miss.

        Part of what this backend offers an L1 in front of it (TieredCache): the
        expiry of *this* value, so that an L1 copy never outlives it, without a
        second query and without any state shared with other keys.
        """
        key = self.make_and_validate_key(key, version=version)
        try:
            value, expires, _ = self._store.get_with_expiry(key)
        except CacheUnavailable as exc:
            self._store.stats.misses += 1
            self._gave_up(exc)
            return default, None
        return (default, None) if value is MISSING else (value, expires)

    def set(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT,
            version: int | None = None) -> None:
        # _set's body, inlined: the write path's frames are a share of its cost.
        key = self.make_and_validate_key(key, version=version)
        expires = self._expiry(timeout)
        try:
            if expires is not None and expires <= time.time():
                self._store.codec.encode(key, value)  # same errors as a stored value
                self._store.delete(key)
            else:
                self._store.set(key, value, expires)
        except CacheUnavailable as exc:
            self._gave_up(exc)

    def _set(self, key: Any, value: Any, timeout: Any, version: int | None,
             copy: bool) -> bytes | None:
        key = self.make_and_validate_key(key, version=version)
        expires = self._expiry(timeout)
        try:
            if expires is not None and expires <= time.time():
                self._store.codec.encode(key, value)  # same errors as a stored value
                self._store.delete(key)
            else:
                return self._store.set(key, value, expires, copy)
        except CacheUnavailable as exc:
            self._gave_up(exc)
        return None

    def add(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT,
            version: int | None = None) -> bool:
        key = self.make_and_validate_key(key, version=version)
        return self._or_false(self._store.add, key, value, self._expiry(timeout))

    def touch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        key = self.make_and_validate_key(key, version=version)
        expires = self._expiry(timeout)
        if expires is not None and expires <= time.time():
            return self._or_false(self._store.delete, key, True)
        return self._or_false(self._store.touch, key, expires)

    def delete(self, key: Any, version: int | None = None) -> bool:
        key = self.make_and_validate_key(key, version=version)
        # True only for a live row: one that had expired was already absent to
        # every read, and Django's backends answer False once a read said so
        # (redis always).
        return self._or_false(self._store.delete, key, True)

    def has_key(self, key: Any, version: int | None = None) -> bool:
        key = self.make_and_validate_key(key, version=version)
        return self._or_false(self._store.has_key, key)

    def incr(self, key: Any, delta: int = 1, version: int | None = None) -> Any:
        key = self.make_and_validate_key(key, version=version)
        return self._store.incr(key, delta)

    def get_many(self, keys: Iterable[Any], version: int | None = None) -> dict[Any, Any]:
        return self._get_many(keys, version, with_expiry=False)

    def get_many_with_expiry(self, keys: Iterable[Any],
                             version: int | None = None) -> dict[Any, tuple[Any, float]]:
        """:meth:`get_many` with each value's expiry, as :meth:`get_with_expiry` gives it."""
        return self._get_many(keys, version, with_expiry=True)

    def _get_many(self, keys: Iterable[Any], version: Any, with_expiry: bool) -> dict[Any, Any]:
        """Every key asked for that is found, as ``BaseCache.get_many`` answers:
        two keys that make one cache key (``1`` and ``"1"``) both get its value."""
        made = [(self.make_and_validate_key(k, version=version), k) for k in keys]
        # One unreachable shard must not turn the other shards' hits into misses.
        failures: list[CacheUnavailable] = []
        found = self._store.get_many(dict(made), failures, with_expiry=with_expiry)
        for exc in failures:
            self._gave_up(exc)
        answer: dict[Any, Any] = {}
        given: set[str] = set()
        for mk, k in made:
            if mk in found:
                # A second key of one cache key gets its own copy, as each of
                # BaseCache's gets would decode one: a caller changing one must
                # not change the other.
                answer[k] = copy.deepcopy(found[mk]) if mk in given else found[mk]
                given.add(mk)
        return answer

    def set_many(self, data: Mapping[Any, Any], timeout: Any = DEFAULT_TIMEOUT,
                 version: int | None = None) -> list[Any]:
        made = {self.make_and_validate_key(k, version=version): k for k in data}
        expires = self._expiry(timeout)
        items = {mk: data[k] for mk, k in made.items()}
        failures: list[CacheUnavailable] = []
        if expires is not None and expires <= time.time():
            for mk, value in items.items():
                self._store.codec.encode(mk, value)
            failed = self._store.delete_many(items, failures)
        else:
            failed = self._store.set_many(items, expires, failures)
        for exc in failures:
            self._gave_up(exc)
        return [made[k] for k in failed]

    def delete_many(self, keys: Iterable[Any], version: int | None = None) -> None:
        made = [self.make_and_validate_key(k, version=version) for k in keys]
        failures: list[CacheUnavailable] = []
        self._store.delete_many(made, failures)
        for exc in failures:
            self._gave_up(exc)

    def clear(self) -> None:
        try:
            self._store.clear()
        except CacheUnavailable as exc:
            self._gave_up(exc)

    def close(self, **kwargs: Any) -> None:
        """Called by Django after every request: deliberately keeps connections warm."""

    # -- async twins -----------------------------------------------------------------
    # Django's defaults build aincr from aget + aset (neither atomic nor keeping
    # the expiry) and the batch methods from one thread hop per key (losing
    # set_many's failed keys). These run the sync method in one hop, as
    # Django's own aget/aset/aadd/atouch do, so each has the sync one's
    # guarantees. aget_or_set runs the protected get_or_set below on a miss.

    @within_budget
    def get_or_set(self, key: Any, default: Any, timeout: Any = DEFAULT_TIMEOUT,
                   version: int | None = None) -> Any:
        """Django's, but on a missing key only one caller computes ``default``
        (``djcachebench.stampede``; ``STAMPEDE_LEASE`` bounds the wait)."""
        # One wait budget for the whole call (within_budget), as for any other,
        # not a whole budget for its lease add and another for its add of the
        # value; the computation's time is not a wait.
        default = not_a_wait(default)
        if self._stampede_lease is None:
            return super().get_or_set(key, default, timeout, version)
        return protected_get_or_set(self, key, default, timeout, version,
                                    self._stampede_lease, _MISSING_VALUE,
                                    early=self._early_refresh, scope=self.stampede_scope)

    @within_budget
    def incr_version(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        """Django's (a get, a set under the new version, a delete of the old),
        in one wait budget."""
        return super().incr_version(key, delta, version)

    async def aget_or_set(self, key: Any, default: Any, timeout: Any = DEFAULT_TIMEOUT,
                          version: int | None = None) -> Any:
        return await run_abandonable(lambda: self.get_or_set(key, default, timeout, version))

    async def aincr(self, key: Any, delta: int = 1, version: int | None = None) -> Any:
        return await sync_to_async(self.incr, thread_sensitive=True)(key, delta, version)

    async def adecr(self, key: Any, delta: int = 1, version: int | None = None) -> Any:
        return await sync_to_async(self.decr, thread_sensitive=True)(key, delta, version)

    async def ahas_key(self, key: Any, version: int | None = None) -> bool:
        return await sync_to_async(self.has_key, thread_sensitive=True)(key, version)

    async def aget_many(self, keys: Iterable[Any], version: int | None = None) -> dict[Any, Any]:
        return await sync_to_async(self.get_many, thread_sensitive=True)(keys, version)

    async def aset_many(self, data: Mapping[Any, Any], timeout: Any = DEFAULT_TIMEOUT,
                        version: int | None = None) -> list[Any]:
        return await sync_to_async(self.set_many, thread_sensitive=True)(data, timeout, version)

    async def adelete_many(self, keys: Iterable[Any], version: int | None = None) -> None:
        return await sync_to_async(self.delete_many, thread_sensitive=True)(keys, version)

    # -- beyond Django's API -------------------------------------------------------

    def close_connections(self) -> None:
        """Really close this thread's shard connections (others close on next use)."""
        self._store.close()

    def stats(self) -> dict[str, int]:
        """This process's counters: hits, misses, sets, deletes, lock_waits, give_ups, ..."""
        return self._store.stats.as_dict()

    def host_stats(self) -> dict[str, Any]:
        """Every process's counters on this host, summed (``stats.mmap`` in the
        directory; a process's counts reach it within a flush interval:
        ``djcachebench.hoststats``), and read now: ``entries``, ``stored_bytes``
        (the values' bytes) and ``disk_bytes`` (the blocks of every file in
        ``LOCATION``). This process's counts are flushed first.
        ``counters`` is None (and ``problem`` says why) when the file is damaged.

        The counters keep their engine names (``stats()``), plus
        ``lock_give_ups`` (``give_ups``: the names every backend's report shares)."""
        host_stats.flush_all()
        out: dict[str, Any] = {"backend": "sqlite", "counters": None, "processes": 0,
                               "problem": None}
        try:
            totals = read_totals(os.path.join(self.location, STATS_FILE))
        except OSError as exc:  # StatsFileError: damaged, or not this user's
            out["problem"] = str(exc)
        else:
            counters = dict.fromkeys(self.stats(), 0)
            if totals is not None:
                counters.update(totals.counters)
                out["processes"] = totals.processes
            counters["lock_give_ups"] = counters.get("give_ups", 0)
            out["counters"] = counters
        entries, stored = self._store.culler.recount(locked=False)
        out.update(entries=entries, stored_bytes=stored, disk_bytes=_disk_bytes(self.location))
        return out

    def reclaim_files(self, pending_age: float | None = None) -> None:
        """Remove the value files of large values that no row needs (see
        ``store/values.py``). Done as a matter of course by later writes; call it
        with ``pending_age=0`` after a crash, once no process is writing, to
        remove at once the files killed writers left half-written."""
        self._store.reclaim(pending_age)

    def entry_count(self) -> int:
        """Entries across all shards, expired ones not yet removed included."""
        return self._store.culler.recount()[0]

    # -- what an L1 in front of this cache may rely on (TieredCache) ---------------
    # Declared here rather than found by the adapter in private attributes: the
    # coherence table (``coherence_table``), the expiry of what a read returns
    # (``get_with_expiry``, ``get_many_with_expiry``), a read and a write that
    # give back the pickle of the value (``tiered_get``, ``tiered_set``), and
    # these two.

    def tiered_failure_count(self) -> int:
        """Failures this process's engine turned into misses or silent write
        failures (give-ups, I/O errors, corrupt shards). An L1 compares it before
        and after an operation: a miss with no failure in between is a real one."""
        stats = self._store.stats
        return stats.give_ups + stats.errors + stats.corruptions

    def tiered_get(self, key: Any, default: Any = None,
                   version: int | None = None) -> tuple[Any, float | None, bytes | None]:
        """:meth:`get_with_expiry` and, third, the pickle the value was loaded
        from, verified (None: stored raw, or by a serializer other than pickle).
        An L1 keeps a mutable value pickled, so that callers who mutate what
        they got cannot change what it serves next: it keeps these bytes
        instead of pickling the value a second time."""
        key = self.make_and_validate_key(key, version=version)
        try:
            value, expires, pickled = self._store.get_with_expiry(key, True)
        except CacheUnavailable as exc:
            self._store.stats.misses += 1
            self._gave_up(exc)
            return default, None, None
        return (default, None, None) if value is MISSING else (value, expires, pickled)

    def tiered_set(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT,
                   version: int | None = None) -> bytes | None:
        """:meth:`set`, returning the pickle the value was stored as (None:
        stored raw, by another serializer, or not stored), for the same reason
        as :meth:`tiered_get`."""
        return self._set(key, value, timeout, version, True)

    @property
    def tiered_returns_what_was_set(self) -> bool:
        """Does ``get`` give back what ``pickle.loads(pickle.dumps(value))`` would?
        Only with the pickle serializer (msgpack turns tuples into lists)."""
        return bool(self.options["SERIALIZER"] == "pickle")


def _disk_bytes(directory: str) -> int:
    """The disk blocks of every file under ``directory`` (shards, their WAL and
    shared-memory files, value files, the shared mmap files), in bytes."""
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            with contextlib.suppress(OSError):  # removed meanwhile
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total
