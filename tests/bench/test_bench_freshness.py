"""Whole values and fresh values: a corrupted or stale answer fails its target.

A cache that alters the first and last byte of every value it returns must
fail the check (a fingerprint of a length and a slice from the middle would
pass it), and so must a cache that keeps only the first value of each key --
ignoring later sets and deletes -- which would be reported ok and fastest if
any value ever stored for the key were accepted.
"""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.cache.backends.locmem import LocMemCache

from djcachebench.bench.progress import Progress
from djcachebench.bench.report import status as report_status
from djcachebench.bench.runner import RunOptions, run_targets
from djcachebench.bench.targets import Target, load_targets, select_targets
from djcachebench.bench.values import build_pool
from djcachebench.bench.workload import REFERENCE, Scenario

# Names added with the checks are imported in the tests, so that each test
# fails on the code before them by its assertions, not at collection.


class FlipEdgesCache(LocMemCache):
    """Stores faithfully, answers with the first and last byte (or character) altered."""

    def get(self, key: Any, default: Any = None, version: Any = None) -> Any:
        value = super().get(key, default, version)
        if isinstance(value, bytes) and len(value) >= 2:
            return bytes([value[0] ^ 0xFF]) + value[1:-1] + bytes([value[-1] ^ 0xFF])
        if isinstance(value, str) and len(value) >= 2:
            return "X" + value[1:-1] + "Y"
        return value


class WriteOnceCache(LocMemCache):
    """Keeps the first value written to each key: later sets and deletes do nothing."""

    def set(self, key: Any, value: Any, timeout: Any = 300, version: Any = None) -> None:
        self.add(key, value, timeout, version)

    def set_many(self, data: Any, timeout: Any = 300, version: Any = None) -> list[Any]:
        for key, value in data.items():
            self.add(key, value, timeout, version)
        return []

    def delete(self, key: Any, version: Any = None) -> bool:
        return True


def _quiet() -> Progress:
    return Progress(live=False, stream=io.StringIO())


def _target(name: str, cls: type) -> Target:
    return Target(name, name, caches=lambda env: {"BACKEND": f"{__name__}.{cls.__name__}",
                                                  "LOCATION": name})  # fmt: skip


ONE = RunOptions(scenario=REFERENCE.with_overrides(procs=1, ops=1_500, warmup=10, keys=200))


def test_a_value_altered_anywhere_has_another_fingerprint() -> None:
    from djcachebench.bench.verify import fingerprint

    for kind in ("bytes", "str"):
        for value in build_pool(kind, "uniform", 1_000, 70_000, 4, 1):
            flipped = (
                bytes([value[0] ^ 1]) + value[1:-1] + bytes([value[-1] ^ 1])
                if kind == "bytes"
                else "X" + value[1:-1] + "Y"
            )
            assert fingerprint(kind, flipped) != fingerprint(kind, value)
            assert fingerprint(kind, value[:-1] + value[-1:]) == fingerprint(kind, value)
    page = build_pool("dict", "uniform", 5_000, 5_000, 1, 1)[0]
    altered = {**page, "results": [*page["results"][:-1], {**page["results"][-1], "id": -1}]}
    assert fingerprint("dict", altered) != fingerprint("dict", page)


def test_a_msgpack_round_trip_still_verifies() -> None:
    """msgpack gives tuples back as lists; an equal value has the same fingerprint."""
    from djcachebench.bench.verify import fingerprint
    from djcachebench.serializers import load_serializer

    msgpack = load_serializer("msgpack")
    value = {"count": 2, "next": None, "results": [{"id": 1, "pair": (1, "a")}, {"id": 2}]}
    back = msgpack.loads(msgpack.dumps(value))
    assert back["results"][0]["pair"] == [1, "a"]
    assert fingerprint("dict", back) == fingerprint("dict", value)
    rows = [{"id": 1, "tags": ("x", "y")}]
    assert fingerprint("rows", msgpack.loads(msgpack.dumps(rows))) == fingerprint("rows", rows)


def _history(events: list[tuple[int, int, int, Any]]) -> dict[str, Any]:
    """A worker's history from (t0, t1, status, fingerprint or None) per op."""
    from djcachebench.bench.freshness import HIT, History

    history = History()
    for t0, t1, status, print_ in events:
        history.t0.append(t0)
        history.t1.append(t1)
        history.status.append(status)
        if status == HIT:
            history.answer(print_)
    data = history.to_dict()
    data["shared_clock"] = True
    return data


def _replay(ops: list[list[tuple[int, Any, Any]]], prefill: dict[Any, Any]) -> Any:
    """A verify.Replay of hand-made op lists: (code, key, fingerprint of a set)."""
    from djcachebench.bench.verify import Replay

    replay = Replay.__new__(Replay)
    replay.scenario = Scenario(name="t", procs=len(ops), ops=10, warmup=0, keys=5)
    replay.codes = [bytearray(op[0] for op in worker) for worker in ops]
    replay.keys = [[op[1] for op in worker] for worker in ops]
    replay.prints = [[op[2] for op in worker] for worker in ops]
    replay.prefill = prefill
    return replay


def test_stale_answers_across_processes_and_what_is_not_stale() -> None:
    from djcachebench.bench.freshness import DONE, HIT, RAISED, count_stale
    from djcachebench.bench.workload import GET, SET

    k = "k"
    # Worker 1 sets "new" (acknowledged at 20); worker 0 reads the pre-fill
    # value "old" at 30: stale, against another process's write.
    replay = _replay([[(GET, k, None)], [(SET, k, "new")]], {k: "old"})
    histories = [_history([(30, 31, HIT, "old")]), _history([(10, 20, DONE, None)])]
    result = count_stale(histories, replay, 0)
    assert (result.stale, result.held) == (1, 1)
    # A read that began before the write was acknowledged may see the old value.
    histories = [_history([(15, 31, HIT, "old")]), _history([(10, 20, DONE, None)])]
    assert count_stale(histories, replay, 0).stale == 0
    # A set that raised may or may not have taken effect: never a proof.
    histories = [_history([(30, 31, HIT, "old")]), _history([(10, 20, RAISED, None)])]
    assert count_stale(histories, replay, 0).stale == 0
    # The same value stored again later (pooled values): the answer is that write's.
    replay = _replay([[(GET, k, None)], [(SET, k, "new"), (SET, k, "old")]], {k: "old"})
    events = [(10, 20, DONE, None), (21, 25, DONE, None)]
    histories = [_history([(30, 31, HIT, "old")]), _history(events)]
    assert count_stale(histories, replay, 0).stale == 0
    # Read-your-writes: a process's own set, then its get of the older value.
    replay = _replay([[(SET, k, "new"), (GET, k, None)]], {k: "old"})
    result = count_stale([_history([(10, 20, DONE, None), (30, 31, HIT, "old")])], replay, 0)
    assert (result.stale, result.held) == (1, 1)


def test_what_a_scope_holds_against_the_cache() -> None:
    """A per-process cache answers for its own writes only; across simulated hosts a
    cache is held to its bound, on its own host to no bound."""
    from djcachebench.bench.freshness import DONE, HIT, Scope, count_stale
    from djcachebench.bench.workload import GET, SET

    k = "k"
    replay = _replay([[(GET, k, None)], [(SET, k, "new")]], {k: "old"})
    # Worker 1's write acknowledged at 20, worker 0 reads "old" from 30 to 31.
    histories = [_history([(30, 31, HIT, "old")]), _history([(10, 20, DONE, None)])]

    def counted(scope: Scope) -> tuple[int, int]:
        result = count_stale(histories, replay, 0, scope)
        return result.stale, result.held

    assert counted(Scope(per_process=True)) == (1, 0)
    assert counted(Scope(hosts=(0, 0), host_bound_ns=100)) == (1, 1)
    assert counted(Scope(hosts=(0, 1), host_bound_ns=100)) == (1, 0)  # 30 < 20 + 100
    assert counted(Scope(hosts=(0, 1), host_bound_ns=9)) == (1, 1)  # 30 > 20 + 9
    # Its own write binds a per-process cache's reader at once.
    replay = _replay([[(SET, k, "new"), (GET, k, None)]], {k: "old"})
    own = [_history([(10, 20, DONE, None), (30, 31, HIT, "old")])]
    assert count_stale(own, replay, 0, Scope(per_process=True)).held == 1


@pytest.mark.slow
def test_a_cache_flipping_edge_bytes_fails() -> None:
    results = run_targets([_target("flip", FlipEdgesCache)], ONE, _quiet())
    (flip,) = results.backends
    gets = flip.actions["get"]
    # Every hit but those on 1-byte values (which it cannot alter at both ends).
    assert gets.count > gets.miss > 0 and gets.wrong > 0.95 * (gets.count - gets.miss)
    assert any("wrong values" in why for why in flip.failures)


@pytest.mark.slow
def test_a_write_once_cache_fails_and_an_honest_one_passes() -> None:
    targets = [_target("write-once", WriteOnceCache), _target("honest", LocMemCache)]
    results = run_targets(targets, ONE, _quiet())
    by_name = {b.name: b for b in results.backends}
    once, honest = by_name["write-once"], by_name["honest"]
    assert once.actions["get"].wrong == 0
    assert once.actions["get"].stale > 100
    assert once.stale and any("stale" in why for why in once.stale)
    assert report_status(once) == "**stale**"
    assert honest.actions["get"].stale == 0 and honest.actions["get"].wrong == 0
    assert not honest.failures and not honest.stale and report_status(honest) == "ok"


@pytest.mark.slow
def test_shared_caches_in_two_processes_have_no_stale_answer() -> None:
    """sqlite is shared: 0 stale. locmem is per process: stale across processes
    reported but not a failure, as long as each process reads its own writes."""
    options = RunOptions(scenario=REFERENCE.with_overrides(procs=2, ops=1_500, warmup=10))
    results = run_targets(select_targets(load_targets(), ["sqlite", "locmem"]), options, _quiet())
    by_name = {b.name: b for b in results.backends}
    sqlite, locmem = by_name["sqlite"], by_name["locmem"]
    assert sqlite.actions["get"].stale == 0 and not sqlite.failures and not sqlite.stale
    # Held against it: none; reported in a note: the other process's writes it missed.
    assert locmem.actions["get"].stale == 0 and not locmem.failures and not locmem.stale
    assert any("per-process" in note for note in locmem.notes)


def test_the_recognizer_gives_the_full_fingerprint_of_every_answer() -> None:
    """Its shortcuts only find a fingerprint computed for an equal value: an answer
    that differs anywhere (the middle of a page, True for 1 in a dict) gets its own."""
    from djcachebench.bench.verify import Recognizer, fingerprint

    page = bytes(range(256)) * 40
    middle = bytearray(page)
    middle[5_000] ^= 1
    for kind, values in [
        ("bytes", [page, bytes(middle), page[:10], page, b""]),
        ("str", ["é" * 300 + "x", "é" * 300 + "y", "a" * 50, "é" * 300 + "x"]),
        ("dict", [{"a": 1, "b": [1, 2]}, {"a": True, "b": [1, 2]}, {"b": [1, 2], "a": 1},
                  {"a": 1.0, "b": [1, 2]}, {"a": 1, "b": [1, 2]}, {"a": object()}]),
        ("rows", [[{"id": 1}], [{"id": 2}], [{"id": 1}]]),
    ]:
        recognize = Recognizer(kind)
        for value in values:
            assert recognize(value) == fingerprint(kind, value), (kind, value)
        assert recognize(bytes(middle) if kind == "bytes" else values[1]) != recognize(values[0])


def test_the_recognizer_keeps_answers_within_its_budget() -> None:
    from djcachebench.bench.verify import Recognizer, fingerprint

    recognize = Recognizer("bytes", budget=10_000)
    for i in range(50):
        value = bytes([i]) * 1_000
        assert recognize(value) == fingerprint("bytes", value)
    assert 0 < recognize.nbytes <= 10_000
