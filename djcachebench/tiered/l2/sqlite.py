"""ShardedSQLiteCache as the L2: everything the values need it declares itself
(``tiered_failure_count``, ``tiered_returns_what_was_set``, ``get_with_expiry``,
``get_many_with_expiry``, ``tiered_get``, ``tiered_set``; and its own generation
table, ``coherence_table``, read by ``state.open_shared``), so this module only
says what the backend cannot: it keeps a timeout exactly, and its files live on
one host.

Recognised by the class path alone: ``tiered/`` stands below the backends and
imports none of them.
"""

from __future__ import annotations

from djcachebench.tiered.l2.base import L2Adapter, WrittenExpiry, exact_expiry
from djcachebench.tiered.l2.generic import GenericAdapter

__all__ = ["CLASSES"]

_ONE_HOST = "a ShardedSQLiteCache L2"


class SQLiteDescendant(GenericAdapter):
    """A subclass of ShardedSQLiteCache: still files on one host."""

    one_host = _ONE_HOST


class SQLiteAdapter(L2Adapter):
    descendant = SQLiteDescendant
    one_host = _ONE_HOST

    def written_expiry(self) -> WrittenExpiry:
        return exact_expiry


CLASSES: dict[str, type[L2Adapter]] = {
    "djcachebench.backends.sqlite.ShardedSQLiteCache": SQLiteAdapter,
}
