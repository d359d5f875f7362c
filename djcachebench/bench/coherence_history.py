"""The checker of the coherence stress test: which reads were stale, offline.

Django-free. Workers log every operation (:class:`Op`); this module decides,
after the run, which reads broke TieredCache's guarantee: *a read that starts
after a write was acknowledged (in any process of the host) never returns an
older value* -- nor a value whose L2 expiry had passed, nor another key's value.

Identity of values
------------------
Every value names the operation that produced it, so a read's result points
at exactly one write:

* str keys (even index) hold ``"k|wid|n"``: key index, writer thread, the
  writer's own counter;
* int keys (odd index) hold ``k << 48 | set_id << 20 | n``: a ``set`` writes
  ``n = 0`` with a host-unique ``set_id``, and each ``incr`` returns the value
  it produced (atomic in the L2, so two increments never return the same one).
  ``set_id`` also names the *base* set whose expiry the value carries (``incr``
  keeps the expiry).

Time
----
Each operation records ``time.monotonic_ns()`` before the call (``t0``) and after
it returned (``t1``): on Linux that clock is one system-wide clock, so times
taken in different processes compare. ``t1`` is the acknowledgement. Expiry is
compared with ``time.time()`` taken at the same points (``w0``, ``w1``), the
clock the backend computes absolute expiry with; ``EXPIRY_MARGIN`` absorbs its
``<=`` versus ``<`` and float rounding.

The rules (each flags only what no correct cache may return)
------------------------------------------------------------
Real-time order: an operation Y that *started after* X was acknowledged
(``Y.t0 > X.t1``) is after X in any linearization of the L2.

1. **Superseded value.** A read R returns the value of X, and some write Y of
   the key with ``Y.t0 > X.t1`` and ``Y.t1 < R.t0`` -- a ``set``, an ``incr`` that
   returned a value, a ``delete`` (whatever it returned) or a ``clear`` -- was
   acknowledged before R began: after Y, X's value can never be current again
   (values are unique).
2. **Expired value.** R returns a value whose latest possible L2 expiry (the
   base set's ``w1 + timeout``, or any later ``touch`` that may have extended it)
   was before R began (``R.w0``).
3. **Absent although written.** R finds the key absent (``get``/``get_many``
   miss, ``has_key`` False), a producer W (``set``, or an ``incr`` that returned
   a value) was acknowledged before R began, and nothing could have removed
   its value (or a later one) before R returned: no ``delete``, ``clear``,
   "absent" ``incr``, ``False`` ``touch`` or failed operation overlapping the
   span from W's start to R's end, and no value that may be current in it
   (W's base, later producers, touches) could have expired by ``R.w1``. W is the
   latest-starting such producer: the one that leaves the fewest explanations.
4. **Regressed** (reported, not a breach of the guarantee): as rule 1, but Y is
   an ``incr`` that found the key absent or a ``touch`` that returned ``False``.
   Those are not writes: they only *observed* that X's value was gone, typically
   because a delete or clear was committed and not yet acknowledged. Returning
   X afterwards is not linearizable, but the guarantee speaks of acknowledged
   writes only.
5. **Wrong key / phantom.** R returns a value that names another key (wrong
   key), or one no operation wrote, or one written by an operation that began
   only after R returned (phantom).

Operations that raised are "unknown outcome": never used to prove staleness,
always accepted as a possible explanation. What this cannot see: silent
failures of the L2 (a write ShardedSQLiteCache gave up on returns normally);
the run therefore uses a long ``LOCK_TIMEOUT`` and reports ``give_ups``, which
must be 0 for the verdict to hold.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

#: Seconds of slack on expiry comparisons (the backend's ``<=``, float rounding).
EXPIRY_MARGIN = 0.05

ERROR = "!error"  # result of an operation that raised: ("!error", "Type: message")
ABSENT = "!absent"  # result of an incr of a missing key (ValueError)
CLEAR_KEY = -1  # the key field of a clear

READS = ("get", "get_many", "has_key")
WRITES = ("set", "delete", "incr", "touch", "clear")

_SET_BITS = 28
_N_BITS = 20


class Op(NamedTuple):
    """One logged operation. Times: ``t0``/``t1`` monotonic ns, ``w0``/``w1`` wall s."""

    kind: str
    key: int
    alias: str
    wid: int
    t0: int
    t1: int
    w0: float
    w1: float
    arg: Any  # set: (value, timeout); touch: timeout; incr: delta
    res: Any  # read: value or None (has_key: bool); delete/touch: bool; incr: int or ABSENT


def key_name(k: int) -> str:
    return f"stress:{k}"


def is_int_key(k: int) -> bool:
    return k % 2 == 1


def str_value(k: int, wid: int, n: int) -> str:
    return f"{k}|{wid}|{n}"


def int_value(k: int, wid: int, n: int) -> int:
    """The value a set writes on int key ``k``: ``n`` is the writer's op counter.

    Room for 2**14 keys, 256 writer threads and 2**20 ops per thread (a 64-bit
    integer, with 2**20 increments of each set before the fields overlap).
    """
    if not (k < 1 << 14 and wid < 1 << 8 and n < 1 << 20):
        raise ValueError(f"int value fields out of range: key {k}, thread {wid}, op {n}")
    return k << 48 | (wid << 20 | n) << _N_BITS


def decode(value: Any) -> tuple[int, Any] | None:
    """(key index, base id) named by a value, or None if no writer makes such values.

    The base id is what identifies the base set: the value itself for str
    values, the ``set_id`` for int values.
    """
    if isinstance(value, str):
        parts = value.split("|")
        if len(parts) == 3 and all(p.isdigit() for p in parts):
            return int(parts[0]), value
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value >> 48, (value >> _N_BITS) & ((1 << _SET_BITS) - 1)
    return None


def failed(op: Op) -> bool:
    return isinstance(op.res, tuple) and len(op.res) == 2 and op.res[0] == ERROR


def _until(w: float, timeout: float | None) -> float:
    return math.inf if timeout is None else w + timeout


@dataclass
class Finding:
    """A read that broke the guarantee, with what proves it."""

    kind: str  # "stale", "wrong_key", "phantom"; "regressed" (reported, not a breach)
    reason: str
    read: Op
    source: Op | None = None
    witness: Op | None = None


class _FirstAcked:
    """Ops by start; ``first_after(t)``: the first acknowledged of those begun after t."""

    def __init__(self, ops: list[Op]) -> None:
        ops = sorted(ops, key=lambda o: o.t0)
        self.t0 = [o.t0 for o in ops]
        self.best: list[Op | None] = [None] * (len(ops) + 1)
        for i in range(len(ops) - 1, -1, -1):
            best = self.best[i + 1]
            self.best[i] = ops[i] if best is None or ops[i].t1 < best.t1 else best

    def first_after(self, t: int) -> Op | None:
        return self.best[bisect.bisect_right(self.t0, t)]


class _Key:
    """Per-key indexes over the log (built once; every read check is a few bisects)."""

    def __init__(self, ops: list[Op]) -> None:
        self.sources: dict[Any, Op] = {}
        self.bases: dict[Any, Op] = {}
        self.duplicates = 0
        self.unknown_incrs = 0
        sup: list[Op] = []
        seen_absent: list[Op] = []
        touches: list[Op] = []
        producers: list[Op] = []
        for op in ops:
            bad = failed(op)
            if op.kind == "set":
                value = op.arg[0]
                self._source(value, op)
                base = decode(value)
                if base is not None:
                    self.bases[base[1]] = op
                if not bad:
                    sup.append(op)
                    producers.append(op)
            elif op.kind == "incr":
                if isinstance(op.res, int):
                    self._source(op.res, op)
                    producers.append(op)
                if bad:
                    self.unknown_incrs += 1
                elif op.res == ABSENT:
                    seen_absent.append(op)
                else:
                    sup.append(op)
            elif op.kind in ("delete", "clear"):
                if not bad:
                    sup.append(op)
            elif op.kind == "touch":
                if op.res is False:
                    seen_absent.append(op)
                elif op.res is True or bad:
                    touches.append(op)
        self.writes = _FirstAcked(sup)
        self.absences = _FirstAcked(seen_absent)
        touches.sort(key=lambda o: o.t1)
        self.touch_t1 = [o.t1 for o in touches]
        self.touch_latest = [-math.inf] * (len(touches) + 1)
        for i in range(len(touches) - 1, -1, -1):
            t = touches[i]
            self.touch_latest[i] = max(self.touch_latest[i + 1], _until(t.w1, t.arg))
        producers.sort(key=lambda o: o.t1)
        self.prod_t1 = [o.t1 for o in producers]
        # prod_latest[i]: the latest-starting producer among producers[:i + 1].
        self.prod_latest: list[Op] = []
        for p in producers:
            prev = self.prod_latest[-1] if self.prod_latest else None
            self.prod_latest.append(p if prev is None or p.t0 > prev.t0 else prev)
        self.muts = sorted(ops, key=lambda o: o.t0)
        self.mut_t0 = [o.t0 for o in self.muts]
        self.max_dur = max((o.t1 - o.t0 for o in ops), default=0)

    def superseded(self, source: Op, read: Op) -> tuple[str, Op] | None:
        """Rule 1 (or 4): an op begun after ``source`` and acknowledged before ``read``."""
        for kind, index in (("stale", self.writes), ("regressed", self.absences)):
            first = index.first_after(source.t1)
            if first is not None and first.t1 < read.t0:
                return kind, first
        return None

    def _source(self, value: Any, op: Op) -> None:
        old = self.sources.get(value)
        if old is not None and old is not op:
            # Two operations claim one value: an incr that was not atomic. Keep
            # the one acknowledged last (the weaker claim for rule 1).
            self.duplicates += 1
            if old.t1 > op.t1:
                return
        self.sources[value] = op

    def base_of(self, op: Op) -> Op | None:
        value = op.arg[0] if op.kind == "set" else op.res
        ident = decode(value)
        return None if ident is None else self.bases.get(ident[1])

    def latest_expiry(self, base: Op) -> float:
        j = bisect.bisect_right(self.touch_t1, base.t0)
        return max(_until(base.w1, base.arg[1]), self.touch_latest[j])


@dataclass
class Verdict:
    """What the checker found."""

    reads: int = 0
    value_reads: int = 0
    absent_reads: int = 0
    unchecked: int = 0  # has_key True (no value to check), unattributed values
    findings: list[Finding] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)  # finding kind -> reads
    by_alias: Counter = field(default_factory=Counter)  # (finding kind, alias) -> reads
    absences_by_expiry: int = 0  # absent reads an expiry could explain
    duplicate_values: int = 0

    @property
    def breaches(self) -> int:
        """Reads that broke the guarantee (stale, wrong key, phantom)."""
        return sum(n for kind, n in self.counts.items() if kind != "regressed")


def check(ops: Iterable[Op], keep: int = 20) -> Verdict:
    """Check every read of ``ops`` (all processes' logs together).

    Every read is counted; the first ``keep`` findings of each kind are kept
    (in the order the reads were logged, then sorted by start time).
    """
    mutations: dict[int, list[Op]] = {}
    clears: list[Op] = []
    reads: list[Op] = []
    for op in ops:
        if op.kind in READS:
            reads.append(op)
        elif op.kind == "clear":
            clears.append(op)
        else:
            mutations.setdefault(op.key, []).append(op)
    keys = {k: _Key(mutations.get(k, []) + clears)
            for k in {*mutations, *(r.key for r in reads)}}
    verdict = Verdict(duplicate_values=sum(k.duplicates for k in keys.values()))
    for read in reads:
        verdict.reads += 1
        key = keys[read.key]
        if failed(read):
            verdict.unchecked += 1  # the read raised: it returned nothing to judge
            continue
        if read.kind == "has_key":
            if read.res is True:
                verdict.unchecked += 1
                continue
            finding = _check_absent(read, key, verdict) if read.res is False else None
        elif read.res is None:
            finding = _check_absent(read, key, verdict)
        else:
            finding = _check_value(read, key, verdict)
        if finding is not None:
            verdict.counts[finding.kind] += 1
            verdict.by_alias[finding.kind, read.alias] += 1
            if verdict.counts[finding.kind] <= keep:  # the first ``keep`` of each kind
                verdict.findings.append(finding)
    verdict.findings.sort(key=lambda f: f.read.t0)
    return verdict


def _check_value(read: Op, key: _Key, verdict: Verdict) -> Finding | None:
    verdict.value_reads += 1
    ident = decode(read.res)
    if ident is None:
        return Finding("phantom", "a value no writer of this test makes", read)
    if ident[0] != read.key:
        return Finding("wrong_key", f"a value of key {ident[0]}", read)
    source = key.sources.get(read.res)
    if source is None:
        if key.unknown_incrs and isinstance(read.res, int) and ident[1] in key.bases:
            verdict.unchecked += 1  # an incr that raised may have made it
            return None
        return Finding("phantom", "a value never written", read)
    if source.t0 > read.t1:
        return Finding("phantom", "written only after the read returned", read, source)
    superseded = key.superseded(source, read)
    if superseded is not None and superseded[0] == "stale":
        return Finding("stale", "superseded: a later write was acknowledged before the "
                       "read began", read, source, superseded[1])
    base = source if source.kind == "set" else key.base_of(source)
    if base is not None:
        latest = key.latest_expiry(base)
        if read.w0 > latest + EXPIRY_MARGIN:
            return Finding("stale", f"expired {read.w0 - latest:.3f} s before the read "
                           "began", read, source, base)
    if superseded is not None:
        return Finding("regressed", "an acknowledged incr/touch had already found the "
                       "key absent before the read began", read, source, superseded[1])
    return None


def _check_absent(read: Op, key: _Key, verdict: Verdict) -> Finding | None:
    verdict.absent_reads += 1
    i = bisect.bisect_left(key.prod_t1, read.t0)
    if i == 0:
        return None  # nothing acknowledged before the read began
    last = key.prod_latest[i - 1]
    base = last if last.kind == "set" else key.base_of(last)
    if base is None:
        return None
    earliest = [_until(base.w0, base.arg[1])]
    removed = False
    lo = bisect.bisect_left(key.mut_t0, base.t0 - key.max_dur)
    hi = bisect.bisect_left(key.mut_t0, read.t1)
    for m in key.muts[lo:hi]:
        if m is last or m.t1 <= base.t0:
            continue
        after = m.t1 > last.t0  # may be ordered after the producer
        if m.kind in ("delete", "clear") or failed(m) or m.res is False or m.res == ABSENT:
            removed = removed or after
        elif m.kind == "touch":
            earliest.append(_until(m.w0, m.arg))
        elif after and m.kind == "set":
            earliest.append(_until(m.w0, m.arg[1]))
        elif after and m.kind == "incr":
            b = key.base_of(m)
            earliest.append(-math.inf if b is None else _until(b.w0, b.arg[1]))
    if min(earliest) <= read.w1 + EXPIRY_MARGIN:
        verdict.absences_by_expiry += 1  # an expiry could explain it (a removal may too)
        return None
    if removed:
        return None
    return Finding("stale", "absent, though a write was acknowledged before the read "
                   "began and nothing removed it", read, last)


def describe(finding: Finding, ops: Iterable[Op], origin: int, context: int = 12) -> str:
    """A finding and the key's operations around it, times in ms from ``origin``."""

    def ms(t: int) -> str:
        return f"{(t - origin) / 1e6:9.3f}"

    def line(op: Op) -> str:
        arg = "" if op.arg is None else f" arg={op.arg!r}"
        return (f"  [{ms(op.t0)} .. {ms(op.t1)}] ms  {op.kind:8} via {op.alias:6} "
                f"thread {op.wid:2}{arg} -> {op.res!r}")

    r = finding.read
    out = [f"{finding.kind}: key {r.key} ({key_name(r.key)}): {finding.reason}",
           f" read:{line(r)}"]
    if finding.source is not None:
        out.append(f" value written by:{line(finding.source)}")
    if finding.witness is not None:
        out.append(f" proof:{line(finding.witness)}")
    start = finding.source.t0 if finding.source is not None else r.t0
    near = sorted((o for o in ops if o.key in (r.key, CLEAR_KEY) and o.kind in WRITES
                   and o.t1 >= start - 50_000_000 and o.t0 <= r.t1), key=lambda o: o.t0)
    out.append(f" writes of the key (and clears) from 50 ms before the value's write to "
               f"the read's end ({len(near)}; last {context}):")
    out.extend(line(o) for o in near[-context:])
    return "\n".join(out)
