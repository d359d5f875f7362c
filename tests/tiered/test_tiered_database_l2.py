"""TieredCache over Django's DatabaseCache: expiries and writes it drops.

Over a SQLite database:

* DatabaseCache stores an expiry without its microseconds, so a value set with
  a 2 s timeout at x.9 s dies at the whole second, up to a second before
  ``now + timeout``; an L1 that kept it until the exact time would serve it
  after the L2 had expired it.
* DatabaseCache's ``set`` swallows a ``DatabaseError`` ("allowed to fail
  silently"): a set that the database refused (locked), taken as written, would
  publish its expiry on the value board, and the next read keep the *old* value
  under the dropped write's expiry (never), past the old value's own.
* Reading through ``router.db_for_read``, with the router of Django's cache docs
  (reads from a replica), a replica that lags would hand the L1 the value an
  acknowledged write replaced, served until ``L1_TIMEOUT`` after the replica
  caught up: TieredCache reads from the database the router writes to.
* Django's ``get`` deletes the expired rows it finds; so does TieredCache's
  read, or ``touch``, which updates any row it finds, would bring an expired
  value back.
* SQLite's table names ignore ASCII case: ``cache_x`` and ``CACHE_X`` are one
  table, and so one generation table.

Each case runs in a spawned process with its own settings (a database file and
``USE_TZ`` on or off: DatabaseCache's expiries are naive local times without it).
"""

from __future__ import annotations

import multiprocessing
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest


def _site(database: str, use_tz: bool, case: str, out: Any) -> None:
    import django
    from django.conf import settings

    settings.configure(
        SECRET_KEY="djcachebench-tests-not-secret-0123456789",
        USE_TZ=use_tz,
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": database,
                               "OPTIONS": {"timeout": 0.2}}},
        CACHES={"default": {"BACKEND": "djcachebench.backends.tiered.TieredCache",
                            "OPTIONS": {"L2": "db",
                                        "GENERATION_PATH": database + ".generations"}},
                "db": {"BACKEND": "django.core.cache.backends.db.DatabaseCache",
                       "LOCATION": "cache_table"}})
    django.setup()
    from django.core.cache import caches
    from django.core.management import call_command

    call_command("createcachetable", verbosity=0)
    tiered, db = caches["default"], caches["db"]
    if case == "whole-second":
        while not 0.8 < time.time() % 1 < 0.9:  # late in a second: the cut is ~0.85 s
            time.sleep(0.005)
        tiered.set("k", "v", 2)
        assert tiered.get("k") == "v" and tiered.get_many(["k"]) == {"k": "v"}
        served = 0
        end = time.time() + 3
        while time.time() < end:
            gone = db.get("k") is None  # first: every read after it must miss too
            seen = (tiered.get("k"), tiered.get_many(["k"]).get("k"), tiered.has_key("k"))
            if gone and seen != (None, None, False):
                served += 1
            time.sleep(0.01)
        out.put(served)
    elif case == "touch":
        seen = []
        for cache in (db, tiered):
            cache.set("t", "expired secret", 1)
            time.sleep(2.1)
            seen.append((cache.get("t"), cache.touch("t", 300), cache.get("t")))
        cache = tiered
        cache.add("a", "never stored", 0)  # expired at once
        seen.append((cache.get("a"), cache.touch("a", 300), cache.get("a")))
        out.put(seen)
    elif case == "table-case":
        from django.core.cache.backends.db import DatabaseCache

        from djcachebench.backends.tiered import TieredCache

        lower, upper = (TieredCache("", {"OPTIONS": {"L2": {
            "BACKEND": "django.core.cache.backends.db.DatabaseCache", "LOCATION": name}}})
            for name in ("cache_table", "CACHE_TABLE"))
        assert isinstance(upper.l2, DatabaseCache)
        lower.set("k", "old")
        assert lower.get("k") == "old" and lower.get("k") == "old"  # an L1 hit now
        upper.set("k", "new")
        out.put((lower.generation_table.path == upper.generation_table.path,
                 db.get("k"), lower.get("k")))
    else:
        tiered.set("k", "old", 2)
        lock = sqlite3.connect(database, isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")  # another writer holds the database
        tiered.set("k", "new", None)  # DatabaseCache answers as if it had written
        lock.execute("COMMIT")
        lock.close()
        first = (db.get("k"), tiered.get("k"))
        time.sleep(2.5)  # "old" has expired in the database
        out.put((first, db.get("k"), tiered.get("k"), tiered.get_many(["k"])))


class CacheRouter:
    """The router of Django's cache docs: the cache read from a replica."""

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return "cache_replica" if model._meta.app_label == "django_cache" else None

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return "cache_primary" if model._meta.app_label == "django_cache" else None

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        # The replica has the table too (a real one gets it by replication).
        return db.startswith("cache_") if app_label == "django_cache" else None


def _replica_site(work: str, out: Any) -> None:
    import django
    from django.conf import settings

    primary, replica = f"{work}/primary.sqlite3", f"{work}/replica.sqlite3"
    settings.configure(
        SECRET_KEY="djcachebench-tests-not-secret-0123456789", USE_TZ=True,
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3",
                               "NAME": f"{work}/default.sqlite3"},
                   "cache_primary": {"ENGINE": "django.db.backends.sqlite3", "NAME": primary},
                   "cache_replica": {"ENGINE": "django.db.backends.sqlite3", "NAME": replica}},
        DATABASE_ROUTERS=[f"{__name__}.CacheRouter"],
        CACHES={"default": {"BACKEND": "djcachebench.backends.tiered.TieredCache",
                            "OPTIONS": {"L2": "db", "GENERATION_PATH": f"{work}/generations"}},
                "db": {"BACKEND": "django.core.cache.backends.db.DatabaseCache",
                       "LOCATION": "cache_table"}})
    django.setup()
    from django.core.cache import caches
    from django.core.management import call_command

    for alias in ("cache_primary", "cache_replica"):
        call_command("createcachetable", database=alias, verbosity=0)

    def replicate() -> None:
        con = sqlite3.connect(replica, isolation_level=None)
        con.execute("ATTACH DATABASE ? AS p", (primary,))
        con.execute("DELETE FROM cache_table")
        con.execute("INSERT INTO cache_table SELECT * FROM p.cache_table")
        con.close()

    tiered, db = caches["default"], caches["db"]
    tiered.set("flags", "v1")
    replicate()
    assert tiered.get("flags") == "v1"
    tiered.set("flags", "v2")  # acknowledged: in the primary, not yet in the replica
    lagging = db.get("flags")
    tiered.get("flags")
    replicate()
    out.put((lagging, db.get("flags"), tiered.get("flags"), tiered.get_many(["flags"])))


def _run(tmp_path: Path, use_tz: bool, case: str) -> Any:
    spawn = multiprocessing.get_context("spawn")
    out = spawn.Queue()
    if case == "replica":
        proc = spawn.Process(target=_replica_site, args=(str(tmp_path), out))
    else:
        proc = spawn.Process(target=_site,
                             args=(str(tmp_path / "db.sqlite3"), use_tz, case, out))
    proc.start()
    try:
        return out.get(timeout=90)
    finally:
        proc.join(30)
        assert proc.exitcode == 0


@pytest.mark.parametrize("use_tz", [True, False], ids=["USE_TZ", "naive"])
def test_the_l1_never_outlives_the_whole_second_the_database_keeps(
        tmp_path: Path, use_tz: bool) -> None:
    assert _run(tmp_path, use_tz, "whole-second") == 0


@pytest.mark.parametrize("use_tz", [True, False], ids=["USE_TZ", "naive"])
def test_a_write_the_database_dropped_keeps_nothing(tmp_path: Path, use_tz: bool) -> None:
    first, l2_later, later, many = _run(tmp_path, use_tz, "dropped")
    assert first == ("old", "old")  # the write was dropped: the old value, as the L2 says
    assert l2_later is None
    assert later is None and many == {}


def test_the_l1_is_filled_from_the_database_the_router_writes_to(tmp_path: Path) -> None:
    lagging, l2_later, later, many = _run(tmp_path, True, "replica")
    assert lagging == "v1"  # the replica lagged (the bare backend's own answer then)
    assert l2_later == later == "v2" and many == {"flags": "v2"}


@pytest.mark.parametrize("use_tz", [True, False], ids=["USE_TZ", "naive"])
def test_touch_does_not_bring_an_expired_value_back(tmp_path: Path, use_tz: bool) -> None:
    bare, tiered, added = _run(tmp_path, use_tz, "touch")
    assert bare == (None, False, None)  # Django's get deleted the expired row
    assert tiered == bare
    assert added == (None, False, None)


def test_table_names_sqlite_takes_for_one_name_one_table(tmp_path: Path) -> None:
    shared, stored, read = _run(tmp_path, True, "table-case")
    assert shared and stored == read == "new"
