"""TieredCache over django-redis where the L2 does not store a value as it was set.

What TieredCache must answer then:

- a subclass of django-redis's ``RedisCache`` with its own ``set`` (here: values
  wrapped in an envelope its ``get`` unwraps, timeouts capped at a second) is
  not bypassed by the lean send: writing the bare value with the caller's
  timeout would make the backend's own ``get`` fail on the key, and let it live
  300 times longer than the subclass allows;
- django-redis stores an ``int`` that is not a ``bool`` or an ``Enum`` as its
  digits and reads it back as a plain ``int``: an ``int`` subclass set through
  TieredCache comes back as ``int`` from the writer's L1 too, as from the L2 and
  every other process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.cache.backends.base import DEFAULT_TIMEOUT
from django_redis.cache import RedisCache

from djcachebench.backends.tiered import TieredCache
from djcachebench.bench.servers import RedisServer


class EnvelopeRedisCache(RedisCache):
    """Stores ``{"envelope": value}`` for at most a second; gives back ``value``."""

    def set(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT,
            version: int | None = None, **kwargs: Any) -> Any:
        return super().set(key, {"envelope": value}, 1, version=version, **kwargs)

    def get(self, key: Any, default: Any = None, version: int | None = None,
            **kwargs: Any) -> Any:
        got = super().get(key, None, version=version, **kwargs)
        return default if got is None else got["envelope"]


class Price(int):
    currency = "EUR"


def _tiered(tmp_path: Path, l2: dict[str, Any], name: str) -> TieredCache:
    return TieredCache("", {"OPTIONS": {
        "L2": l2, "GENERATION_PATH": str(tmp_path / name / "generations.mmap")}})


def test_a_subclass_with_its_own_set_is_written_through_that_set(
        tmp_path: Path, redis_server: RedisServer) -> None:
    """Fails before: the lean send stored the bare value for 300 s."""
    location = redis_server.location
    l2 = {"BACKEND": f"{__name__}.EnvelopeRedisCache", "LOCATION": location}
    direct = EnvelopeRedisCache(location, {})
    tiered = _tiered(tmp_path, l2, "a")
    tiered.set("page", "v", 300)
    assert direct.get("page") == "v"
    ttl = direct.client.get_client().pttl(direct.make_key("page"))
    assert 0 < ttl <= 1000
    assert _tiered(tmp_path, l2, "b").get("page") == "v"  # another process's view
    assert tiered.get("page") == "v"


def test_an_int_subclass_reads_back_as_the_l2_gives_it(
        tmp_path: Path, redis_server: RedisServer) -> None:
    """Fails before: the writer's L1 gave back the ``Price`` it was handed."""
    location = redis_server.location
    l2 = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": location}
    direct = RedisCache(location, {})
    tiered = _tiered(tmp_path, l2, "a")
    tiered.set("price", Price(5), 300)
    assert type(direct.get("price")) is int
    got = tiered.get("price")
    assert got == 5 and type(got) is int
    assert type(_tiered(tmp_path, l2, "b").get("price")) is int
    # What django-redis gives back as set is still kept by the writer: a bool
    # (pickled by django-redis) and a plain int.
    tiered.set("flag", True, 300)
    tiered.set("count", 7, 300)
    hits = tiered.stats()["l1_hits"]
    assert tiered.get("flag") is True and tiered.get("count") == 7
    assert tiered.stats()["l1_hits"] == hits + 2
