"""Worker processes of tests/tiered/test_tiered_breaker.py (spawned, with their own Django)."""

from __future__ import annotations

from typing import Any


def _cache(options: dict[str, Any]) -> Any:
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            SECRET_KEY="breaker-tests-not-secret-0123456789",
            CACHES={"default": {"BACKEND": "djcachebench.backends.tiered.TieredCache",
                                "OPTIONS": options}},
        )
        django.setup()
    from django.core.cache import cache

    return cache


def first_miss(options: dict[str, Any], key: str, out: Any) -> None:
    """One read of an absent key: what it raised, and this process's counters."""
    cache = _cache(options)
    try:
        cache.get(key)
        raised = None
    except Exception as exc:
        raised = type(exc).__name__
    out.put((raised, cache.stats()))


def read(options: dict[str, Any], key: str, out: Any) -> None:
    """One read of ``key`` from a process of its own."""
    out.put(_cache(options).get(key))
