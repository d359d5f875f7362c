"""Where a TieredCache's shared parts live: the redis of the cross-host
transport (``COHERENCE_URL`` and its default) and the generation table's file
(``GENERATION_PATH``'s default), both derived from the L2's settings, and the
identity of the store the value board binds values to. What a particular
backend's LOCATION names is its adapter's (``tiered/l2/``); this module spells
every location one way and names the files.
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

from djcachebench.coherence.board import LocalStore
from djcachebench.tiered.errors import E_OPTIONS, TieredConfigError
from djcachebench.tiered.l2 import Directory, L2Adapter, adapter_class

__all__ = ["coherence_url", "default_generation_path", "store_identity"]


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
    adapter = adapter_class(backend)
    if adapter.one_host is not None:
        raise TieredConfigError(
            f"{where}['COHERENCE'] = 'cluster' is invalid over {adapter.one_host} "
            f"({backend}): its files live on one host; allowed over it: 'host' or 'none'.",
            E_OPTIONS)
    if url is None:
        try:
            url = adapter.default_coherence_url(location)
        except LookupError:
            raise TieredConfigError(
                f"{where}['COHERENCE_URL'] is required with COHERENCE='cluster' over {backend}: "
                "allowed: a redis:// URL of a redis every host reaches (it defaults to the "
                "L2's own only for Django's RedisCache and django-redis).", E_OPTIONS) from None
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
    name (``L2Adapter.kwarg_db``); ``port``: the port a ``host`` without one means
    (memcached's, ``L2Adapter.default_port``). A ``pathlib.Path`` is its path.
    """
    if isinstance(location, Directory):
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
    adapter = adapter_class(backend)
    if adapter.process_local:
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
    named = repr((backend, _store_name(adapter, location, options, l2, exact=True),
                  spelled,
                  adapter.database_of(l2)))
    return hashlib.blake2b(named.encode("utf-8", "surrogatepass"), digest_size=8,
                           person=b"djcb-store").digest()


_NOT_TIERED: Any = object()


def _store_name(adapter: type[L2Adapter], location: Any, options: Any, l2: Any,
                exact: bool = False) -> Any:
    """The L2's LOCATION as its backend opens it (``L2Adapter.opened_location``),
    spelled one way for every spelling of it (:func:`_same_store`)."""
    opened = adapter.opened_location(location, options, l2)
    return _same_store(opened, adapter.kwarg_db(options), adapter.default_port, exact)


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
    named = repr((backend, _store_name(adapter_class(backend), location, options, l2)))
    digest = hashlib.blake2b(named.encode("utf-8", "surrogatepass"), digest_size=10).hexdigest()
    directory = os.path.join(_table_directory(), f"djcachebench-{os.getuid()}")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    st = os.lstat(directory)
    if st.st_uid != os.getuid() or st.st_mode & 0o022 or not stat.S_ISDIR(st.st_mode):
        raise ImproperlyConfigured(
            f"{directory} (default GENERATION_PATH directory) is not a directory owned by "
            "this user and closed to others; set OPTIONS['GENERATION_PATH'].")
    return os.path.join(directory, f"{digest}.generations.mmap")
