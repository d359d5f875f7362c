"""System checks for TieredCache aliases (ids ``djcachebench.E101``-``E105``, ``W101``).

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
E_TABLE_FILE = "djcachebench.E105"
_PROCESS_LOCAL = {
    "django.core.cache.backends.locmem.LocMemCache",
    "django.core.cache.backends.dummy.DummyCache",
}


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
    return messages
