"""The default generation table of an L2: one per store, however its LOCATION is spelled.

Two processes over one FileBasedCache, one with ``LOCATION`` ending in ``/`` (or
started with another ``TMPDIR``), must use one table: with two, a write
acknowledged in one leaves the other's L1 serving the value it replaced.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from djcachebench.backends.tiered import TieredCache
from djcachebench.tiered.locations import default_generation_path

FILE = "django.core.cache.backends.filebased.FileBasedCache"
REDIS = "django.core.cache.backends.redis.RedisCache"


def _over_files(location: str) -> TieredCache:
    return TieredCache("", {"OPTIONS": {"L2": {"BACKEND": FILE, "LOCATION": location}}})


def test_a_write_through_one_spelling_of_a_store_ends_the_l1_entry_of_another(
        tmp_path: Path) -> None:
    plain = _over_files(str(tmp_path / "fb"))
    slashed = _over_files(str(tmp_path / "fb") + "/")
    plain.set("k", "v1")
    assert plain.get("k") == "v1" and plain.get("k") == "v1"  # now an L1 hit
    slashed.set("k", "v2")
    assert plain.get("k") == "v2"


@pytest.mark.parametrize("spelled", ["{d}/", "{d}//", "{d}/./", "{link}", "{rel}"])
def test_every_spelling_of_a_directory_names_one_table(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spelled: str) -> None:
    store = tmp_path / "fb"
    store.mkdir()
    (tmp_path / "link").symlink_to(store)
    monkeypatch.chdir(tmp_path)
    other = spelled.format(d=store, link=tmp_path / "link", rel="fb")
    assert default_generation_path(FILE, other) == default_generation_path(FILE, str(store))


def test_the_table_does_not_depend_on_tmpdir(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    first = default_generation_path(FILE, str(tmp_path / "fb"))
    elsewhere = tmp_path / "tmp"
    elsewhere.mkdir(mode=0o700)
    monkeypatch.setenv("TMPDIR", str(elsewhere))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    assert tempfile.gettempdir() == str(elsewhere)
    assert default_generation_path(FILE, str(tmp_path / "fb")) == first


@pytest.mark.parametrize("spelled", [
    "redis://127.0.0.1:6379/0", "redis://127.0.0.1", "redis://127.0.0.1:6379/",
    "REDIS://127.0.0.1:6379", " redis://127.0.0.1:6379/0 ",
])
def test_every_spelling_of_a_redis_names_one_table(spelled: str) -> None:
    assert (default_generation_path(REDIS, spelled)
            == default_generation_path(REDIS, "redis://127.0.0.1:6379/0"))


def test_server_lists_name_one_table_and_other_stores_others() -> None:
    pair = "redis://10.0.0.1:6379/0,redis://10.0.0.2:6379/0"
    assert (default_generation_path(REDIS, pair)
            == default_generation_path(REDIS, ["redis://10.0.0.1:6379/0",
                                                "redis://10.0.0.2:6379/0"])
            == default_generation_path(REDIS, ("redis://10.0.0.1", "redis://10.0.0.2;")))
    assert (default_generation_path(REDIS, "redis://127.0.0.1:6379/1")
            != default_generation_path(REDIS, "redis://127.0.0.1:6379/0"))
    assert (default_generation_path(REDIS, "redis://127.0.0.1:6380")
            != default_generation_path(REDIS, "redis://127.0.0.1:6379"))
    assert default_generation_path(FILE, "/a/b") != default_generation_path(FILE, "/a/c")
    assert os.path.dirname(default_generation_path(FILE, "/a/b")).startswith("/tmp/")


@pytest.mark.parametrize("spelled,options", [
    ("redis://127.0.0.1:6379/5", None), ("redis://127.0.0.1:6379/0?db=5", None),
    ("redis://127.0.0.1?db=05", None), ("redis://127.0.0.1", {"db": 5}),
    ("redis://127.0.0.1/", {"db": "5"}), ("redis://127.0.0.1/5", {"db": 3}),
])
def test_the_database_a_redis_client_selects_names_the_table(spelled: str,
                                                            options: dict | None) -> None:
    """redis-py takes ``?db=`` first, then the path, then the client's ``db``
    keyword (Django's RedisCache passes OPTIONS): the query and OPTIONS were
    ignored, so one database spelled two ways had two tables, and two databases
    one table."""
    assert (default_generation_path(REDIS, spelled, options)
            == default_generation_path(REDIS, "redis://127.0.0.1:6379/5"))
    assert (default_generation_path(REDIS, "redis://127.0.0.1", {"db": 4})
            != default_generation_path(REDIS, "redis://127.0.0.1", {"db": 5}))
    assert (default_generation_path("django_redis.cache.RedisCache", "redis://127.0.0.1",
                                    {"CONNECTION_POOL_KWARGS": {"db": 5}})
            == default_generation_path("django_redis.cache.RedisCache",
                                       "redis://127.0.0.1/5"))


@pytest.mark.parametrize("backend,one", [
    (REDIS, "redis://127.0.0.1:6379/0"),
    ("django.core.cache.backends.memcached.PyMemcacheCache", "127.0.0.1:11211"),
])
def test_one_server_listed_names_the_same_table_as_the_server(backend: str, one: str) -> None:
    """``["redis://h"]`` and ``"redis://h"`` (one server to Django either way) name
    one table: with two, a write acknowledged in one process would leave
    another's L1 serving the old value."""
    assert (default_generation_path(backend, [one]) == default_generation_path(backend, (one,))
            == default_generation_path(backend, one) == default_generation_path(backend, one + ";"))


MEMCACHED = ("django.core.cache.backends.memcached.PyMemcacheCache",
             "django.core.cache.backends.memcached.PyLibMCCache")


def test_a_path_object_names_the_table_of_its_path(tmp_path: Path) -> None:
    """Django takes a ``pathlib.Path`` LOCATION as its path, so the table is named
    after the path, not its ``repr``: else aliases over one directory spelled as
    a ``str`` and as a ``Path`` have two tables and one serves the value the
    other replaced."""
    store = tmp_path / "fb"
    assert default_generation_path(FILE, store) == default_generation_path(FILE, str(store))
    as_str = _over_files(str(store))
    as_path = TieredCache("", {"OPTIONS": {"L2": {"BACKEND": FILE, "LOCATION": store}}})
    as_path.set("k", "old")
    assert as_path.get("k") == "old" and as_path.get("k") == "old"  # an L1 hit now
    as_str.set("k", "new")
    assert as_path.get("k") == "new"


@pytest.mark.parametrize("backend", MEMCACHED)
@pytest.mark.parametrize("spelled", ["127.0.0.1", "127.0.0.1:11211", " 127.0.0.1:011211 ",
                                     ["127.0.0.1"]])
def test_a_memcached_server_without_a_port_is_the_one_on_the_default_port(
        backend: str, spelled: Any) -> None:
    """``127.0.0.1`` and ``127.0.0.1:11211`` are one server to every memcached
    client Django wraps, and so one table."""
    assert (default_generation_path(backend, spelled)
            == default_generation_path(backend, "127.0.0.1:11211"))
    assert (default_generation_path(backend, "Cache.Example:11211")
            == default_generation_path(backend, "cache.example"))
    assert (default_generation_path(backend, "[::1]")
            == default_generation_path(backend, "[::1]:11211"))
    assert (default_generation_path(backend, "127.0.0.1:11212")
            != default_generation_path(backend, "127.0.0.1"))
    assert (default_generation_path(backend, "unix:/run/memcached.sock")
            != default_generation_path(backend, "127.0.0.1"))


DISKCACHE = "diskcache.DjangoCache"


def _pair_over_files(tmp_path: Path, first: Any, second: Any) -> tuple[TieredCache, TieredCache]:
    """Two aliases over file-based caches at ``first`` and ``second``, sharing one
    explicit table: only the value board's store identity keeps them apart."""
    table = str(tmp_path / "shared.generations")
    return tuple(TieredCache("", {"OPTIONS": {"L2": {"BACKEND": FILE, "LOCATION": where},
                                               "GENERATION_PATH": table}})
                 for where in (first, second))  # type: ignore[return-value]


@pytest.mark.parametrize("case", ["tilde", "trailing-space", "link-dot-dot"])
def test_directories_the_file_based_cache_tells_apart_are_two_stores(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """The store is named as Django's FileBasedCache opens it, ``abspath(LOCATION)``,
    not ``realpath(expanduser(LOCATION.strip()))``: ``~/c`` (Django: a directory
    named ``~`` under the working directory) and ``$HOME/c``, ``/x/ws `` and
    ``/x/ws``, ``/x/link/../c`` (Django: ``/x/c``) and ``<link's target>/../c``
    are two stores, or a reader of one is served the value written to the other."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    (tmp_path / "elsewhere" / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere" / "sub")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    first, second = {
        "tilde": ("~/c", str(home / "c")),
        "trailing-space": (f"{tmp_path}/ws ", f"{tmp_path}/ws"),
        "link-dot-dot": (f"{tmp_path}/link/../c", f"{tmp_path}/elsewhere/c"),
    }[case]
    assert default_generation_path(FILE, first) != default_generation_path(FILE, second)
    a, b = _pair_over_files(tmp_path, first, second)
    assert a.l2._dir != b.l2._dir  # two directories to Django
    b.set("k", "b's value")
    assert b.get("k") == "b's value"  # in b's L1
    a.set("k", "a's value")
    assert b.get("k") == b.l2.get("k") == "b's value"
    assert a.get("k") == "a's value"


def test_a_diskcache_directory_with_a_variable_names_the_table_of_its_expansion(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """diskcache expands ``$VARS`` in its directory, and so does TieredCache when
    naming its table: else one store has two tables and a write through one
    spelling leaves the other's L1 serving the value it replaced."""
    pytest.importorskip("diskcache")
    monkeypatch.setenv("DJCB_TEST_CACHE_ROOT", str(tmp_path))
    assert (default_generation_path(DISKCACHE, "$DJCB_TEST_CACHE_ROOT/dc")
            == default_generation_path(DISKCACHE, str(tmp_path / "dc"))
            == default_generation_path(DISKCACHE, "${DJCB_TEST_CACHE_ROOT}/dc/"))
    # A file-based cache does not expand them: a directory named "$..." is another.
    assert (default_generation_path(FILE, "$DJCB_TEST_CACHE_ROOT/dc")
            != default_generation_path(FILE, str(tmp_path / "dc")))
    spelled, plain = (TieredCache("", {"OPTIONS": {"L2": {"BACKEND": DISKCACHE,
                                                          "LOCATION": where}}})
                      for where in ("$DJCB_TEST_CACHE_ROOT/dc", str(tmp_path / "dc")))
    spelled.set("k", "old")
    assert spelled.get("k") == "old" and spelled.get("k") == "old"  # an L1 hit now
    plain.set("k", "new")
    assert spelled.get("k") == "new"


@pytest.mark.parametrize("backend,options", [
    (REDIS, None), ("django_redis.cache.RedisCache", None),
    ("django_redis.cache.RedisCache", {"CLIENT_CLASS": "django_redis.client.DefaultClient"}),
])
def test_a_redis_primary_with_replicas_is_the_store_of_the_primary(
        backend: str, options: dict | None) -> None:
    """``[primary, replica]`` is named by its primary, not as a set of servers as
    memcached's list is: Django's RedisCache and django-redis's default client
    write to the first server only (the others are read replicas), so naming the
    set would give one store two tables."""
    primary = "redis://127.0.0.1:6379/0"
    assert (default_generation_path(backend, [primary, "redis://127.0.0.1:6380/0"], options)
            == default_generation_path(backend, f"{primary},redis://127.0.0.1:6381/0", options)
            == default_generation_path(backend, primary, options))


def test_servers_a_client_shards_over_are_one_store_together() -> None:
    """django-redis's ``ShardClient`` (and memcached) spread keys over every
    server of the list: the list is the store, not its first server."""
    pytest.importorskip("django_redis")
    pair = ["redis://127.0.0.1:6379/0", "redis://127.0.0.1:6380/0"]
    shard = {"CLIENT_CLASS": "django_redis.client.ShardClient"}
    assert (default_generation_path("django_redis.cache.RedisCache", pair, shard)
            != default_generation_path("django_redis.cache.RedisCache", pair[0], shard))
    memcached = MEMCACHED[0]
    assert (default_generation_path(memcached, ["127.0.0.1:11211", "127.0.0.1:11212"])
            != default_generation_path(memcached, "127.0.0.1:11211"))
