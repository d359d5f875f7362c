"""``djcachebench breakdown``: timers around the real parts of a get and a set
(bench/breakdown_probes.py) charge each part once, see every part a backend's
call goes through, and leave the cache as they found it."""

from __future__ import annotations

from pathlib import Path
from random import Random
from typing import Any

from djcachebench.backends.tiered import TieredCache
from djcachebench.bench.breakdown import measure
from djcachebench.bench.breakdown_probes import PartTimer, instrumented
from djcachebench.bench.values import api_response
from djcachebench.store.codec import Codec
from tests.sqlite.helpers import new_cache
from tests.tiered.helpers import SQLITE

VALUE = api_response(10_240, Random(0))


def test_a_part_inside_another_is_charged_once() -> None:
    timer = PartTimer()
    inner = timer.wrap("integrity", lambda: sum(range(2_000)))
    outer = timer.wrap("store", lambda: [inner() for _ in range(3)])
    outer()
    assert timer.totals["integrity"] > 0 and timer.totals["store"] > 0
    # Exclusive: the store's own share excludes the three inner calls.
    bare = PartTimer()
    bare.wrap("store", lambda: [sum(range(2_000)) for _ in range(3)])()
    assert timer.totals["store"] < bare.totals["store"]


def _parts_seen(cache: Any, action: str) -> set[str]:
    timer = PartTimer()
    cache.set("k", VALUE)
    with instrumented(cache, timer):
        got = cache.set("k", VALUE) if action == "set" else cache.get("k")
    if action == "get":
        assert got == VALUE  # the probes change no answer
    return {part for part, ns in timer.totals.items() if ns}


def test_sqlite_get_and_set_go_through_every_part_and_are_restored(tmp_path: Path) -> None:
    cache = new_cache(tmp_path / "c", {"SERIALIZER": "msgpack"})
    codec, pool, store = cache._store.codec, cache._store.pool, cache._store
    assert _parts_seen(cache, "set") == {"key", "serialize", "integrity", "store"}
    assert _parts_seen(cache, "get") == {"key", "deserialize", "integrity", "store"}
    assert type(codec) is Codec
    assert "cursor" not in vars(pool) and "run" not in vars(store)
    assert "make_and_validate_key" not in vars(cache)
    assert cache.get("k") == VALUE


def test_tiered_l1_hit_is_a_lookup_and_a_copy_without_key_making(tmp_path: Path) -> None:
    from djcachebench.backends import tiered

    loads = tiered._loads
    cache = TieredCache("", {"OPTIONS": {
        "L2": {"BACKEND": SQLITE, "LOCATION": str(tmp_path / "s")}}})
    cache.set("k", VALUE)
    assert cache.get("k") == VALUE  # in the L1
    assert _parts_seen(cache, "get") == {"l1", "deserialize"}
    assert tiered._loads is loads and tiered.pickle.dumps.__module__ == "_pickle"


def test_measure_reports_parts_that_add_up_to_the_instrumented_call(tmp_path: Path) -> None:
    cache = new_cache(tmp_path / "c")
    row = measure(cache, "get", VALUE, calls=50, warmup=5)
    assert row["answered"]
    total = sum(row["parts_ns"].values()) + row["other_ns"]
    assert abs(total - row["instrumented_ns"]) < 1e-6 * row["instrumented_ns"] + 1
