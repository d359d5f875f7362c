"""Django's DatabaseCache as the L2: a table in one of the site's databases.

Its reads raise on failure, but its ``set``, ``add`` and ``touch`` swallow a
``DatabaseError`` ("allowed to fail silently") and answer as if nothing were
wrong: a write it dropped would be kept in the L1 and published on the board,
so it gets no failure probe (writers keep nothing, misses are not kept). Its
values are kept from reads, with the expiry of their row. It stores an expiry
without its microseconds. Its LOCATION is only a table name: the store is also
the databases its router sends reads and writes to (for its subclasses too).
"""

from __future__ import annotations

import base64
import logging
import math
import os
import pickle
from typing import Any

from djcachebench.tiered.l2.base import (
    ExpiryReader,
    L2Adapter,
    ManyExpiryReader,
    WrittenExpiry,
)
from djcachebench.tiered.l2.generic import GenericAdapter

log = logging.getLogger(__name__)

__all__ = ["CLASSES"]

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


class DatabaseDescendant(GenericAdapter):
    """A subclass of DatabaseCache: nothing known of its values; its table and
    databases name its store as its base's do."""

    @classmethod
    def opened_location(cls, location: Any, options: Any, l2: Any) -> Any:
        """On SQLite, whose table names ignore ASCII case, the name in lower case."""
        if isinstance(location, str) and _on_sqlite(l2):
            return location.translate(_ASCII_LOWER)
        return location

    @classmethod
    def database_of(cls, l2: Any) -> Any:
        """The databases its router sends reads and writes to, by their settings
        (two sites with a ``cache_table`` each in their own database are two
        stores)."""
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


def _on_sqlite(l2: Any) -> bool:
    """Is this Django's DatabaseCache writing to a SQLite database?"""
    from django.core.cache.backends.db import DatabaseCache

    if not isinstance(l2, DatabaseCache):
        return False
    from django.db import connections, router

    try:
        return connections[router.db_for_write(l2.cache_model_class)].vendor == "sqlite"
    except Exception:  # an alias the settings do not have: Django will say so itself
        return False


class DatabaseAdapter(DatabaseDescendant):
    descendant = DatabaseDescendant

    def known_expiry_reader(self) -> ExpiryReader | None:
        many = _many_expiry_reader(self.l2)

        def read_one(key: Any, default: Any, version: Any) -> tuple[Any, float | None]:
            return many([key], version).get(key, (default, None))
        return read_one

    def known_many_expiry_reader(self, single: ExpiryReader) -> ManyExpiryReader | None:
        return _many_expiry_reader(self.l2)

    def written_expiry(self) -> WrittenExpiry:
        return _whole_second_expiry


def _whole_second_expiry(timeout: float, now: float) -> float:
    """``now + timeout`` without its fraction of a second (an infinite one stays):
    DatabaseCache drops the microseconds of the expiry it stores, so it drops a
    value up to a second sooner than ``now + timeout``."""
    end = now + timeout
    return end if not math.isfinite(end) else float(math.floor(end))


def _many_expiry_reader(l2: Any) -> ManyExpiryReader:
    """DatabaseCache's own ``get_many`` (one SELECT of key, value and expiry),
    keeping each row's expiry: the whole second the database holds, which is
    what its reads compare with (Django drops the microseconds on write).

    Reads DatabaseCache's private ``_table`` (the quoted table name its own SQL
    uses): it has no public read that returns a row's expiry.

    Read from the database the router *writes* to, as the redis readers read
    from the primary: a replica that lags would hand the L1 the value a write
    acknowledged before the read had replaced, kept until ``L1_TIMEOUT`` (the
    router of Django's cache docs sends reads to a replica).
    Expired rows found are deleted, as Django's ``get_many`` deletes them: left
    in place, a later ``touch`` (which updates whatever row it finds) would
    bring an expired value back. Unlike Django's, the delete
    keeps to rows still expired, so that a value written since is not lost.
    """
    from django.db import connections, models, router
    from django.utils.timezone import now as tz_now

    def read_many(keys: list[Any], version: Any = None) -> dict[Any, tuple[Any, float | None]]:
        if not keys:
            return {}
        key_map = {l2.make_and_validate_key(key, version=version): key for key in keys}
        connection = connections[router.db_for_write(l2.cache_model_class)]
        quote = connection.ops.quote_name
        sql = "SELECT %s, %s, %s FROM %s WHERE %s IN (%s)" % (  # noqa: UP031 (Django's own SQL)
            quote("cache_key"), quote("value"), quote("expires"), quote(l2._table),
            quote("cache_key"), ", ".join(["%s"] * len(key_map)))
        with connection.cursor() as cursor:
            cursor.execute(sql, list(key_map))
            rows = cursor.fetchall()
        expression = models.Expression(output_field=models.DateTimeField())
        converters = (connection.ops.get_db_converters(expression)
                      + expression.get_db_converters(connection))
        now = tz_now()
        out = {}
        expired = []
        for final, value, expires in rows:
            for converter in converters:
                expires = converter(expires, expression, connection)
            if expires < now:
                expired.append(final)
                continue
            value = pickle.loads(base64.b64decode(connection.ops.process_clob(value).encode()))
            out[key_map[final]] = (value, _deadline(expires))
        if expired:
            _delete_expired(connection, l2._table, expired, now)
        return out

    return read_many


def _delete_expired(connection: Any, table: str, finals: list[str], now: Any) -> None:
    """Delete the rows of ``finals`` that are still expired at ``now`` (in
    autocommit, as Django's own deletes). A delete that fails leaves the rows
    for the backend's cull: the read it follows has its answer already."""
    from django.db import DatabaseError

    quote = connection.ops.quote_name
    sql = "DELETE FROM %s WHERE %s IN (%s) AND %s < %%s" % (  # noqa: UP031 (as Django's _cull)
        quote(table), quote("cache_key"), ", ".join(["%s"] * len(finals)), quote("expires"))
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql, [*finals, connection.ops.adapt_datetimefield_value(now)])
    except DatabaseError:
        log.warning("could not delete %d expired row(s) of %s", len(finals), table)


def _deadline(expires: Any) -> float | None:
    """The wall-clock time of a DatabaseCache expiry (a ``datetime``, naive in
    local time without ``USE_TZ``); ``datetime.max`` (no timeout) is never."""
    if expires.year == 9999:
        return math.inf
    try:
        return float(expires.timestamp())
    except (OverflowError, OSError, ValueError):
        return None  # unknown: the value is not kept


CLASSES: dict[str, type[L2Adapter]] = {
    "django.core.cache.backends.db.DatabaseCache": DatabaseAdapter,
}
