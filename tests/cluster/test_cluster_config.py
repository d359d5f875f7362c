"""COHERENCE='cluster' settings: what is accepted, what is refused, and how the
default COHERENCE_URL is found."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from djcachebench.tiered.config import read_config

DJANGO_REDIS = "django.core.cache.backends.redis.RedisCache"
DJANGO_REDIS_PKG = "django_redis.cache.RedisCache"
MEMCACHED = "django.core.cache.backends.memcached.PyMemcacheCache"
SQLITE = "djcachebench.backends.sqlite.ShardedSQLiteCache"


def config(l2: dict[str, Any], **options: Any) -> Any:
    return read_config("", {"OPTIONS": {"L2": l2, **options}})


@pytest.mark.parametrize(("backend", "location", "url"), [
    (DJANGO_REDIS, "redis://127.0.0.1:6390/2", "redis://127.0.0.1:6390/2"),
    (DJANGO_REDIS, "redis://127.0.0.1:6390/0,redis://127.0.0.1:6391/0",
     "redis://127.0.0.1:6390/0"),
    (DJANGO_REDIS_PKG, ["redis://:pw@127.0.0.1:6392/1", "redis://127.0.0.1:6393/1"],
     "redis://:pw@127.0.0.1:6392/1"),
])
def test_the_url_defaults_to_the_l2s_primary_redis(backend: str, location: Any,
                                                   url: str) -> None:
    assert config({"BACKEND": backend, "LOCATION": location},
                  COHERENCE="cluster").coherence_url == url


def test_an_explicit_url_serves_any_other_l2() -> None:
    got = config({"BACKEND": MEMCACHED, "LOCATION": "127.0.0.1:11211"}, COHERENCE="cluster",
                 COHERENCE_URL="redis://127.0.0.1:6400/0")
    assert got.coherence_url == "redis://127.0.0.1:6400/0"


@pytest.mark.parametrize(("l2", "options", "message"), [
    ({"BACKEND": MEMCACHED, "LOCATION": "127.0.0.1:11211"}, {"COHERENCE": "cluster"},
     r"\['COHERENCE_URL'\] is required with COHERENCE='cluster' over .*PyMemcacheCache"),
    ({"BACKEND": SQLITE, "LOCATION": "/tmp/x"}, {"COHERENCE": "cluster"},
     r"\['COHERENCE'\] = 'cluster' is invalid over a ShardedSQLiteCache L2"),
    ({"BACKEND": SQLITE, "LOCATION": "/tmp/x"},
     {"COHERENCE": "cluster", "COHERENCE_URL": "redis://127.0.0.1:1/0"},
     r"\['COHERENCE'\] = 'cluster' is invalid over a ShardedSQLiteCache L2"),
    ({"BACKEND": DJANGO_REDIS, "LOCATION": "redis://127.0.0.1:1/0"},
     {"COHERENCE_URL": "redis://127.0.0.1:1/0"},
     r"\['COHERENCE_URL'\] = 'redis://127.0.0.1:1/0' is invalid with COHERENCE='host'"),
    ({"BACKEND": DJANGO_REDIS, "LOCATION": "unix:///tmp/redis.sock"}, {"COHERENCE": "cluster"},
     r"\['COHERENCE_URL'\] = 'unix:///tmp/redis.sock' \(the default, from the L2's LOCATION"),
    ({"BACKEND": DJANGO_REDIS, "LOCATION": "redis://127.0.0.1:1/0"},
     {"COHERENCE": "cluster", "COHERENCE_URL": "http://127.0.0.1:1/"},
     r"\['COHERENCE_URL'\] = 'http://127.0.0.1:1/' is invalid: .*only redis://"),
    ({"BACKEND": DJANGO_REDIS, "LOCATION": "redis://127.0.0.1:1/0"},
     {"COHERENCE": "cluster", "COHERENCE_URL": ""},
     r"\['COHERENCE_URL'\] = '' is invalid; allowed: a redis:// URL"),
    # Port 0 is refused, not read as "no port", the default 6379.
    ({"BACKEND": DJANGO_REDIS, "LOCATION": "redis://127.0.0.1:1/0"},
     {"COHERENCE": "cluster", "COHERENCE_URL": "redis://127.0.0.1:0/0"},
     r"\['COHERENCE_URL'\] = 'redis://127.0.0.1:0/0' is invalid: .*bad port 0"),
    ({"BACKEND": DJANGO_REDIS, "LOCATION": "redis://127.0.0.1:00/0"},
     {"COHERENCE": "cluster"},
     r"\['COHERENCE_URL'\] = 'redis://127.0.0.1:00/0' \(the default.*bad port 0"),
])
def test_bad_cluster_settings_name_the_setting(l2: dict[str, Any], options: dict[str, Any],
                                               message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        config(l2, **options)


def test_the_harness_splits_workers_into_simulated_hosts() -> None:
    from djcachebench.bench.worker import SIMULATED_HOSTS, simulated_host

    settings = {SIMULATED_HOSTS: 2, "CACHES": {"default": {"OPTIONS": {
        "GENERATION_PATH": "/w/host{host}/g.mmap", "L2": {"LOCATION": ["a{host}", 3]}}}}}
    paths = [simulated_host(dict(settings), i)["CACHES"]["default"]["OPTIONS"]
             for i in range(4)]
    assert [p["GENERATION_PATH"] for p in paths] == [
        "/w/host0/g.mmap", "/w/host1/g.mmap", "/w/host0/g.mmap", "/w/host1/g.mmap"]
    assert paths[1]["L2"]["LOCATION"] == ["a1", 3]
    assert SIMULATED_HOSTS not in simulated_host(dict(settings), 0)
    plain = {"CACHES": {"default": {"LOCATION": "x{host}"}}}
    assert simulated_host(dict(plain), 1) == plain  # untouched without the setting
