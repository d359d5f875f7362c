"""TieredCache's async API: an L1 hit is answered without a thread hop.

Django's ``BaseCache`` runs every async method as its sync twin through
``sync_to_async``, a thread hop that costs far more than an L1 hit. These
answer from the L1 first (the same token check as ``get``) and hop only for
what the L1 cannot answer. Writes keep Django's hop: they go to the L2 anyway
(one hop for a whole ``aset_many`` or ``adelete_many``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from asgiref.sync import sync_to_async
from django.core.cache.backends.base import DEFAULT_TIMEOUT

from djcachebench.abandon import run_abandonable
from djcachebench.tiered.state import ABSENT_HIT, MISS

__all__ = ["AsyncL1"]

_MISS = MISS
_ABSENT = ABSENT_HIT


class AsyncL1:
    """Mixed into TieredCache before ``BaseCache``; uses its ``_lookup``,
    ``_l1_has`` and ``_version``."""

    _version: Any

    def _lookup(self, key: Any, version: Any) -> tuple[Any, tuple | None]:
        raise NotImplementedError

    def _l1_has(self, key: Any, version: Any) -> bool | None:
        raise NotImplementedError

    async def aget(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        if version is None:
            version = self._version
        value, _ = self._lookup(key, version)
        if value is _ABSENT:
            return default
        if value is not _MISS:
            return value
        return await sync_to_async(self.get, thread_sensitive=True)(key, default, version)

    async def aget_many(self, keys: Iterable[Any], version: int | None = None) -> dict[Any, Any]:
        if version is None:
            version = self._version
        keys = list(keys)
        found: dict[Any, Any] = {}
        rest = []
        named: dict[Any, tuple] = {}
        for key in keys:
            value, l1key = self._lookup(key, version)
            if named.setdefault(key, l1key) != l1key:  # 1 and 1.0: see get_many
                return await sync_to_async(self.get_many, thread_sensitive=True)(keys, version)
            if value is _MISS:
                rest.append(key)
            elif value is not _ABSENT:
                found[key] = value
        if not rest:
            return found  # L1 hits only: already in the order asked
        found.update(await sync_to_async(self.get_many, thread_sensitive=True)(rest, version))
        # In the order asked, as get_many answers (not the L1's hits first).
        return {key: found[key] for key in keys if key in found}

    async def ahas_key(self, key: Any, version: int | None = None) -> bool:
        if version is None:
            version = self._version
        known = self._l1_has(key, version)
        if known is not None:
            return known
        return await sync_to_async(self.has_key, thread_sensitive=True)(key, version)

    # set_many and delete_many return what the L2's do (the keys it failed to
    # write; django-redis's count): Django's defaults loop over aset and adelete
    # and return [] and None whatever the L2 said.

    async def aset_many(self, data: Any, timeout: Any = DEFAULT_TIMEOUT,
                        version: int | None = None) -> list[Any]:
        return await sync_to_async(self.set_many,  # type: ignore[attr-defined, no-any-return]
                                   thread_sensitive=True)(data, timeout, version)

    async def adelete_many(self, keys: Iterable[Any], version: int | None = None) -> Any:
        return await sync_to_async(self.delete_many,  # type: ignore[attr-defined]
                                   thread_sensitive=True)(keys, version)

    async def aincr(self, key: Any, delta: int = 1, version: int | None = None) -> Any:
        """As atomic as :meth:`incr` (Django's default reads, adds and sets)."""
        return await sync_to_async(self.incr, thread_sensitive=True)(key, delta, version)

    async def adecr(self, key: Any, delta: int = 1, version: int | None = None) -> Any:
        return await sync_to_async(self.decr, thread_sensitive=True)(key, delta, version)

    async def aget_or_set(self, key: Any, default: Any, timeout: Any = DEFAULT_TIMEOUT,
                          version: int | None = None) -> Any:
        value = await self.aget(key, _MISS, version)
        # A hit returns here unless early refresh may recompute it: that is
        # get_or_set's decision (returning every hit here, aget_or_set would
        # never refresh early).
        if value is not _MISS and (self._config.early_refresh is None or not callable(default)):
            return value
        return await run_abandonable(lambda: self.get_or_set(  # type: ignore[attr-defined]
            key, default, timeout, version))

