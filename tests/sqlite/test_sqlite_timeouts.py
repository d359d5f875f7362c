"""A per-call timeout that is not a finite number is refused before anything is written.

Pinned (backends/sqlite.py ``_expiry``): Django's ``get_backend_timeout``
computes ``time.time() + timeout``. With ``nan`` that expiry was bound as NULL
(SQLite stores a NaN as NULL: the value never expired) and publishing it to
the coherence table raised *after* the commit; ``inf``/``-inf`` are not a
number of seconds either (``None`` says "never"). ``set``, ``add``,
``set_many`` and ``touch`` raise ``ValueError`` for them, and ``TypeError``
for what is not a number at all, as Django does, and the cache is unchanged:
an existing value keeps its value and its expiry, a new key is not stored.
Every other timeout keeps Django's meaning.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache

from .helpers import raw_shard, shard_files, shard_path

NON_FINITE = [math.nan, math.inf, -math.inf]


def rows(cache: ShardedSQLiteCache) -> dict[str, Any]:
    """Every row on disk: key -> (value column, expires column)."""
    found: dict[str, Any] = {}
    for path in shard_files(cache.location):
        with raw_shard(path) as conn:
            found.update((k, (v, e)) for k, v, e in
                         conn.execute("SELECT key, value, expires FROM cache"))
    return found


def calls(timeout: Any) -> dict[str, Callable[[ShardedSQLiteCache], Any]]:
    return {
        "set-existing": lambda c: c.set("existing", "new", timeout=timeout),
        "set-new": lambda c: c.set("new", "v", timeout=timeout),
        "add": lambda c: c.add("new", "v", timeout=timeout),
        "set_many": lambda c: c.set_many({"existing": "new", "new": "v"}, timeout=timeout),
        "touch": lambda c: c.touch("existing", timeout=timeout),
        "get_or_set": lambda c: c.get_or_set("new", "v", timeout=timeout),
    }


@pytest.mark.parametrize("timeout", NON_FINITE, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("call", list(calls(None)))
def test_non_finite_timeout_raises_value_error_and_writes_nothing(
    cache: ShardedSQLiteCache, timeout: float, call: str
) -> None:
    cache.coherence_table.watch()  # stamps on: what made nan raise after its commit
    cache.set("existing", "old", timeout=100)
    before = rows(cache)
    with pytest.raises(ValueError, match="timeout"):
        calls(timeout)[call](cache)
    assert rows(cache) == before
    assert cache.get("existing") == "old"
    assert cache.get("new") is None


@pytest.mark.parametrize("timeout", ["5", b"5", object(), 1j], ids=["str", "bytes", "object",
                                                                  "complex"])
def test_a_timeout_that_is_not_a_number_raises_type_error(
    cache: ShardedSQLiteCache, timeout: Any
) -> None:
    cache.set("existing", "old")
    before = rows(cache)
    for call in calls(timeout).values():
        with pytest.raises(TypeError):
            call(cache)
    assert rows(cache) == before


@pytest.mark.parametrize("timeout", [10, 2.5, Fraction(7, 2), True])
def test_real_numbers_keep_djangos_meaning(cache: ShardedSQLiteCache, timeout: Any) -> None:
    """Anything ``time.time() + timeout`` accepts as a finite number, as Django
    (``True`` is 1 second there too)."""
    cache.set("k", "v", timeout=timeout)
    assert cache.get("k") == "v"
    with raw_shard(shard_path(cache, "k")) as conn:
        (expires,) = conn.execute("SELECT expires FROM cache").fetchone()
    assert expires is not None and math.isfinite(expires)


def test_none_and_zero_keep_djangos_meaning(cache: ShardedSQLiteCache) -> None:
    cache.set("forever", "v", timeout=None)
    cache.set("never-stored", "v", timeout=0)
    assert cache.get("forever") == "v"
    assert cache.get("never-stored") is None
    assert set(rows(cache)) == {cache.make_key("forever")}
