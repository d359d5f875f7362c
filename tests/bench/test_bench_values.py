"""Value kinds, size distributions, pools and key popularity: deterministic, shaped right."""

from __future__ import annotations

import datetime as dt
import json
import math
from collections import Counter
from decimal import Decimal
from random import Random

import pytest

from djcachebench.bench import keys, values
from djcachebench.bench.values import (
    KINDS,
    POOL_BYTES,
    SizeError,
    build_pool,
    make_value,
    parse_size,
    parse_size_range,
    pool_count,
    value_size,
    value_source,
)


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_is_deterministic_for_a_seed(kind: str) -> None:
    one = [make_value(kind, 2_000, Random(5)) for _ in range(3)]
    assert one == [make_value(kind, 2_000, Random(5)) for _ in range(3)]
    assert make_value(kind, 2_000, Random(5)) != make_value(kind, 2_000, Random(6))
    pool = build_pool(kind, "uniform", 100, 5_000, 20, 3)
    assert pool == build_pool.__wrapped__(kind, "uniform", 100, 5_000, 20, 3)  # not the cache
    assert pool != build_pool.__wrapped__(kind, "uniform", 100, 5_000, 20, 4)
    draw = value_source(kind, "uniform", 100, 5_000, 20, 3)
    rng_a, rng_b = Random(1), Random(1)
    assert [draw(rng_a) for _ in range(50)] == [draw(rng_b) for _ in range(50)]


def test_each_kind_has_its_shape_and_size() -> None:
    rng = Random(0)
    blob = make_value("bytes", 1_234, rng)
    assert isinstance(blob, bytes) and len(blob) == 1_234
    page = make_value("str", 60_000, rng)
    assert isinstance(page, str) and len(page) == 60_000
    assert page.startswith("<!DOCTYPE html>") and page.endswith("</html>\n")
    assert any(ord(c) > 127 for c in page)  # not an ASCII-only fast path
    api = make_value("dict", 10_000, rng)
    assert set(api) == {"count", "next", "previous", "results"}
    assert isinstance(api["results"][0]["owner"], dict)
    assert 10_000 <= len(json.dumps(api)) < 10_000 + 600  # within one record
    rows = make_value("rows", 10_000, rng)
    assert isinstance(rows, list) and isinstance(rows[0], dict)
    assert isinstance(rows[0]["published_at"], dt.datetime)
    assert isinstance(rows[0]["price"], Decimal)
    assert 10_000 <= value_size(rows) < 10_000 + 600
    counter = make_value("int", 10_000, rng)
    assert isinstance(counter, int) and 0 <= counter < 1000
    assert len(make_value("str", 50, rng)) == 50  # smaller than the page's frame


@pytest.mark.parametrize("dist", ["uniform", "log-uniform"])
def test_pool_sizes_follow_the_distribution(dist: str) -> None:
    lo, hi = 100_000, 10_000_000
    count = pool_count("bytes", dist, lo, hi, None)
    pool = build_pool("bytes", dist, lo, hi, count, 0)
    sizes = sorted(len(v) for v in pool)
    assert len(pool) == count == values.POOL_MIN  # the memory budget allows only the minimum
    assert lo <= sizes[0] and sizes[-1] <= hi
    # The budget, or the minimum count when even that is over it (uniform: 16 x 5 MB).
    budget = max(POOL_BYTES, values.POOL_MIN * values.mean_size(dist, lo, hi))
    assert sum(sizes) <= budget * 1.05
    if dist == "log-uniform":  # as many in each decade, median near the geometric mean
        assert sum(s < 1_000_000 for s in sizes) == count // 2
        assert sizes[count // 2] == pytest.approx(math.sqrt(lo * hi), rel=0.2)
    else:
        assert sizes[count // 2] == pytest.approx((lo + hi) / 2, rel=0.1)


def test_pool_counts_and_a_fresh_value_per_set() -> None:
    assert pool_count("bytes", "uniform", 1, 495, None) == values.POOL_MAX
    assert pool_count("str", "uniform", 150_000, 250_000, None) == POOL_BYTES // 200_000
    assert pool_count("bytes", "fixed", 10, 10, 7) == 7
    # Pool size 0: the reference's fresh value per set, rng.randbytes(rng.randint(lo, hi)).
    draw = value_source("bytes", "uniform", 1, 495, 0, 0)
    legacy = Random(9)
    expected = [legacy.randbytes(legacy.randint(1, 495)) for _ in range(20)]
    rng = Random(9)
    assert [draw(rng) for _ in range(20)] == expected


def test_sizes_parse() -> None:
    assert parse_size("100") == 100
    assert parse_size("10k") == parse_size("10KB") == 10_000
    assert parse_size("64KiB") == 65_536
    assert parse_size("10M") == 10_000_000
    assert parse_size("1_000") == 1_000
    assert parse_size_range("10k") == (10_000, 10_000)
    assert parse_size_range("1k-64KiB") == (1_000, 65_536)
    for bad in ("", "ten", "0", "5-1", "1-2-3"):
        with pytest.raises(SizeError):
            parse_size_range(bad)


@pytest.mark.parametrize("popularity", ["uniform", "zipf"])
def test_key_draws_are_deterministic_for_a_seed(popularity: str) -> None:
    draw = keys.sampler(1_000, popularity, 1.0)

    def indexes(seed: int) -> list[int]:
        rng = Random(seed)
        return [draw(rng) for _ in range(500)]

    assert indexes(3) == indexes(3)
    assert indexes(3) != indexes(4)
    assert all(0 <= i < 1_000 for i in indexes(3))


@pytest.mark.parametrize("s", [1.0, 1.5])
def test_zipf_frequencies(s: float) -> None:
    n, draws = 1_000, 200_000
    draw = keys.sampler(n, "zipf", s)
    rng = Random(0)
    counts = Counter(draw(rng) for _ in range(draws))
    ranked = [index for index, _ in counts.most_common(3)]
    assert ranked == [0, 1, 2]  # rank 1 (key 0) most frequent, then 2, then 3
    for k in (2, 3, 5, 10):
        # frequency(rank 1) / frequency(rank k) is about k**s
        assert counts[0] / counts[k - 1] == pytest.approx(k**s, rel=0.1)
    assert counts[0] / draws == pytest.approx(keys.zipf_probability(n, s, 1), rel=0.02)


def test_zipf_table_for_a_million_keys() -> None:
    table = keys.zipf_cumulative(1_000_000, 1.0)
    assert len(table) == 1_000_000 and table.itemsize == 8  # 8 MB
    # H(1,000,000) = ln(1e6) + Euler-Mascheroni + 1/(2n) ...
    assert table[-1] == pytest.approx(math.log(1e6) + 0.5772156649, rel=1e-6)
    draw = keys.sampler(1_000_000, "zipf", 1.0)
    rng = Random(1)
    picks = [draw(rng) for _ in range(20_000)]
    assert max(picks) < 1_000_000 and min(picks) == 0
    assert len(set(picks)) > 5_000  # the long tail is drawn too


def test_prefill_order() -> None:
    assert list(keys.prefill_order(5, "uniform")) == [0, 1, 2, 3, 4]
    assert list(keys.prefill_order(5, "zipf")) == [4, 3, 2, 1, 0]  # popular ones last
    assert list(keys.prefill_order(1_000_000, "zipf", limit=3)) == [2, 1, 0]
    assert list(keys.prefill_order(3, "uniform", limit=10)) == [0, 1, 2]


def test_key_types() -> None:
    assert keys.key_maker("p:", "str")(7) == "p:7"
    assert keys.key_maker("", "bytes")(7) == b"7"
    with pytest.raises(ValueError, match="unknown key type"):
        keys.key_maker("", "int")
