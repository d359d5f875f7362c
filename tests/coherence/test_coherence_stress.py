"""TieredCache's coherence guarantee under stress, and the checker that judges it.

The stress run (``djcachebench.bench.coherence_stress``; ``bench/coherence_stress.py``
runs it for longer) mixes writers through the tiered alias and directly through
the SQLite alias, in several processes of several threads, with a tiny L1 and a
generation table of 8 slots. Its verdict must be: no stale, wrong-key or phantom
read, and enough of every operation that it cannot pass vacuously.

The checker's rules are pinned first on hand-made histories, and a control run
with ``COHERENCE="none"`` must find stale reads, so a green stress run means
"no breach found", not "the checker cannot see one".
"""

from __future__ import annotations

import pytest

from djcachebench.bench.coherence_history import (
    ABSENT,
    CLEAR_KEY,
    Op,
    Verdict,
    check,
    int_value,
    str_value,
)
from djcachebench.bench.coherence_stress import StressConfig, report, run

MS = 1_000_000  # ns
WALL0 = 1_000_000.0  # wall seconds at t = 0


def op(kind: str, key: int, t0: float, t1: float, arg: object = None, res: object = None,
       alias: str = "tiered") -> Op:
    """An op from t0 to t1 ms; the wall clock runs with the monotonic one."""
    return Op(kind, key, alias, 0, int(t0 * MS), int(t1 * MS), WALL0 + t0 / 1000,
              WALL0 + t1 / 1000, arg, res)


def put(key: int, n: int, t0: float, t1: float, timeout: float | None = None) -> Op:
    value = int_value(key, 1, n) if key % 2 else str_value(key, 1, n)
    return op("set", key, t0, t1, arg=(value, timeout))


def value(o: Op) -> object:
    return o.arg[0]


def verdict(*ops: Op) -> Verdict:
    return check(list(ops))


def test_a_value_superseded_before_the_read_began_is_stale() -> None:
    a, b = put(0, 1, 0, 1), put(0, 2, 2, 3)
    assert verdict(a, b, op("get", 0, 4, 5, res=value(a))).counts["stale"] == 1
    assert verdict(a, b, op("get", 0, 4, 5, res=value(b))).breaches == 0


def test_a_write_not_yet_acknowledged_allows_the_older_value() -> None:
    a, b = put(0, 1, 0, 1), put(0, 2, 2, 10)
    assert verdict(a, b, op("get", 0, 4, 5, res=value(a))).breaches == 0
    # Overlapping writes have no order: either value may be read after both.
    c, d = put(0, 3, 0, 5), put(0, 4, 1, 6)
    assert verdict(c, d, op("get", 0, 7, 8, res=value(c))).breaches == 0


@pytest.mark.parametrize("found", [True, False], ids=["present", "absent"])
def test_an_acknowledged_delete_or_clear_ends_the_value(found: bool) -> None:
    a = put(0, 1, 0, 1)
    read = op("get", 0, 4, 5, res=value(a))
    assert verdict(a, op("delete", 0, 2, 3, res=found), read).counts["stale"] == 1
    assert verdict(a, op("clear", CLEAR_KEY, 2, 3, alias="l2"), read).counts["stale"] == 1
    assert verdict(a, op("delete", 0, 2, 6, res=found), read).breaches == 0


def test_a_value_read_after_its_expiry_is_stale_unless_touched() -> None:
    a = put(0, 1, 0, 1, timeout=0.5)
    late = op("get", 0, 700, 701, res=value(a))
    assert verdict(a, late).counts["stale"] == 1
    assert verdict(a, op("get", 0, 400, 401, res=value(a))).breaches == 0
    touch = op("touch", 0, 300, 301, arg=None, res=True)
    assert verdict(a, touch, late).breaches == 0


def test_incr_values_name_their_operation_and_keep_their_base_expiry() -> None:
    base = put(1, 1, 0, 1, timeout=0.5)
    first = op("incr", 1, 2, 3, arg=1, res=value(base) + 1)
    second = op("incr", 1, 4, 5, arg=1, res=value(base) + 2)
    assert verdict(base, first, second, op("get", 1, 6, 7, res=value(base) + 1)
                   ).counts["stale"] == 1
    assert verdict(base, first, second, op("get", 1, 6, 7, res=value(base) + 2)
                   ).breaches == 0
    assert verdict(base, first, op("get", 1, 600, 601, res=value(base) + 1)
                   ).counts["stale"] == 1


def test_absent_after_an_acknowledged_write_needs_a_removal_or_an_expiry() -> None:
    a = put(0, 1, 0, 1)
    miss = op("get", 0, 4, 5, res=None)
    assert verdict(a, miss).counts["stale"] == 1
    assert verdict(a, op("has_key", 0, 4, 5, res=False)).counts["stale"] == 1
    assert verdict(a, op("delete", 0, 3, 6, res=True), miss).breaches == 0
    assert verdict(a, op("incr", 0, 2, 3, arg=1, res=ABSENT), miss).breaches == 0
    short = put(0, 2, 0, 1, timeout=0.5)
    assert verdict(short, op("get", 0, 600, 601, res=None)).breaches == 0
    assert verdict(short, op("get", 0, 100, 101, res=None)).counts["stale"] == 1
    assert verdict(miss).breaches == 0  # never written


def test_another_keys_value_and_unwritten_values_are_flagged() -> None:
    a = put(2, 1, 0, 1)
    assert verdict(a, op("get", 0, 4, 5, res=value(a))).counts["wrong_key"] == 1
    assert verdict(op("get", 0, 4, 5, res=str_value(0, 9, 9))).counts["phantom"] == 1
    assert verdict(op("get", 0, 4, 5, res=b"junk")).counts["phantom"] == 1
    late = put(0, 1, 6, 7)
    assert verdict(late, op("get", 0, 4, 5, res=value(late))).counts["phantom"] == 1


def test_an_observed_absence_is_reported_apart_from_breaches() -> None:
    a = put(0, 1, 0, 1)
    seen = op("touch", 0, 2, 3, arg=None, res=False)  # a delete committed, not acknowledged
    v = verdict(a, seen, op("delete", 0, 1.5, 9, res=True), op("get", 0, 4, 5, res=value(a)))
    assert v.counts["regressed"] == 1 and v.breaches == 0


@pytest.mark.slow
def test_no_stale_read_under_stress(tmp_path: object) -> None:
    result = run(StressConfig(seconds=10, procs=3, threads=2), workdir=str(tmp_path))
    text = report(result)
    v = result.verdict
    assert result.give_ups == 0, text  # else a silently failed write could fool the checker
    assert v.breaches == 0, text
    # Not vacuous: enough reads, every operation kind through both aliases,
    # deletes of present and absent keys, expiring values, L1 hits and invalidations.
    assert v.reads >= 5_000 and v.value_reads >= 2_000 and v.absent_reads >= 500, text
    for kind in ("set", "delete", "incr", "touch", "clear"):
        for alias in ("tiered", "l2"):
            n = sum(c for (k, a, _), c in result.ops.items() if (k, a) == (kind, alias))
            assert n >= (1 if kind == "clear" else 50), (kind, alias, text)
    for outcome in ("true", "false"):
        assert result.ops["delete", "tiered", outcome] + result.ops[
            "delete", "l2", outcome] >= 20, text
    assert result.ops["set", "tiered", "short"] + result.ops["set", "l2", "short"] >= 100, text
    assert v.absences_by_expiry >= 10, text
    assert result.tiered_stats["l1_hits"] >= 1_000, text
    assert result.tiered_stats["invalidations"] >= 100, text
    assert result.table_bytes < 1 << 20, f"GENERATION_SLOTS did not apply\n{text}"


@pytest.mark.slow
def test_the_stress_run_finds_stale_reads_without_coherence(tmp_path: object) -> None:
    """The control: with ``COHERENCE="none"`` L1s serve other processes' old values,
    and the same run must say so (the whole chain, logs to verdict, can see a breach)."""
    result = run(StressConfig(seconds=3, procs=2, threads=2, coherence="none"),
                 workdir=str(tmp_path))
    v = result.verdict
    assert v.counts["stale"] >= 100, report(result)
    assert v.counts["wrong_key"] == 0 and v.counts["phantom"] == 0, report(result)
    assert v.by_alias["stale", "l2"] == 0, report(result)  # direct L2 reads are never stale


@pytest.mark.slow
def test_no_stale_read_while_a_redis_l2_is_stopped_and_continued(tmp_path: object) -> None:
    """The L2 a redis-server stopped for 2 s every 2 s, under the tiered alias's circuit
    breaker: calls fail (at once, once it is open) and none of them is
    acknowledged, and no read returns a value older than an acknowledged write."""
    result = run(StressConfig(seconds=8, procs=3, threads=2, redis_outage_every=2.0),
                 workdir=str(tmp_path))
    text = report(result)
    v = result.verdict
    assert v.breaches == 0, text
    assert v.reads >= 1_000, text
    assert result.tiered_stats["breaker_opened"] >= 1, text
    assert sum(c for (_, _, outcome), c in result.ops.items() if outcome == "error") >= 10, text


@pytest.mark.slow
def test_the_redis_outage_run_finds_stale_reads_without_coherence(tmp_path: object) -> None:
    """The control of the run above: the checker sees breaches in its redis mode."""
    result = run(StressConfig(seconds=3, procs=2, threads=2, coherence="none",
                              redis_outage_every=1000.0), workdir=str(tmp_path))
    assert result.verdict.counts["stale"] >= 50, report(result)
