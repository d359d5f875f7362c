"""Checking what a cache returns: every value a get answers must be one the workload stored.

Why: a benchmark that only asks "was it None?" rewards a cache that answers
fast with the wrong thing. A backend whose ``get`` returns a constant and
whose ``set`` does nothing would show no misses and the best throughput of
the run. So every value a get returns (and every entry the footprint counts)
is checked against the values the workload could have stored *for that key*:
the key's pre-fill value and every value any worker's op list sets on it.
Whether it is also the *current* value (not one a later write replaced) is
freshness.py's check, on the same fingerprints.

How, outside the timed brackets:

* The worker reduces each returned value to a **fingerprint**
  (:func:`fingerprint`): its type, its length and a SHA-256 digest (16 bytes
  kept) of the *whole* value -- the bytes themselves, a str's Latin-1 or
  UTF-8 form, a JSON-like value's canonical JSON -- right after the call's
  second clock read. So a value that differs anywhere (its first and last
  byte altered, one record of a list changed) matches nothing, and no copy of
  a value is kept. Why SHA-256 and not CRC-32 (twice as fast): a CRC can be
  forged, and this check exists for caches that cheat. The per-hit cost is
  in docs/benchmarks.md ("What the harness checks").
* The parent, after the run, regenerates the op lists and the pre-fill
  (deterministic from the scenario and seed), takes the fingerprints of the
  values set on the keys that were observed, and counts the observed pairs
  that match none (:func:`count_wrong`). A serializer round trip (pickle,
  msgpack: a tuple comes back a list) leaves the fingerprint as it was: the
  canonical JSON has one array type, and dict keys in sorted order.

``int`` values (counters) are incremented, so any ``int`` is accepted when
the mix has ``incr``; without it the exact value must be one that was set.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import pickle
from collections.abc import Hashable, Iterable, Mapping
from decimal import Decimal
from typing import Any

from djcachebench.bench.workload import SET, Op, Scenario, generate_ops, prefill_items

#: Bytes of the SHA-256 digest kept in a fingerprint (128 bits: no accidental
#: collision among a run's values, and no value forged to match another).
DIGEST = 16
#: The fingerprint of a value of the wrong shape for the scenario's kind (matches nothing).
MALFORMED = ("malformed",)


def fingerprint(kind: str, value: Any, counters: bool = False) -> Hashable:
    """A serializer-proof summary of the whole of ``value`` as the workload's ``kind`` makes it.

    Two values have the same fingerprint only if they are equal (short of a
    SHA-256 collision); a pickle or msgpack round trip keeps it. Never
    raises: a value of the wrong type or shape is ``MALFORMED`` (plus its
    type, for the report), which matches no stored value.
    """
    try:
        if kind == "bytes":
            if type(value) is not bytes:
                return (*MALFORMED, type(value).__name__, _short(value))
            return (len(value), hashlib.sha256(value).digest()[:DIGEST])
        if kind == "str":
            if type(value) is not str:
                return (*MALFORMED, type(value).__name__, _short(value))
            return (len(value), _text_digest(value))
        if kind == "int":
            if type(value) is not int:
                return (*MALFORMED, type(value).__name__, _short(value))
            return ("int",) if counters else value
        if kind == "dict":
            if not isinstance(value, dict):
                return (*MALFORMED, type(value).__name__, _short(value))
            return ("dict", len(value.get("results") or ()), _text_digest(canonical(value)))
        if kind == "rows":
            if not isinstance(value, list | tuple):
                return (*MALFORMED, type(value).__name__, _short(value))
            return ("rows", len(value), _text_digest(canonical(value)))
    except Exception:
        return (*MALFORMED, type(value).__name__, _short(value))
    return (*MALFORMED, "unknown kind", kind)


def _text_digest(text: str) -> bytes:
    """SHA-256 of a str's whole content, without the cost of UTF-8 where it can.

    The workload's pages are Latin-1 text (CPython stores them one byte a
    character), whose Latin-1 form is a copy, not an encoding: 60 KB in
    microseconds where UTF-8 takes tens of them. The first byte of the hash
    input says which form it is, so the two never collide.
    """
    try:
        data, form = text.encode("latin-1"), b"L"
    except UnicodeEncodeError:
        data, form = text.encode("utf-8", "surrogatepass"), b"U"
    digest = hashlib.sha256(form)
    digest.update(data)
    return digest.digest()[:DIGEST]


def canonical(value: Any) -> str:
    """One text for every value equal to ``value``: JSON, dict keys sorted, tuples as lists.

    Why JSON: it has one array type (msgpack gives a tuple back as a list,
    and ``==`` does not tell them apart either) and is written in C. The
    types JSON lacks (``datetime``, ``Decimal`` and ``bytes`` in rows) are
    written as tagged objects. Keys of mixed types (no sort order) or that
    JSON cannot write fall back to ``repr``, which is exact but keeps the
    order and the tuple/list distinction.
    """
    try:
        return json.dumps(value, sort_keys=True, default=_tagged)
    except (TypeError, ValueError):
        return "repr:" + repr(value)


def _tagged(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return {"$" + type(value).__name__: value.isoformat()}
    if isinstance(value, Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, bytes | bytearray):
        return {"$bytes": bytes(value).hex()}
    return {"$" + type(value).__name__: repr(value)}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


#: Bytes of answers a worker's :class:`Recognizer` keeps to find them again.
RECOGNIZER_BYTES = 64 << 20


class Recognizer:
    """:func:`fingerprint`, at a fraction of its cost for answers seen before.

    Why: the worker takes every answer's fingerprint between two ops, outside
    the latency brackets but inside the wall time and ops/s; a SHA-256 of a
    60 KB page, or the canonical JSON of a 10 KB dict, cost as much as a fast
    cache's whole get, which narrowed the very differences the run measures.
    The workload's values come from a pool, so most answers were seen before:

    * ``bytes`` and ``str``: an answer equal to a kept earlier answer (looked
      up by its length and edges, then compared whole: ``==`` on two bytes or
      two one-kind strs is a memory compare, exact) gets that answer's
      fingerprint. Up to ``budget`` bytes of answers are kept, and the worker
      leaves them out of its memory figures (:attr:`nbytes`).
    * ``dict``: the SHA-256 of its pickle written without the pickler's memo
      (so that it does not depend on which objects were shared) determines
      the value exactly -- ``True`` and ``1``, or key order, pickle
      differently -- hence its canonical fingerprint, kept per digest.
    * ``rows`` and ``int``: :func:`fingerprint` itself (pickling datetimes is
      slower than their canonical JSON).

    Nothing is accepted by a shortcut that the full fingerprint would refuse:
    a shortcut only finds a fingerprint already computed for an equal value.
    """

    def __init__(self, kind: str, counters: bool = False, budget: int = RECOGNIZER_BYTES) -> None:
        self.kind = kind
        self.counters = counters
        self.budget = budget
        self.nbytes = 0
        # bytes/str answers kept, by (length, edges); dict fingerprints by pickle digest.
        self._kept: dict[tuple[int, Any, Any], list[tuple[Any, Hashable]]] = {}
        self._by_digest: dict[bytes, Hashable] = {}

    def __call__(self, value: Any) -> Hashable:
        kind = self.kind
        if (kind == "bytes" and type(value) is bytes) or (kind == "str" and type(value) is str):
            probe = (len(value), value[:16], value[-16:])
            kept = self._kept.get(probe)
            if kept is not None:
                for seen, print_ in kept:
                    if seen == value:
                        return print_
            print_ = fingerprint(kind, value, self.counters)
            size = len(value) + 64
            if self.nbytes + size <= self.budget:
                self.nbytes += size
                self._kept.setdefault(probe, []).append((value, print_))
            return print_
        if kind == "dict" and type(value) is dict:
            digest = _pickle_digest(value)
            if digest is None:
                return fingerprint(kind, value, self.counters)
            found = self._by_digest.get(digest)
            if found is None:
                found = fingerprint(kind, value, self.counters)
                if self.nbytes + 128 <= self.budget:
                    self.nbytes += 128
                    self._by_digest[digest] = found
            return found
        return fingerprint(kind, value, self.counters)


def _pickle_digest(value: Any) -> bytes | None:
    """SHA-256 of ``value``'s pickle without memo (None when it cannot be pickled so)."""
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=5)
    pickler.fast = True  # no memo: the bytes depend on the value, not on object sharing
    try:
        pickler.dump(value)
    except Exception:
        return None
    return b"p" + hashlib.sha256(out.getbuffer()).digest()


class Observer:
    """Counts ``(key, fingerprint)`` pairs of the values a worker's gets returned."""

    def __init__(self, scenario: Scenario) -> None:
        self.kind = scenario.value_kind
        self.counters = scenario.mix.get("incr", 0) > 0
        self.seen: dict[tuple[Any, Hashable], int] = {}
        self.recognize = Recognizer(self.kind, self.counters)

    def add(self, key: Any, value: Any) -> Hashable:
        """Count the answer; its fingerprint is returned for the freshness history."""
        print_ = self.recognize(value)
        pair = (key, print_)
        self.seen[pair] = self.seen.get(pair, 0) + 1
        return print_


class Replay:
    """The run's workload regenerated in the parent, as fingerprints, once for both checks.

    Per worker, per op (warm-up included, in the order the worker ran them):
    the action code, the key and, for a set, the fingerprint of its value
    (None otherwise). Values themselves are not kept: a run of fresh 1 MB
    values would otherwise be held whole. The pre-fill's fingerprints only
    for ``keys`` (the keys some answer or entry needs): a million-key
    pre-fill is regenerated, not fingerprinted.
    """

    def __init__(
        self, scenario: Scenario, seed: int, keys: set[Any], prefill_cap: int | None
    ) -> None:
        self.scenario = scenario
        kind, counters = scenario.value_kind, scenario.mix.get("incr", 0) > 0
        self.codes: list[bytearray] = []
        self.keys: list[list[Any]] = []
        self.prints: list[list[Hashable | None]] = []
        for worker in range(scenario.streams):  # a process's threads or tasks each
            ops: list[Op] = generate_ops(scenario, seed, worker)
            # Pool values are the same objects op after op: one digest each.
            memo: dict[int, Hashable] = {}
            prints: list[Hashable | None] = []
            for code, _, value in ops:
                if code != SET:
                    prints.append(None)
                    continue
                print_ = memo.get(id(value))
                if print_ is None:
                    print_ = memo[id(value)] = fingerprint(kind, value, counters)
                prints.append(print_)
            self.codes.append(bytearray(op[0] for op in ops))
            self.keys.append([op[1] for op in ops])
            self.prints.append(prints)
            del ops, memo
        self.prefill: dict[Any, Hashable] = {}
        if scenario.prefill:
            for key, value in prefill_items(scenario, seed, prefill_cap):
                if key in keys:
                    self.prefill[key] = fingerprint(kind, value, counters)


def expected(
    scenario: Scenario,
    seed: int,
    keys: set[Any],
    prefill_cap: int | None,
    replay: Replay | None = None,
) -> dict[Any, set[Hashable]]:
    """Per key of ``keys``: the fingerprints of every value the workload may have stored.

    ``prefill_cap``: the limit worker 0's pre-fill ran with (it picks the keys
    and their values), so the pre-fill is regenerated exactly.
    """
    replay = replay or Replay(scenario, seed, keys, prefill_cap)
    found: dict[Any, set[Hashable]] = {key: set() for key in keys}
    for key, print_ in replay.prefill.items():
        if key in found:
            found[key].add(print_)
    for codes, op_keys, prints in zip(replay.codes, replay.keys, replay.prints, strict=True):
        for code, key, print_ in zip(codes, op_keys, prints, strict=True):
            if code == SET and key in found:
                found[key].add(print_)
    if scenario.mix.get("incr", 0) > 0:
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
    replay: Replay | None = None,
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
    allowed = expected(scenario, seed, keys, prefill_cap, replay)
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


def answered_keys(
    observed: Iterable[Mapping[tuple[Any, Hashable], int]],
    entries: Mapping[Any, Hashable] | None = None,
) -> set[Any]:
    """The keys whose stored values a check needs: those answered, and those counted."""
    keys = {key for part in observed for key, _ in part}
    keys.update(entries or {})
    return keys
