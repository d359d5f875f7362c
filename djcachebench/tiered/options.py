"""The OPTIONS a TieredCache alias may set: one declarative table, each option
with its default, what is allowed and what it does.

Why apart from ``config.py``: the table is read on its own (the benchmark
harness reads ``STAMPEDE_LEASE``'s default from it, the one place it is
defined), while ``config.py`` is how the tiered alias's settings and its L2's
combine. Parsing is ``djcachebench.conf``'s, the one option parser.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from djcachebench.conf import (
    LEGACY_KEYS,
    Option,
    OptionTable,
    choice,
    file_path,
    integer,
    number,
    optional,
    string,
)
from djcachebench.stampede import EARLY_REFRESH_ALLOWED

__all__ = ["INLINE_KEYS", "KEY_PARAMS", "OPTIONS", "PASS_THROUGH_OPTIONS",
           "PASS_THROUGH_PARAMS", "REQUIRED"]

KEY_PARAMS = ("KEY_PREFIX", "VERSION", "KEY_FUNCTION")
PASS_THROUGH_PARAMS = (*KEY_PARAMS, "TIMEOUT")
PASS_THROUGH_OPTIONS = ("MAX_ENTRIES", "CULL_FREQUENCY")
INLINE_KEYS = frozenset({"BACKEND", "LOCATION", "OPTIONS", *PASS_THROUGH_PARAMS,
                         *LEGACY_KEYS.values()})

#: ``L2``'s default: there is none, ``config.read_config`` says it is required.
REQUIRED: Any = object()


def _l2_spec(value: Any) -> str | dict[str, Any]:
    if isinstance(value, str) and value:
        return value
    if (
        isinstance(value, Mapping)
        and isinstance(value.get("BACKEND"), str)
        and set(value) <= INLINE_KEYS
        and isinstance(value.get("OPTIONS", {}), Mapping)
    ):
        return dict(value)
    raise TypeError("not an alias or a backend dict")


def _passed(value: Any) -> Any:
    return value  # validated by the inline L2 itself


OPTIONS = OptionTable()
OPTIONS.add(Option(
    "L2", REQUIRED,
    "the name of another alias of CACHES, or a dict with 'BACKEND' and optionally "
    "'LOCATION', 'OPTIONS', 'TIMEOUT', 'KEY_PREFIX', 'VERSION', 'KEY_FUNCTION' "
    "(and Django's legacy 'timeout', 'max_entries', 'cull_frequency')",
    _l2_spec, doc="The cache behind the L1: every write goes there first.",
))
OPTIONS.add(Option(
    "L1_MAX_ENTRIES", 10_000, "an integer >= 0 (0 disables the L1)", integer(0),
    doc="Entries kept in each process's L1; least recently used go first.",
))
OPTIONS.add(Option(
    "L1_MAX_BYTES", 64 * 1024 * 1024, "an integer >= 0, or None for no byte bound",
    optional(integer(0)), doc="Approximate bytes of keys and values in each process's L1.",
))
OPTIONS.add(Option(
    "L1_TIMEOUT", 60.0, "a number of seconds > 0, or None for no cap",
    optional(number(0.0, lo_open=True)),
    doc="Longest life of an L1 entry; the L2 expiry caps it further.",
))
OPTIONS.add(Option(
    "COHERENCE", "host", "'host' or 'none' (one host), or 'cluster' (across hosts)",
    choice("host", "cluster", "none"),
    doc="'host': every process of the host sees every completed write. "
    "'cluster': every process of every host that shares COHERENCE_URL, within the "
    "propagation bound. 'none': L1 freshness by L1_TIMEOUT only.",
))
OPTIONS.add(Option(
    "COHERENCE_URL", None,
    "a redis:// URL, or None for the L2's own redis (Django's RedisCache or django-redis)",
    optional(string),
    doc="With COHERENCE='cluster': the redis whose pub/sub carries invalidations between hosts.",
))
OPTIONS.add(Option(
    "STRICT_LEASE", None,
    "a number of seconds from 0.05 to 3600, or None (writes are not strict)",
    optional(number(0.05, 3600.0)),
    doc="With COHERENCE='cluster': every write returns only once every host holding a "
    "lease applied it; a host that stops answering is excluded when its lease (this "
    "long) expires, after it stopped serving L1 hits.",
))
OPTIONS.add(Option(
    "SHARED_VALUE_BYTES", 512, "an integer from 0 to 65000 (0 turns the value board off)",
    integer(0, 65000),
    doc="Largest plain value (bytes, str, number) a writer publishes to the other "
    "processes on the value board, so they need not refill from the L2.",
))
OPTIONS.add(Option(
    "GENERATION_PATH", None,
    "a file path (made absolute at start-up), or None for a default derived from the L2",
    optional(file_path), doc="Generation table file for an L2 that does not keep its own.",
))
OPTIONS.add(Option(
    "GENERATION_SLOTS", 1 << 16, "an integer between 1 and 2**32", integer(1, 1 << 32),
    doc="Slots of a generation table this alias creates.",
))
OPTIONS.add(Option(
    "STAMPEDE_LEASE", 10.0, "a number of seconds > 0 and at most 86400, or None to turn it off",
    optional(number(0.0, 86400.0, lo_open=True)),
    doc="get_or_set on a missing key: one caller computes, the others wait for its "
    "value up to this long each round (djcachebench.stampede).",
))
OPTIONS.add(Option(
    "EARLY_REFRESH", None, EARLY_REFRESH_ALLOWED, optional(number(0.0, lo_open=True)),
    doc="get_or_set on a hit may recompute the value before it expires, one caller "
    "at a time (XFetch; djcachebench.stampede).",
))
OPTIONS.add(Option(
    "BREAKER_THRESHOLD", 5, "an integer from 1 to 1000, or None to turn the breaker off",
    optional(integer(1, 1000)),
    doc="Consecutive failed L2 calls (a refused or timed-out connection) in a process "
    "after which calls that would reach the L2 fail at once, in every process of the "
    "host, until a probe finds it back (djcachebench.tiered.breaker).",
))
OPTIONS.add(Option(
    "BREAKER_COOLDOWN", 1.0, "a number of seconds from 0.01 to 3600",
    number(0.01, 3600.0),
    doc="How long the breaker stays open before one call on the host is let through "
    "to see whether the L2 is back.",
))
OPTIONS.add(Option(
    "SERVE_STALE", None, "a number of seconds from 0 to 86400, or None (off)",
    optional(number(0.0, 86400.0)),
    doc="While the breaker is open, an L1 copy may be served up to this long past its "
    "L1 expiry (never one a write has invalidated).",
))
for _name in PASS_THROUGH_OPTIONS:
    OPTIONS.add(Option(
        _name, None, "any value the inline L2 accepts (it validates it)", _passed,
        doc="Passed to an inline L2; an error with an L2 alias.",
    ))
