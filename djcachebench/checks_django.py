"""Django's own cache checks, kept from building this project's caches.

Why: Django's ``caches.W002`` and ``caches.W003`` checks look for file-based
caches by building every alias (``caches[alias]``, then ``isinstance(...,
FileBasedCache)``). Building a ShardedSQLiteCache opens its store (it creates
the LOCATION directory, the manifest, the shard files and the shared tables)
and building a TieredCache builds its L2, so ``manage.py check`` (and every
command that runs the checks: runserver, migrate...) created the cache on disk,
and a LOCATION the backend cannot use stopped the checks with the constructor's
exception instead of being reported.

Django's checks keep their code and messages; only the ``caches`` they see
builds every alias but this project's, for which it gives ``None`` (not a
FileBasedCache, which is all those checks look for). This project's checks
(``checks.py``, ``checks_tiered.py``) validate those aliases without building
them. Installed by the app config, so it applies when ``"djcachebench"`` is in
``INSTALLED_APPS``, as the other checks do.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.cache import CacheHandler
from django.utils.module_loading import import_string


def is_ours(backend: Any) -> bool:
    """Is ``backend`` (a BACKEND path) ShardedSQLiteCache, TieredCache or a subclass?"""
    try:
        cls = import_string(backend)
    except (ImportError, TypeError, ValueError):
        return False  # Django reports an unimportable BACKEND itself when it builds it
    from .backends.sqlite import ShardedSQLiteCache
    from .backends.tiered import TieredCache

    return isinstance(cls, type) and issubclass(cls, ShardedSQLiteCache | TieredCache)


class CachesWithoutOurs:
    """``django.core.cache.caches`` as Django's cache checks see it: ``[alias]``
    builds the alias as usual (and raises as usual), except this project's, which
    give ``None``; everything else is the handler's."""

    def __init__(self, handler: CacheHandler) -> None:
        self.handler = handler

    def __getitem__(self, alias: str) -> Any:
        conf = getattr(settings, "CACHES", {}).get(alias)
        if isinstance(conf, dict) and is_ours(conf.get("BACKEND")):
            return None
        return self.handler[alias]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handler, name)


def install() -> None:
    """Give Django's cache checks the handler that does not build our caches (once)."""
    from django.core.checks import caches as django_cache_checks

    if not isinstance(django_cache_checks.caches, CachesWithoutOurs):
        django_cache_checks.caches = CachesWithoutOurs(django_cache_checks.caches)
