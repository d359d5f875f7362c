"""Where a TieredCache's shared parts live: the redis of the cross-host
transport (``COHERENCE_URL`` and its default) and the generation table's file
(``GENERATION_PATH``'s default), both derived from the L2's settings.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import tempfile
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from djcachebench.coherence.board import LocalStore
from djcachebench.tiered.errors import E_OPTIONS, TieredConfigError

__all__ = ["REDIS_L2", "coherence_url", "default_generation_path", "is_sharded_sqlite",
           "store_identity"]

# The L2 backends whose LOCATION is a redis the cross-host transport can share.
REDIS_L2 = ("django.core.cache.backends.redis.RedisCache", "django_redis.cache.RedisCache")
_SQLITE_L2 = "djcachebench.backends.sqlite.ShardedSQLiteCache"


def is_sharded_sqlite(backend: Any) -> bool:
    if backend == _SQLITE_L2:
        return True
    try:
        cls = import_string(backend)
    except ImportError:
        return False
    # By its bases' names: tiered/ stands below the backends and imports none.
    return isinstance(cls, type) and any(
        f"{base.__module__}.{base.__qualname__}" == _SQLITE_L2 for base in cls.__mro__)


def _first_location(location: Any) -> str | None:
    """The primary (write) server of a redis LOCATION: a string, a comma-separated
    string or a list (Django's RedisCache and django-redis write to the first)."""
    if isinstance(location, str):
        first = location.split(",")[0].strip()
    elif isinstance(location, (list, tuple)) and location and isinstance(location[0], str):
        first = location[0].strip()
    else:
        return None
    return first or None


def coherence_url(where: str, coherence: str, url: str | None, backend: str,
                   location: Any) -> str | None:
    """The redis URL of the cross-host transport, validated; None unless 'cluster'."""
    from djcachebench.coherence.cluster.resp import parse_url

    if coherence != "cluster":
        if url is not None:
            raise TieredConfigError(
                f"{where}['COHERENCE_URL'] = {url!r} is invalid with COHERENCE={coherence!r}; "
                "allowed: None, or set COHERENCE='cluster'.", E_OPTIONS)
        return None
    if is_sharded_sqlite(backend):
        raise TieredConfigError(
            f"{where}['COHERENCE'] = 'cluster' is invalid over a ShardedSQLiteCache L2 "
            f"({backend}): its files live on one host; allowed over it: 'host' or 'none'.",
            E_OPTIONS)
    if url is None:
        if backend not in REDIS_L2:
            raise TieredConfigError(
                f"{where}['COHERENCE_URL'] is required with COHERENCE='cluster' over {backend}: "
                "allowed: a redis:// URL of a redis every host reaches (it defaults to the "
                "L2's own only for Django's RedisCache and django-redis).", E_OPTIONS)
        url = _first_location(location)
        if url is None:
            raise TieredConfigError(
                f"{where}['COHERENCE_URL'] cannot default to the L2's LOCATION {location!r}; "
                "allowed: a redis:// URL.", E_OPTIONS)
        source = f" (the default, from the L2's LOCATION {location!r})"
    else:
        source = ""
    try:
        parse_url(url)
    except ValueError as exc:
        raise TieredConfigError(
            f"{where}['COHERENCE_URL'] = {url!r}{source} is invalid: {exc}; allowed: "
            "redis://[[user]:password@]host[:port][/db] (set COHERENCE_URL explicitly when "
            "the L2 uses another scheme).", E_OPTIONS) from exc
    return url


def _directory_kind(backend: str) -> str | None:
    """``"filebased"`` (Django's file-based cache), ``"diskcache"``, or None when
    the L2's LOCATION is not a directory."""
    from django.core.cache.backends.filebased import FileBasedCache

    try:
        cls = import_string(backend)
    except ImportError:
        return None
    if not isinstance(cls, type):
        return None
    if issubclass(cls, FileBasedCache):
        return "filebased"
    return "diskcache" if cls.__module__.startswith("diskcache") else None


def _opened_location(backend: str, location: Any, options: Any, l2: Any = None) -> Any:
    """``location`` as the backend itself reads it: what it opens, not what the
    settings spell: two spellings taken for one store, or one store for two,
    each give a wrong value or an unseen write.

    A directory as the backend resolves it, then its real path: Django's
    file-based cache takes ``os.path.abspath`` of it as written (a ``~`` is a
    directory named ``~``, ``..`` is removed before links are followed, spaces
    count), diskcache expands ``~`` and ``$VARS``. For Django's RedisCache and
    django-redis's default client, the first server of a list: the one they
    write to (the others are replicas; TieredCache reads from it too). For
    Django's DatabaseCache on SQLite, whose table names ignore ASCII case, the
    name in lower case.
    """
    kind = _directory_kind(backend)
    if kind is not None and isinstance(location, (str, os.PathLike)):
        path = os.fspath(location)
        if kind == "filebased":
            path = os.path.abspath(path)
        else:
            path = os.path.expandvars(os.path.expanduser(path))
        return _Directory(os.path.realpath(path))
    if backend in REDIS_L2 and not _sharded_client(backend, options):
        if isinstance(location, str):
            return re.split("[;,]", location)[0]
        if isinstance(location, (list, tuple)) and location:
            return location[0]
        return location
    if isinstance(location, str) and _on_sqlite(backend, l2):
        return location.translate(_ASCII_LOWER)
    return location


class _Directory(str):
    """A directory resolved as its backend opens it: taken as it is by
    :func:`_same_store` (a comma or a space in it is part of the name)."""

    __slots__ = ()


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _sharded_client(backend: str, options: Any) -> bool:
    """Does this redis L2 spread keys over its servers (django-redis's
    ``ShardClient``, or a client class not known to write to the first server
    only)? Then every server of the list is part of the store."""
    if backend != "django_redis.cache.RedisCache" or not isinstance(options, dict):
        return False
    client = options.get("CLIENT_CLASS")
    if client is None:
        return False
    try:
        from django_redis.client import DefaultClient, ShardClient

        cls = import_string(client) if isinstance(client, str) else client
    except ImportError:
        return True
    if not isinstance(cls, type):
        return True
    return issubclass(cls, ShardClient) or not issubclass(cls, DefaultClient)


def _on_sqlite(backend: str, l2: Any) -> bool:
    """Is this Django's DatabaseCache writing to a SQLite database?"""
    from django.core.cache.backends.db import DatabaseCache

    if not isinstance(l2, DatabaseCache):
        return False
    from django.db import connections, router

    try:
        return connections[router.db_for_write(l2.cache_model_class)].vendor == "sqlite"
    except Exception:  # an alias the settings do not have: Django will say so itself
        return False


def _kwarg_db(backend: str, options: Any) -> Any:
    """The redis database an L2's OPTIONS name, which its client passes as the
    ``db`` keyword (a URL's own database wins over it): Django's RedisCache
    passes OPTIONS to the pool, django-redis its ``CONNECTION_POOL_KWARGS``."""
    if not isinstance(options, dict):
        return None
    if backend == "django_redis.cache.RedisCache":
        options = options.get("CONNECTION_POOL_KWARGS")
        if not isinstance(options, dict):
            return None
    return options.get("db")


def _redis_db(url: Any, kwarg_db: Any) -> str:
    """The database a redis URL selects, as redis-py reads it: ``?db=`` first,
    then the path, then the client's ``db`` keyword, then 0."""
    for name, values in parse_qs(url.query).items():
        if name == "db" and values and values[0]:
            return _db_number(values[0])
    with contextlib.suppress(ValueError):
        return str(int(unquote(url.path).replace("/", "")))
    if kwarg_db is not None:
        return _db_number(kwarg_db)
    return "0"


def _db_number(value: Any) -> str:
    """A database as redis-py reads it (``int()``), else as spelled."""
    try:
        return str(int(value))
    except (TypeError, ValueError):
        return repr(value)


def _same_store(location: Any, kwarg_db: Any = None, port: int | None = None,
                exact: bool = False) -> Any:
    """``location`` spelled one way for every spelling of the same store.

    Why: the default table is named after the L2's LOCATION, and two processes
    that named one store two ways (``/srv/cache`` and ``/srv/cache/``, a
    relative path, a symlink; a list or a comma-separated string of servers;
    ``redis://H``, ``redis://h:6379/0`` and ``redis://h/?db=0``; a database
    in OPTIONS or in the URL) would use two tables: a write acknowledged in one
    would leave the other's L1 serving the value it replaced. A spelling this
    does not recognise gives a table of its own:
    set ``GENERATION_PATH`` then. ``kwarg_db``: the database the L2's OPTIONS
    name (:func:`_kwarg_db`); ``port``: the port a ``host`` without one means
    (memcached's, :func:`_default_port`). A ``pathlib.Path`` is its path.
    """
    if isinstance(location, _Directory):
        return str(location)
    if isinstance(location, (list, tuple)):
        servers = tuple(_same_store(part, kwarg_db, port, exact) for part in location)
        # One server listed is that server: the spelling of a plain string.
        return servers[0] if len(servers) == 1 else servers
    if isinstance(location, os.PathLike):
        location = os.fspath(location)
    if not isinstance(location, str):
        return location
    parts = [p.strip() for p in re.split("[;,]", location) if p.strip()]
    if len(parts) > 1:  # Django's redis and memcached split a LOCATION so
        return _same_store(parts, kwarg_db, port, exact)
    text = parts[0] if parts else ""
    if "://" in text:
        url = urlsplit(text)
        scheme = url.scheme.lower()
        if scheme in ("redis", "rediss") and url.hostname:
            db = _redis_db(url, kwarg_db)
            return f"{scheme}://{url.hostname.lower()}:{url.port or 6379}/{db}"
        return text
    if text.startswith("unix:"):
        return "unix:" + os.path.realpath(text[5:])
    if os.sep in text or text.startswith(("~", ".")):
        return text if exact else os.path.realpath(os.path.expanduser(text))
    if port is not None:
        # host, host:port, [v6] and [v6]:port; a bare IPv6 address is left as spelled.
        if text.startswith("[") and text.endswith("]"):
            return f"{text.lower()}:{port}"
        if text.count(":") == 1:
            host, _, given = text.partition(":")
            with contextlib.suppress(ValueError):
                return f"{host.lower()}:{int(given)}"
        if ":" not in text:
            return f"{text.lower()}:{port}"
    return text


def _default_port(backend: str) -> int | None:
    """The port a memcached server spelled without one means (every memcached
    client Django wraps uses 11211); None for other backends."""
    from django.core.cache.backends.memcached import BaseMemcachedCache

    try:
        cls = import_string(backend)
    except ImportError:
        return None
    if isinstance(cls, type) and issubclass(cls, BaseMemcachedCache):
        return 11211
    return None


def store_identity(backend: str, location: Any, params: dict[str, Any],
                   l2: Any) -> bytes | None:
    """8 bytes naming the store an L2 reads and writes, or a
    :class:`~djcachebench.coherence.board.LocalStore` for a store of this
    process alone (LocMemCache, DummyCache: the board names it per process and
    LOCATION, ``ValueBoard``).

    Why: the value board of a table holds values, and two stores can share a
    table (an explicit ``GENERATION_PATH``, two redis databases, TieredCaches
    over TieredCaches): a value published for one must never be served for the
    other. The board binds this identity to
    every value. It is finer than the table's default path: the L2's whole
    OPTIONS count, so two processes that configured one store differently
    share invalidations but not values, which costs refills, never a wrong
    value. Over a TieredCache, the identity of the store beneath it.
    """
    from django.core.cache.backends.dummy import DummyCache
    from django.core.cache.backends.locmem import LocMemCache

    if isinstance(l2, (LocMemCache, DummyCache)):
        # Django keeps one LocMemCache store per process and LOCATION.
        return LocalStore(str(location).encode("utf-8", "surrogatepass"))
    inner = getattr(l2, "store_identity", _NOT_TIERED)
    if inner is not _NOT_TIERED:
        return inner  # type: ignore[no-any-return]
    options = params.get("OPTIONS", {})
    try:
        spelled = repr(sorted(options.items())) if isinstance(options, dict) else repr(options)
    except TypeError:  # keys that do not sort: a store of its own
        return os.urandom(8)
    opened = _opened_location(backend, location, options, l2)
    named = repr((backend, _same_store(opened, _kwarg_db(backend, options),
                                       _default_port(backend), exact=True),
                  spelled,
                  _database_of(l2)))
    return hashlib.blake2b(named.encode("utf-8", "surrogatepass"), digest_size=8,
                           person=b"djcb-store").digest()


_NOT_TIERED: Any = object()


def _database_of(l2: Any) -> Any:
    """For Django's DatabaseCache, whose LOCATION is only a table name: the
    databases its router sends reads and writes to, by their settings (two sites
    with a ``cache_table`` each in their own database are two stores). None for
    other backends."""
    from django.core.cache.backends.db import DatabaseCache

    if not isinstance(l2, DatabaseCache):
        return None
    from django.db import connections, router

    named = []
    for alias in {router.db_for_read(l2.cache_model_class),
                  router.db_for_write(l2.cache_model_class)}:
        conf = connections.settings.get(alias, {})
        name = conf.get("NAME")
        if isinstance(name, (str, os.PathLike)) and "sqlite" in str(conf.get("ENGINE", "")):
            name = os.path.realpath(os.fspath(name))
        named.append((str(conf.get("ENGINE")), repr(name), str(conf.get("HOST")),
                      str(conf.get("PORT"))))
    return sorted(named)


def _table_directory() -> str:
    """``/tmp`` where there is one, whatever ``TMPDIR`` says: processes started
    with different environments must still meet on one table."""
    return "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()


def default_generation_path(backend: str, location: Any, options: Any = None,
                            l2: Any = None) -> str:
    """Where the table for a non-SQLite L2 lives unless ``GENERATION_PATH`` says.

    Derived from the L2's BACKEND and LOCATION only (not its key prefix or
    version, which are part of every final key already), so every tiered alias
    in front of one store, in any process of this user, shares one table,
    however the store's LOCATION was spelled (:func:`_same_store`).
    The directory is per user and 0o700; it is refused if someone else owns
    it or can write to it (a table another user can write could pin stale
    tokens).
    """
    opened = _opened_location(backend, location, options, l2)
    named = repr((backend, _same_store(opened, _kwarg_db(backend, options),
                                       _default_port(backend))))
    digest = hashlib.blake2b(named.encode("utf-8", "surrogatepass"), digest_size=10).hexdigest()
    directory = os.path.join(_table_directory(), f"djcachebench-{os.getuid()}")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    st = os.lstat(directory)
    if st.st_uid != os.getuid() or st.st_mode & 0o022 or not stat.S_ISDIR(st.st_mode):
        raise ImproperlyConfigured(
            f"{directory} (default GENERATION_PATH directory) is not a directory owned by "
            "this user and closed to others; set OPTIONS['GENERATION_PATH'].")
    return os.path.join(directory, f"{digest}.generations.mmap")
