"""The value board never serves one store's value for another's key.

A board entry is matched by the slot's token, the epoch, the final key and the
store. Two stores share a table, and so a board, whenever their aliases name one
``GENERATION_PATH``, when two redis databases could be taken for one store (the
database in OPTIONS or in the URL's query), and for TieredCaches over
TieredCaches (every such alias has the same default table). Without the store
in the match, a write to store X publishes ``(":1:k", value)``, and a reader of
store Y whose L1 entry that write's stamp ended takes X's value from the board
(each test checks that ``Y.get`` never returns store X's value).
"""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path
from typing import Any

import pytest

from djcachebench.backends.tiered import TieredCache
from djcachebench.bench.servers import RedisServer

FILE = "django.core.cache.backends.filebased.FileBasedCache"
REDIS = "django.core.cache.backends.redis.RedisCache"


def _tiered(l2: Any, **options: Any) -> TieredCache:
    return TieredCache("", {"OPTIONS": {"L2": l2, **options}})


def _other_store_written(x: TieredCache, y: TieredCache) -> None:
    """Y holds k in its L1; X writes k in its own store; Y must answer its own."""
    y.set("k", "value-of-store-Y")
    assert y.get("k") == "value-of-store-Y" and y.get("k") == "value-of-store-Y"
    x.set("k", "value-of-store-X")
    assert x.get("k") == "value-of-store-X"
    assert y.l2.get("k") == "value-of-store-Y"
    assert y.get("k") == "value-of-store-Y"
    assert y.get_many(["k"]) == {"k": "value-of-store-Y"}
    assert y.has_key("k")


def _board_shared(x: TieredCache, y: TieredCache) -> None:
    """Y holds k in its L1; X writes k; Y takes X's value from the board."""
    y.set("k", "old")
    assert y.get("k") == "old" and y.get("k") == "old"
    before = y.stats()["board_hits"]
    x.set("k", "new")
    assert y.get("k") == "new"
    assert y.stats()["board_hits"] == before + 1


def test_two_stores_on_one_generation_path(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.generations.mmap")
    x = _tiered({"BACKEND": FILE, "LOCATION": str(tmp_path / "x")}, GENERATION_PATH=path)
    y = _tiered({"BACKEND": FILE, "LOCATION": str(tmp_path / "y")}, GENERATION_PATH=path)
    assert x.generation_table.path == y.generation_table.path
    _other_store_written(x, y)


@pytest.mark.parametrize("how", ["options", "query"])
def test_two_redis_databases(redis_server: RedisServer, how: str) -> None:
    url = redis_server.location.rsplit("/", 1)[0]  # no database in the path
    if how == "options":
        x = _tiered({"BACKEND": REDIS, "LOCATION": url, "OPTIONS": {"db": 4}})
        y = _tiered({"BACKEND": REDIS, "LOCATION": url, "OPTIONS": {"db": 5}})
    else:
        x = _tiered({"BACKEND": REDIS, "LOCATION": url + "/0?db=4"})
        y = _tiered({"BACKEND": REDIS, "LOCATION": url + "/0?db=5"})
    try:
        _other_store_written(x, y)
    finally:
        x.clear()
        y.clear()


@pytest.mark.parametrize("nested", [False, True])
def test_two_locmem_stores_on_one_generation_path(tmp_path: Path, nested: bool) -> None:
    """Each LocMemCache is a store of its own, named by its LOCATION: as one store
    of the process, ``y.get`` would return X's value."""
    path = str(tmp_path / "shared.generations.mmap")

    def over(location: str) -> TieredCache:
        locmem = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                  "LOCATION": f"{tmp_path.name}-{location}"}
        if nested:
            locmem = {"BACKEND": "djcachebench.backends.tiered.TieredCache",
                      "OPTIONS": {"L2": locmem, "L1_MAX_ENTRIES": 0,
                                  "GENERATION_PATH": str(tmp_path / f"{location}.mmap")}}
        return _tiered(locmem, GENERATION_PATH=path)

    _other_store_written(over("x"), over("y"))


def test_one_locmem_store_still_shares_its_board(tmp_path: Path) -> None:
    """Two aliases over one LocMemCache (one LOCATION) of one process still take
    each other's values from the board."""
    locmem = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
              "LOCATION": f"{tmp_path.name}-one"}
    path = str(tmp_path / "shared.generations.mmap")
    x = _tiered(locmem, GENERATION_PATH=path, L1_MAX_BYTES=10**6)
    y = _tiered(locmem, GENERATION_PATH=path, L1_MAX_BYTES=2 * 10**6)
    _board_shared(x, y)


def test_tiered_caches_over_tiered_caches(tmp_path: Path) -> None:
    def nested(name: str) -> TieredCache:
        return _tiered({"BACKEND": "djcachebench.backends.tiered.TieredCache",
                        "OPTIONS": {"L2": {"BACKEND": FILE, "LOCATION": str(tmp_path / name)},
                                    "L1_MAX_ENTRIES": 0,
                                    "GENERATION_PATH": str(tmp_path / f"{name}.mmap")}})

    x, y = nested("x"), nested("y")
    _other_store_written(x, y)


def test_the_same_store_still_shares_its_board(tmp_path: Path) -> None:
    """The binding costs nothing where the store is one: aliases over it (with
    its LOCATION spelled two ways) still take each other's values from the board."""
    x = _tiered({"BACKEND": FILE, "LOCATION": str(tmp_path / "s")})
    y = _tiered({"BACKEND": FILE, "LOCATION": str(tmp_path / "s") + "/"})
    _board_shared(x, y)


def _child_writes(cache: TieredCache, done: Any) -> None:
    cache.set("k", "child's")  # its own LocMemCache; the shared table is stamped
    done.set()


def test_a_store_of_one_process_is_its_own_on_the_board() -> None:
    """LocMemCache is a store per process (a forked child's diverges from its
    parent's): what a child wrote, its parent's LocMemCache does not hold, so
    the parent must not take it from the board they share."""
    cache = _tiered({"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                     "LOCATION": "board-stores"})
    cache.set("k", "parent's")
    assert cache.get("k") == "parent's" and cache.get("k") == "parent's"
    fork = multiprocessing.get_context("fork")
    done = fork.Event()
    child = fork.Process(target=_child_writes, args=(cache, done))
    child.start()
    child.join(30)
    assert child.exitcode == 0 and done.is_set()
    assert cache.get("k") == "parent's"
    assert cache.stats()["board_hits"] == 0


def _database_site(database: str, action: str, key: str, timeout: float | None,
                   out: Any) -> None:
    """One site: TieredCache over DatabaseCache ``cache_table`` in its own database
    (spawned, so that its settings are its own)."""
    import django
    from django.conf import settings

    settings.configure(
        SECRET_KEY="djcachebench-tests-not-secret-0123456789",
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": database}},
        CACHES={"default": {"BACKEND": "djcachebench.backends.tiered.TieredCache",
                            "OPTIONS": {"L2": "db"}},
                "db": {"BACKEND": "django.core.cache.backends.db.DatabaseCache",
                       "LOCATION": "cache_table"}})
    django.setup()
    from django.core.cache import cache
    from django.core.management import call_command

    call_command("createcachetable", verbosity=0)
    if action == "set":
        expires = None if timeout is None else time.time() + timeout  # no sooner than this
        cache.set(key, f"from {database}", timeout=timeout)
        out.put(expires)
    else:
        first = cache.get(key)
        time.sleep(max(0.0, (timeout or 0) - time.time()))  # until this wall time
        out.put((first, cache.get(key)))


def test_two_sites_with_a_database_cache_each(tmp_path: Path) -> None:
    """DatabaseCache's LOCATION is a table name, so two sites on one host, each
    with ``cache_table`` in its own database, must be told apart by database too:
    as one store to the board, site A's write would publish its expiry
    (DatabaseCache reports none on read), and site B keep its own value past its
    own expiry."""
    spawn = multiprocessing.get_context("spawn")
    out = spawn.Queue()
    site_a, site_b = str(tmp_path / "a.sqlite3"), str(tmp_path / "b.sqlite3")

    def run(database: str, action: str, timeout: float | None) -> Any:
        proc = spawn.Process(target=_database_site,
                             args=(database, action, "k", timeout, out))
        proc.start()
        got = out.get(timeout=60)
        proc.join(30)
        assert proc.exitcode == 0
        return got

    life = 8.0  # long enough for two processes to start under load
    b_expires = run(site_b, "set", life)
    run(site_a, "set", None)  # no expiry, published for "k" on the shared board
    first, later = run(site_b, "read", b_expires + 0.5)
    assert first == f"from {site_b}"
    assert later is None  # expired in B's own database


def test_database_cache_identity_follows_its_database(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.core.cache.backends.db import DatabaseCache
    from django.db import connections

    from djcachebench.tiered.locations import store_identity

    backend = "django.core.cache.backends.db.DatabaseCache"
    l2 = DatabaseCache("cache_table", {})
    first = store_identity(backend, "cache_table", {}, l2)
    assert store_identity(backend, "cache_table", {}, DatabaseCache("cache_table", {})) == first
    monkeypatch.setitem(connections.settings["default"], "NAME", "/elsewhere/b.sqlite3")
    assert store_identity(backend, "cache_table", {}, l2) != first
