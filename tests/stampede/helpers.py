"""Reading and planting the stampede code's side keys (leases, early-refresh notes)
where it keeps them: ``side_key``'s key at its own version."""

from __future__ import annotations

from typing import Any

from djcachebench.stampede import side_key


def side_get(cache: Any, prefix: str, key: str) -> Any:
    side, version = side_key(cache, prefix, key)
    return cache.get(side, version=version)


def side_add(cache: Any, prefix: str, key: str, value: Any, timeout: int) -> bool:
    side, version = side_key(cache, prefix, key)
    return bool(cache.add(side, value, timeout, version=version))
