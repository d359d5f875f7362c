"""Keys: how they are spelled and how popular each one is.

Popularity decides the hit rate and the contention a backend sees, so it is
part of the workload, not an accident of the generator:

* ``uniform``: every key equally likely, one ``rng.randrange(n)`` per op (the
  reference scenario's draw, kept call for call so its op lists never change).
* ``zipf``: the key of rank ``k`` (1-based) has weight ``1 / k**s``, the shape
  of page and object popularity on real sites. Sampled by inverse CDF: the
  cumulative weights of all ``n`` keys are computed once per ``(n, s)`` into an
  ``array('d')`` (8 bytes a key: 8 MB for 1,000,000 keys), then each op costs
  one ``rng.random()`` and one ``bisect`` (O(log n)). The table is built in
  :func:`~djcachebench.bench.workload.generate_ops`, before the start barrier,
  so it is never timed, and the draw depends on nothing but the worker's RNG,
  so it is deterministic for a seed.

Rank ``k`` is the key of index ``k - 1``: key ``0`` is the most popular one.
Keys are ``str`` (what Django code passes) or ``bytes`` (the reference
scenario's, after python-diskcache's benchmark).
"""

from __future__ import annotations

import functools
import itertools
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterator
from random import Random

POPULARITIES: tuple[str, ...] = ("uniform", "zipf")
KEY_TYPES: tuple[str, ...] = ("str", "bytes")

Key = str | bytes


def key_maker(prefix: str, key_type: str) -> Callable[[int], Key]:
    """``index -> key``: ``f"{prefix}{index}"``, encoded when ``key_type`` is bytes."""
    if key_type == "bytes":
        return lambda index: f"{prefix}{index}".encode()
    if key_type == "str":
        return lambda index: f"{prefix}{index}"
    raise ValueError(f"unknown key type {key_type!r}; known: {KEY_TYPES}")


@functools.lru_cache(maxsize=4)
def zipf_cumulative(n: int, s: float) -> array[float]:
    """Cumulative Zipf weights ``sum(1/j**s for j <= k)`` for k = 1..n (cached per process)."""
    if n < 1:
        raise ValueError(f"zipf needs at least one key, got {n}")
    if not s > 0:
        raise ValueError(f"zipf exponent s must be > 0, got {s}")
    return array("d", itertools.accumulate(k**-s for k in range(1, n + 1)))


def zipf_probability(n: int, s: float, rank: int) -> float:
    """The probability of the key of 1-based ``rank`` (for tests and docs)."""
    cumulative = zipf_cumulative(n, s)
    return rank**-s / cumulative[-1]


def sampler(n: int, popularity: str, s: float = 1.0) -> Callable[[Random], int]:
    """A function drawing one key index in ``[0, n)`` from the given RNG."""
    if popularity == "uniform":
        return lambda rng: rng.randrange(n)
    if popularity == "zipf":
        cumulative = zipf_cumulative(n, s)
        total = cumulative[-1]
        last = n - 1

        def draw(rng: Random) -> int:
            # rng.random() < 1, but the product may round up to total: clamp.
            return min(bisect_right(cumulative, rng.random() * total), last)

        return draw
    raise ValueError(f"unknown key popularity {popularity!r}; known: {POPULARITIES}")


def prefill_order(n: int, popularity: str, limit: int | None = None) -> Iterator[int]:
    """The key indexes a pre-fill writes, in writing order.

    With a ``limit`` only the ``limit`` most popular keys are written (the
    worker passes twice a cache's ``MAX_ENTRIES``: writing a million keys into
    a 1,000-key cache would only measure its culling). Zipf keys go least
    popular first,
    so a cache that evicts the oldest entries (memcached's LRU) keeps the
    popular ones; uniform keys go in index order, as the reference always did.
    """
    count = n if limit is None else min(n, limit)
    if popularity == "zipf":
        return iter(range(count - 1, -1, -1))
    return iter(range(count))
