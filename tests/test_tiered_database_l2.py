"""TieredCache over Django's DatabaseCache: expiries and writes it drops.

Found by an independent attacker, both over a SQLite database:

* DatabaseCache stores an expiry without its microseconds, so a value set with
  a 2 s timeout at x.9 s dies at the whole second, up to a second before
  ``now + timeout``; the L1 kept it until the exact time and served ~80 reads
  after the L2 had expired it.
* DatabaseCache's ``set`` swallows a ``DatabaseError`` ("allowed to fail
  silently"): a set that the database refused (locked) was taken as written,
  its expiry published on the value board, and the next read kept the *old*
  value under the dropped write's expiry (never), past the old value's own.

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


def _run(tmp_path: Path, use_tz: bool, case: str) -> Any:
    spawn = multiprocessing.get_context("spawn")
    out = spawn.Queue()
    proc = spawn.Process(target=_site, args=(str(tmp_path / "db.sqlite3"), use_tz, case, out))
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
