"""Values: what a Django project stores, how big, built before anything is timed.

What a cache costs depends on what goes in it: a backend that pickles pays
for a dict's structure, not only its bytes, and a 60 KB page or a 5 MB blob
moves through SQLite, a socket or a file differently than 200 random bytes.
So the kind of value is part of the scenario:

``bytes``  random bytes (the reference scenario's values)
``str``    HTML-like text: a page or fragment from ``{% cache %}`` or the
           per-view cache; its size is in characters (a few words are
           accented, so its UTF-8 form is slightly longer)
``dict``   a JSON-like API response (nested dicts, lists, strings, numbers,
           booleans, None); its size is the length of ``json.dumps`` of it
``rows``   a queryset-like list of dicts, as ``.values()`` gives them, with
           ``datetime`` and ``Decimal`` fields; its size is the length of
           ``json.dumps(rows, default=str)``
``int``    a counter (the size is ignored)

Sizes follow a distribution: ``uniform`` between ``lo`` and ``hi``,
``log-uniform`` (equally many values in each decade: the sensible choice when
the range spans orders of magnitude, where a uniform draw would put nearly all
values in the top decade), or ``fixed`` (``lo == hi``). ``dict``/``rows`` hit
their size to within one record (a few hundred bytes).

**Pools.** A scenario with a million keys or 10 MB values cannot hold a
distinct value per operation. Sets therefore draw from a pool built once per
process before the start barrier, from ``Random(f"values-{seed}")`` (the same
pool in every worker). The pool's sizes are the distribution's quantiles at
``(i + 0.5) / count``, so even a 16-value pool of large values follows the
distribution evenly; its count is set by a memory budget (:data:`POOL_BYTES`)
unless the scenario fixes it. Pool size 0 means a fresh value drawn for every
set, which is what the reference scenario always did (kept call for call).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import math
import re
from collections.abc import Callable
from decimal import Decimal
from random import Random
from typing import Any

KINDS: tuple[str, ...] = ("bytes", "str", "dict", "int", "rows")
SIZE_DISTS: tuple[str, ...] = ("uniform", "log-uniform", "fixed")

#: The largest value a scenario may ask for: 512 MiB. Larger values are no cache
#: workload (Django's backends and servers refuse far less: memcached 1 MB,
#: redis 512 MB), and a size past the int64 range ended in an OverflowError
#: inside a worker instead of a usage error.
MAX_VALUE_SIZE = 512 * 1024 * 1024

#: Memory a pool may take per process, and the bounds on its number of values.
POOL_BYTES = 32 * 1024 * 1024
POOL_MIN, POOL_MAX = 16, 256

_VOCABULARY = (
    "the of and to in is for on with as by at from that this are be or an it your "
    "about more news page home blog post article comment user account search contact "
    "privacy terms price cart checkout product order shipping review rating share "
    "django python cache server request response template view model query database "
    "field form admin static media image video photo gallery event calendar city "
    "travel food music sport health science culture business market report data "
    "update latest popular featured recommended related category tag archive author "
    "café résumé naïve über déjà crème jalapeño façade"
)
_WORDS = tuple(_VOCABULARY.split())
_EPOCH = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)


class SizeError(ValueError):
    """A size or size range that cannot be parsed."""


def parse_size(text: str) -> int:
    """``"100"``, ``"10k"``/``"10KB"`` (x1000), ``"64KiB"`` (x1024), ``"10M"``, ``"1_000"``."""
    match = re.fullmatch(r"\s*([0-9][0-9_,]*(?:\.[0-9]+)?)\s*([kmg]?)(i?)b?\s*", text, re.I)
    if not match:
        raise SizeError(f"not a size: {text!r} (e.g. 100, 10k, 64KiB, 10M)")
    number = float(match.group(1).replace("_", "").replace(",", ""))
    base = 1024 if match.group(3) else 1000
    power = " kmg".index(match.group(2).lower() or " ")
    value = round(number * base**power)
    if value < 1:
        raise SizeError(f"a size must be >= 1 byte, got {text!r}")
    if value > MAX_VALUE_SIZE:
        raise SizeError(f"a size must be <= 512MiB ({MAX_VALUE_SIZE:,} bytes), got {text!r}")
    return value


def parse_size_range(text: str) -> tuple[int, int]:
    """``"N"`` (a fixed size) or ``"MIN-MAX"``, each part as :func:`parse_size` reads it."""
    parts = text.split("-")
    if len(parts) == 1:
        size = parse_size(parts[0])
        return size, size
    if len(parts) == 2:
        lo, hi = parse_size(parts[0]), parse_size(parts[1])
        if hi < lo:
            raise SizeError(f"size range {text!r}: maximum below minimum")
        return lo, hi
    raise SizeError(f"not a size or size range: {text!r} (e.g. 100 or 1k-10k)")


def draw_size(rng: Random, dist: str, lo: int, hi: int) -> int:
    """One size from the distribution (``uniform`` is ``rng.randint``, as the reference)."""
    if dist == "uniform":
        return rng.randint(lo, hi)
    if dist == "log-uniform":
        return min(hi, max(lo, round(math.exp(rng.uniform(math.log(lo), math.log(hi))))))
    return hi


def size_quantile(dist: str, lo: int, hi: int, p: float) -> int:
    """The size at quantile ``p`` in [0, 1] of the distribution."""
    if dist == "uniform":
        return min(hi, lo + int(p * (hi - lo + 1)))
    if dist == "log-uniform":
        return min(hi, max(lo, round(lo * (hi / lo) ** p)))
    return hi


def mean_size(dist: str, lo: int, hi: int) -> float:
    """The distribution's mean, which sets how many values a pool can afford."""
    if dist == "uniform":
        return (lo + hi) / 2
    if dist == "log-uniform" and hi > lo:
        return (hi - lo) / math.log(hi / lo)
    return float(hi)


def mean_value_size(kind: str, dist: str, lo: int, hi: int) -> float:
    """What one value of the kind weighs on average (an int counter: 16 bytes)."""
    return 16.0 if kind == "int" else mean_size(dist, lo, hi)


def pool_count(kind: str, dist: str, lo: int, hi: int, pool: int | None) -> int:
    """Distinct values per process: ``pool`` when given, else as many as POOL_BYTES allows."""
    if pool is not None:
        return pool
    per_value = mean_value_size(kind, dist, lo, hi)
    return int(max(POOL_MIN, min(POOL_MAX, POOL_BYTES // max(per_value, 1.0))))


def make_value(kind: str, size: int, rng: Random) -> Any:
    """One value of ``kind`` and about ``size`` (see the module doc for each kind's measure)."""
    if kind == "bytes":
        return rng.randbytes(size)
    if kind == "str":
        return html_page(size, rng)
    if kind == "dict":
        return api_response(size, rng)
    if kind == "rows":
        return query_rows(size, rng)
    if kind == "int":
        return rng.randrange(1000)
    raise ValueError(f"unknown value kind {kind!r}; known: {KINDS}")


@functools.lru_cache(maxsize=2)
def build_pool(kind: str, dist: str, lo: int, hi: int, count: int, seed: int) -> tuple[Any, ...]:
    """``count`` values at the distribution's evenly spaced quantiles (deterministic).

    Cached: worker 0 uses the same pool for its pre-fill and its op list.
    """
    rng = Random(f"values-{seed}")
    return tuple(make_value(kind, size_quantile(dist, lo, hi, (i + 0.5) / count), rng)
                 for i in range(count))  # fmt: skip


def value_source(
    kind: str, dist: str, lo: int, hi: int, pool: int | None, seed: int
) -> Callable[[Random], Any]:
    """``rng -> value`` for the sets of one process: a pool pick, or a fresh value."""
    count = pool_count(kind, dist, lo, hi, pool)
    if count == 0:
        return lambda rng: make_value(kind, draw_size(rng, dist, lo, hi), rng)
    values = build_pool(kind, dist, lo, hi, count, seed)
    return lambda rng: values[rng.randrange(count)]


def value_size(value: Any) -> int:
    """The size a value counts as (the measure :func:`make_value` aims at)."""
    if isinstance(value, bytes | str):
        return len(value)
    if isinstance(value, int):
        return 8
    return len(json.dumps(value, default=str))


# -- the kinds ------------------------------------------------------------------


def _words(rng: Random, low: int, high: int) -> str:
    return " ".join(rng.choices(_WORDS, k=rng.randint(low, high)))


def html_page(size: int, rng: Random) -> str:
    """An HTML document of exactly ``size`` characters (cut inside its last block)."""
    head = (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_words(rng, 3, 8).title()}</title></head>\n"
        f'<body><main class="content">\n'
    )
    tail = "</main></body></html>\n"
    room = size - len(head) - len(tail)
    if room <= 0:
        return (head + tail)[:size]
    parts: list[str] = []
    length = 0
    while length < room:
        n = rng.randrange(100_000)
        block = (
            f'<article class="post" id="post-{n}"><h2><a href="/posts/{n}/">'
            f"{_words(rng, 3, 9).title()}</a></h2>\n<p>{_words(rng, 25, 90)}.</p>\n"
            f'<p class="meta">{rng.randint(1, 500)} comments · '
            f'<a href="/tags/{rng.choice(_WORDS)}/">{rng.choice(_WORDS)}</a></p></article>\n'
        )
        parts.append(block)
        length += len(block)
    return head + "".join(parts)[:room] + tail


def _timestamp(rng: Random) -> dt.datetime:
    return _EPOCH + dt.timedelta(seconds=rng.randrange(200_000_000))


def _record(rng: Random) -> dict[str, Any]:
    n = rng.randrange(1_000_000)
    return {
        "id": n,
        "uuid": f"{rng.getrandbits(128):032x}",
        "name": _words(rng, 2, 5).title(),
        "slug": _words(rng, 2, 5).replace(" ", "-"),
        "price": f"{rng.randrange(100, 100_000) / 100:.2f}",
        "currency": rng.choice(("EUR", "USD", "GBP")),
        "in_stock": rng.random() < 0.8,
        "rating": round(rng.uniform(1, 5), 1),
        "tags": rng.sample(_WORDS, rng.randint(0, 5)),
        "created_at": _timestamp(rng).isoformat().replace("+00:00", "Z"),
        "owner": {"id": rng.randrange(10_000), "username": rng.choice(_WORDS) + str(n % 97)},
        "discount": None if rng.random() < 0.7 else rng.randrange(5, 50),
    }


def api_response(size: int, rng: Random) -> dict[str, Any]:
    """A paginated API response (REST-framework style) of about ``size`` JSON bytes."""
    page = rng.randint(1, 50)
    response: dict[str, Any] = {
        "count": rng.randrange(1_000, 100_000),
        "next": f"https://api.example.com/v1/items/?page={page + 1}",
        "previous": f"https://api.example.com/v1/items/?page={page - 1}" if page > 1 else None,
        "results": [],
    }
    length = len(json.dumps(response))
    while length < size:
        record = _record(rng)
        length += len(json.dumps(record)) + (2 if response["results"] else 0)
        response["results"].append(record)
    return response


def query_rows(size: int, rng: Random) -> list[dict[str, Any]]:
    """Rows as ``Model.objects.values()`` returns them, about ``size`` bytes as JSON."""
    rows: list[dict[str, Any]] = []
    length = 2
    while length < size:
        n = rng.randrange(1_000_000)
        row = {
            "id": n,
            "title": _words(rng, 3, 10).capitalize(),
            "slug": f"post-{n}",
            "author_id": rng.randrange(5_000),
            "status": rng.choice(("draft", "published", "archived")),
            "published_at": _timestamp(rng),
            "updated_at": _timestamp(rng),
            "views": rng.randrange(1_000_000),
            "price": Decimal(rng.randrange(100, 100_000)) / 100,
            "is_featured": rng.random() < 0.1,
        }
        length += len(json.dumps(row, default=str)) + (2 if rows else 0)
        rows.append(row)
    return rows
