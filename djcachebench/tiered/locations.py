"""Where a TieredCache's shared parts live: the redis of the cross-host
transport (``COHERENCE_URL`` and its default) and the generation table's file
(``GENERATION_PATH``'s default), both derived from the L2's settings.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from djcachebench.tiered.errors import E_OPTIONS, TieredConfigError

__all__ = ["REDIS_L2", "coherence_url", "default_generation_path", "is_sharded_sqlite"]

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
    from djcachebench.backends.sqlite import ShardedSQLiteCache

    return isinstance(cls, type) and issubclass(cls, ShardedSQLiteCache)


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


def default_generation_path(backend: str, location: Any) -> str:
    """Where the table for a non-SQLite L2 lives unless ``GENERATION_PATH`` says.

    Derived from the L2's BACKEND and LOCATION only (not its key prefix or
    version, which are part of every final key already), so every tiered alias
    in front of one store, in any process of this user, shares one table.
    The directory is per user and 0o700; it is refused if someone else owns
    it or can write to it (a table another user can write could pin stale
    tokens).
    """
    digest = hashlib.blake2b(repr((backend, location)).encode(), digest_size=10).hexdigest()
    directory = os.path.join(tempfile.gettempdir(), f"djcachebench-{os.getuid()}")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    st = os.lstat(directory)
    if st.st_uid != os.getuid() or st.st_mode & 0o022 or not stat.S_ISDIR(st.st_mode):
        raise ImproperlyConfigured(
            f"{directory} (default GENERATION_PATH directory) is not a directory owned by "
            "this user and closed to others; set OPTIONS['GENERATION_PATH'].")
    return os.path.join(directory, f"{digest}.generations.mmap")
