"""Checking what a cache returns: every value a get answers must be one the workload stored.

Why: a benchmark that only asks "was it None?" rewards a cache that answers
fast with the wrong thing. A backend whose ``get`` returns a constant and
whose ``set`` does nothing would show no misses and the best throughput of
the run. So every value a get returns (and every entry the footprint counts)
is checked against the values the workload could have stored *for that key*:
the key's pre-fill value and every value any worker's op list sets on it
(a stale value of the key is still one of them; another key's value is not).

How, cheaply and outside the timed brackets:

* The worker reduces each returned value to a small **fingerprint**
  (:func:`fingerprint`: its type, its length and a slice from its middle for
  bytes and str; a few fields for the JSON-like kinds) right after the call's
  second clock read, and counts ``(key, fingerprint)`` pairs. That costs a
  slice and a dict update per hit, whatever the value's size, and needs no
  copy of a value nor any change to the values the workload stores (the
  reference op lists stay what they always were, call for call).
* The parent, after the run, regenerates the op lists and the pre-fill
  (deterministic from the scenario and seed), takes the fingerprints of the
  values set on the keys that were observed, and counts the observed pairs
  that match none (:func:`count_wrong`). A serializer round trip (pickle,
  msgpack: a tuple comes back a list) leaves every fingerprint field as it was.

``int`` values (counters) are incremented, so any ``int`` is accepted when
the mix has ``incr``; without it the exact value must be one that was set.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Any

from djcachebench.bench.workload import SET, Scenario, generate_ops, prefill_items

#: Characters (or bytes) from the middle of a str/bytes value in its fingerprint.
SLICE = 24
#: The fingerprint of a value of the wrong shape for the scenario's kind (matches nothing).
MALFORMED = ("malformed",)


def fingerprint(kind: str, value: Any, counters: bool = False) -> Hashable:
    """A small, serializer-proof summary of ``value`` as the workload's ``kind`` makes it.

    Never raises: a value of the wrong type or shape is ``MALFORMED`` (plus its
    type, for the report), which matches no stored value.
    """
    try:
        if kind in ("bytes", "str"):
            expected = bytes if kind == "bytes" else str
            if type(value) is not expected:
                return (*MALFORMED, type(value).__name__, _short(value))
            n = len(value)
            middle = max(0, n // 2 - SLICE // 2)
            return (n, value[middle : middle + SLICE])
        if kind == "int":
            if type(value) is not int:
                return (*MALFORMED, type(value).__name__, _short(value))
            return ("int",) if counters else value
        if kind == "dict":
            results = value["results"]
            first = results[0]["uuid"] if results else None
            last = results[-1]["uuid"] if results else None
            return (value["count"], value["next"], len(results), first, last)
        if kind == "rows":
            if not isinstance(value, list | tuple):
                return (*MALFORMED, type(value).__name__, _short(value))
            first, last = (value[0], value[-1]) if value else ({}, {})
            return (len(value), first.get("id"), first.get("views"), last.get("id"))
    except Exception:
        return (*MALFORMED, type(value).__name__, _short(value))
    return (*MALFORMED, "unknown kind", kind)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class Observer:
    """Counts ``(key, fingerprint)`` pairs of the values a worker's gets returned."""

    def __init__(self, scenario: Scenario) -> None:
        self.kind = scenario.value_kind
        self.counters = scenario.mix.get("incr", 0) > 0
        self.seen: dict[tuple[Any, Hashable], int] = {}

    def add(self, key: Any, value: Any) -> None:
        pair = (key, fingerprint(self.kind, value, self.counters))
        self.seen[pair] = self.seen.get(pair, 0) + 1


def expected(
    scenario: Scenario, seed: int, keys: set[Any], prefill_cap: int | None
) -> dict[Any, set[Hashable]]:
    """Per key of ``keys``: the fingerprints of every value the workload may have stored.

    ``prefill_cap``: the limit worker 0's pre-fill ran with (it picks the keys
    and their values), so the pre-fill is regenerated exactly.
    """
    kind, counters = scenario.value_kind, scenario.mix.get("incr", 0) > 0
    found: dict[Any, set[Hashable]] = {key: set() for key in keys}
    if scenario.prefill:
        for key, value in prefill_items(scenario, seed, prefill_cap):
            if key in found:
                found[key].add(fingerprint(kind, value, counters))
    for worker in range(scenario.procs):
        for code, key, value in generate_ops(scenario, seed, worker):
            if code == SET and key in found:
                found[key].add(fingerprint(kind, value, counters))
    if counters:
        # An incr of an absent key sets 1; every later incr gives another int.
        for fingerprints in found.values():
            fingerprints.add(("int",))
    return found


def count_wrong(
    observed: Iterable[Mapping[tuple[Any, Hashable], int]],
    scenario: Scenario,
    seed: int,
    prefill_cap: int | None,
    entries: Mapping[Any, Hashable] | None = None,
) -> tuple[int, int, str | None]:
    """(wrong get answers, wrong entries among ``entries``, an example) after a run.

    ``observed``: each worker's :attr:`Observer.seen`; ``entries``: the
    fingerprints of the entries worker 0 found when it counted them.
    """
    parts = list(observed)
    keys = {key for part in parts for key, _ in part}
    keys.update(entries or {})
    if not keys:
        return 0, 0, None
    allowed = expected(scenario, seed, keys, prefill_cap)
    wrong = 0
    example = None
    for part in parts:
        for (key, print_), n in part.items():
            if print_ not in allowed[key]:
                wrong += n
                example = example or f"key {key!r} answered {_short(print_)}"
    bad_entries = 0
    for key, print_ in (entries or {}).items():
        if print_ not in allowed[key]:
            bad_entries += 1
            example = example or f"entry {key!r} holds {_short(print_)}"
    return wrong, bad_entries, example
