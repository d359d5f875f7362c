"""The one percentile function (nearest rank) and the exact merge."""

from __future__ import annotations

import random
from array import array

import pytest

from djcachebench.bench.stats import ActionStats, format_ns, merge_samples, percentile


def test_nearest_rank_on_known_data() -> None:
    data = list(range(1, 101))  # 1..100
    assert percentile(data, 50) == 50
    assert percentile(data, 90) == 90
    assert percentile(data, 99) == 99
    assert percentile(data, 99.9) == 100
    assert percentile(data, 100) == 100
    assert percentile(data, 0.5) == 1


def test_nearest_rank_is_exact_where_floats_are_not() -> None:
    # 99.9 / 100 * 1000 is 999.0000000000001 in floats: a naive ceil gives rank 1000.
    data = list(range(1, 1001))
    assert percentile(data, 99.9) == 999
    # The textbook example (Wikipedia, "Percentile", nearest-rank method).
    sample = [15, 20, 35, 40, 50]
    assert [percentile(sample, q) for q in (5, 30, 40, 50, 100)] == [15, 20, 20, 35, 50]


def test_one_sample_and_bad_input() -> None:
    assert percentile([7], 50) == percentile([7], 99.9) == 7
    with pytest.raises(ValueError, match="no samples"):
        percentile([], 50)
    with pytest.raises(ValueError, match=r"\(0, 100\]"):
        percentile([1, 2], 0)
    with pytest.raises(ValueError, match=r"\(0, 100\]"):
        percentile([1, 2], 101)


def test_merge_is_exact_not_an_average_of_percentiles() -> None:
    fast = array("q", [1] * 99 + [2])
    slow = array("q", [1000] * 100)
    merged = merge_samples([fast, slow])
    assert len(merged) == 200 and merged == sorted(merged)
    stats = ActionStats.from_samples(merged, miss=3, presorted=True)
    assert stats.p50 == 2  # rank 100 of 200
    assert stats.p90 == 1000
    assert stats.max == 1000
    assert stats.total == 99 + 2 + 100_000
    # Averaging the two workers' medians would have said 500.5.


def test_action_stats_from_unsorted_samples_and_json_round_trip() -> None:
    rng = random.Random(1)
    samples = [rng.randrange(1, 10_000) for _ in range(10_001)]
    stats = ActionStats.from_samples(samples, miss=12, errors=0)
    ordered = sorted(samples)
    assert stats.count == 10_001 and stats.miss == 12
    assert stats.p50 == ordered[5_000]
    assert stats.p999 == percentile(ordered, 99.9)
    assert ActionStats.from_dict(stats.to_dict()) == stats
    assert set(stats.to_dict()) >= {"p50_ns", "p90_ns", "p99_ns", "p99_9_ns", "max_ns", "total_ns"}
    assert ActionStats.from_samples([], miss=0).count == 0


def test_format_ns() -> None:
    assert format_ns(812) == "812ns"
    assert format_ns(12_345) == "12.3µs"
    assert format_ns(123_456) == "123µs"
    assert format_ns(4_560_000) == "4.56ms"
    assert format_ns(1_230_000_000) == "1.23s"
    assert format_ns(1_090_000_000_000) == "1,090s"
