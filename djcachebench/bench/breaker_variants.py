"""``--breaker on,off``: every TieredCache target run with its circuit breaker and without.

Why variants of a target and not target files of their own: the question is
one target's behaviour with one option changed, in the same run, and
``backends/`` lists the compared backends (a default ``bench`` runs them all).

Both variants give the L2 a socket timeout (:data:`SOCKET_TIMEOUT`): without
one, a call to a stopped redis waits for as long as the server stays stopped
(forever, for one that never comes back), so the run without the breaker would
measure a client that never gives up rather than the breaker's absence. And
both keep L1 copies :data:`L1_SECONDS` only, so that reads must reach the L2
inside every outage window, as every copy of a longer-lived L1 does once an
outage outlasts it; with the breaker, ``SERVE_STALE`` serves those copies.

Targets that are not a TieredCache over an inline L2 run once, as they are.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from djcachebench.bench.targets import SERVER_KINDS, Target, TargetEnv

__all__ = ["BREAKER_MODES", "breaker_modes", "breaker_variants"]

TIERED = "djcachebench.backends.tiered.TieredCache"
#: Seconds a call to the L2's server may wait for it (connect and each answer).
SOCKET_TIMEOUT = 0.5
#: TieredCache's L1_TIMEOUT in both variants (see the module's docstring).
L1_SECONDS = 1
#: ``OPTIONS`` of the TieredCache per mode: the breaker as docs/settings.md
#: recommends it for a hung L2, or none.
BREAKER_MODES: dict[str, dict[str, Any]] = {
    "on": {"BREAKER_THRESHOLD": 3, "BREAKER_COOLDOWN": 1.0, "SERVE_STALE": 30},
    "off": {"BREAKER_THRESHOLD": None, "SERVE_STALE": None},
}
_SUFFIX = {"on": "breaker", "off": "no-breaker"}
#: What a target's ``caches`` is called with to see what it builds (no server runs).
_PROBE = TargetEnv(Path("/nonexistent"), {kind: "probe" for kind in SERVER_KINDS})

# The L2 clients whose socket timeout a variant knows how to set, in each one's
# own option names (redis-py's pool keywords under Django's RedisCache).
_TIMEOUTS: dict[str, Callable[[float], dict[str, float]]] = {
    "django_redis.cache.RedisCache": lambda s: {"SOCKET_TIMEOUT": s,
                                                "SOCKET_CONNECT_TIMEOUT": s},
    "django.core.cache.backends.redis.RedisCache": lambda s: {"socket_timeout": s,
                                                              "socket_connect_timeout": s},
}


def breaker_modes(text: str) -> list[str]:
    """``--breaker``: ``on``, ``off`` or both, comma-separated (argparse type)."""
    modes = list(dict.fromkeys(m.strip().lower() for m in text.split(",") if m.strip()))
    unknown = [m for m in modes if m not in BREAKER_MODES]
    if not modes or unknown:
        raise argparse.ArgumentTypeError(
            f"{text!r}: allowed: {', '.join(BREAKER_MODES)}, or both (on,off)")
    return modes


def _tiered_l2(entry: dict[str, Any]) -> dict[str, Any] | None:
    """The inline L2 of a TieredCache entry, or None when ``entry`` is no such thing."""
    if entry.get("BACKEND") != TIERED:
        return None
    l2 = entry.get("OPTIONS", {}).get("L2")
    return l2 if isinstance(l2, dict) else None


def with_breaker(entry: dict[str, Any], mode: str) -> dict[str, Any]:
    """A copy of a TieredCache ``CACHES`` entry set for ``mode``; ValueError when its
    L2 is not inline or has no socket timeout known here."""
    l2 = _tiered_l2(entry)
    if l2 is None:
        raise ValueError("not a TieredCache with an inline L2")
    timeouts = _TIMEOUTS.get(str(l2.get("BACKEND")))
    if timeouts is None:
        raise ValueError(f"its L2 {l2.get('BACKEND')} has no socket timeout this variant "
                         f"knows how to set (known: {', '.join(_TIMEOUTS)})")
    options = entry.get("OPTIONS", {})
    bounded = {**l2, "OPTIONS": {**l2.get("OPTIONS", {}), **timeouts(SOCKET_TIMEOUT)}}
    return {**entry, "OPTIONS": {**options, **BREAKER_MODES[mode], "L1_TIMEOUT": L1_SECONDS,
                                 "L2": bounded}}


def breaker_variant(target: Target, mode: str) -> Target:
    """``tiered-redis[breaker]`` / ``tiered-redis[no-breaker]``: ``target`` set for ``mode``.

    A TieredCache whose L2 this cannot bound gives a variant skipped with the
    reason, as a serializer variant is."""
    unsupported = target.unsupported
    try:
        with_breaker(target.caches(_PROBE), mode)
    except ValueError as exc:
        unsupported = unsupported or str(exc)
    caches = target.caches

    def configured(env: TargetEnv) -> dict[str, Any]:
        return with_breaker(caches(env), mode)

    state = "with" if mode == "on" else "without"
    return replace(target, name=f"{target.name}[{_SUFFIX[mode]}]",
                   description=f"{target.description}, {state} the circuit breaker",
                   caches=configured, unsupported=unsupported)


def breaker_variants(targets: list[Target], modes: list[str] | None) -> list[Target]:
    """Every TieredCache target once per mode (target by target); the others as they are."""
    if not modes:
        return targets
    out: list[Target] = []
    for target in targets:
        if _tiered_l2(target.caches(_PROBE)) is None:
            out.append(target)
        else:
            out += [breaker_variant(target, mode) for mode in modes]
    return out
