"""System checks for TieredCache aliases (ids ``djcachebench.E101``-``E105``, ``W101``-``W102``).

Why checks as well as exceptions: a TieredCache is built lazily, on the first
``caches[alias]`` of a thread, so a bad L2 reference would otherwise surface in
the middle of a request. ``manage.py check`` (and every ``runserver``) reports
it at start-up instead, with the same message the backend would raise.

Registered on import; ``djcachebench``'s app config (or ``djcachebench.checks``)
imports this module.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

from djcachebench.coherence.layout import file_problem
from djcachebench.tiered.config import TieredConfigError, _is_tiered, read_config

W_LOCAL_L2 = "djcachebench.W101"
W_NO_TIMEOUT = "djcachebench.W102"
E_TABLE_FILE = "djcachebench.E105"
_PROCESS_LOCAL = {
    "django.core.cache.backends.locmem.LocMemCache",
    "django.core.cache.backends.dummy.DummyCache",
}

# The options that bound a call to a hung server, per backend: what each
# client reads (redis-py's pool keywords under Django's RedisCache,
# django-redis's own names or its pool keywords, pymemcache's and pylibmc's).
_TIMEOUT_OPTIONS = {
    "django.core.cache.backends.redis.RedisCache": ("socket_timeout",),
    "django_redis.cache.RedisCache": ("SOCKET_TIMEOUT",),
    "django.core.cache.backends.memcached.PyMemcacheCache": ("timeout",),
    "django.core.cache.backends.memcached.PyLibMCCache": (),
}
# libmemcached's own, under pylibmc's behaviors.
_PYLIBMC_TIMEOUTS = ("receive_timeout", "send_timeout", "_poll_timeout", "poll_timeout")


def missing_socket_timeout(backend: str, options: Any) -> str | None:
    """The option that would bound a call to a hung redis or memcached, named for
    ``backend`` when ``options`` leave it unset (None: set, or not such a backend).

    Why a warning: without it a call to a server that stopped answering (not one
    that refuses connections) waits as long as the client's default allows:
    forever under redis-py and pymemcache, seconds under libmemcached; and the
    circuit breaker, which counts failures, sees none meanwhile."""
    if backend not in _TIMEOUT_OPTIONS:
        return None
    if not isinstance(options, dict):
        options = {}
    if backend.endswith("PyLibMCCache"):
        behaviors = options.get("behaviors", options)
        if isinstance(behaviors, dict) and any(behaviors.get(n) for n in _PYLIBMC_TIMEOUTS):
            return None
        return "'receive_timeout' and 'send_timeout' (microseconds, under 'behaviors')"
    names = _TIMEOUT_OPTIONS[backend]
    if any(options.get(n) is not None for n in names):
        return None
    pool = options.get("CONNECTION_POOL_KWARGS")
    if isinstance(pool, dict) and pool.get("socket_timeout") is not None:
        return None
    return repr(names[0])


@checks.register(checks.Tags.caches)
def check_tiered_caches(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = []
    for alias, conf in getattr(settings, "CACHES", {}).items():
        if not _is_tiered(conf.get("BACKEND")):
            continue
        params = {k: v for k, v in conf.items() if k not in ("BACKEND", "LOCATION")}
        try:
            config = read_config(conf.get("LOCATION", ""), params)
        except TieredConfigError as exc:
            messages.append(checks.Error(str(exc), id=exc.check_id, obj=f"CACHES[{alias!r}]"))
            continue
        path = config.generation_path
        if path and (problem := file_problem(path)):
            # Not an exception in the backend: a file anything on the host can
            # damage must not fail requests; there the L1 is off meanwhile.
            messages.append(checks.Error(
                f"CACHES[{alias!r}]['OPTIONS']['GENERATION_PATH'] = {path!r} {problem}; "
                "the L1 stays off while it is.",
                hint="Point GENERATION_PATH to a path of its own (created 0o600 by the "
                     "first process), or remove what is there.",
                id=E_TABLE_FILE, obj=f"CACHES[{alias!r}]"))
        if config.coherence == "host" and config.l2_backend in _PROCESS_LOCAL:
            messages.append(checks.Warning(
                f"CACHES[{alias!r}] is a TieredCache over {config.l2_backend}, which each "
                "process keeps for itself: there is nothing to keep coherent across "
                "processes, and each process still sees only its own writes.",
                hint="Use a shared L2 (ShardedSQLiteCache, redis, memcached, filebased).",
                id=W_LOCAL_L2, obj=f"CACHES[{alias!r}]"))
        missing = missing_socket_timeout(config.l2_backend,
                                         config.l2_params.get("OPTIONS", {}))
        if missing is not None:
            messages.append(checks.Warning(
                f"CACHES[{alias!r}] is a TieredCache over {config.l2_backend} with no "
                f"socket timeout: a call to a server that stops answering (stopped, "
                f"swapping, behind a dropped network path) waits as long as the client "
                f"lets it (redis-py: forever), and the circuit breaker counts no "
                f"failure meanwhile.",
                hint=f"Set {missing} in the L2's OPTIONS (half a second is a common "
                     f"choice for a cache on the same network).",
                id=W_NO_TIMEOUT, obj=f"CACHES[{alias!r}]"))
    return messages
