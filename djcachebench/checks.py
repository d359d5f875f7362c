"""Django system checks for what only the environment reveals.

Why checks and not exceptions: a relative LOCATION works, but resolves
against whatever directory the process was started from, so the web server,
the worker and ``manage.py shell`` may each use a different cache. That is a
deployment mistake to report at ``manage.py check`` time (as Django's own
``caches.W003`` does for the file-based cache), not an error that stops a
request. Checks run when ``"djcachebench"`` is in ``INSTALLED_APPS``.

The checks inspect; they never build a cache: building a ShardedSQLiteCache
creates its directory and files, and ``manage.py check`` must leave the disk as
it found it. What the constructor would refuse is reported as ``E005`` with its
message (``ShardedSQLiteCache.check_settings``), and Django's own cache checks
are kept from building this project's caches (``checks_django.py``).
"""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from .store.layout import ownership_problem


def _sqlite_aliases() -> list[tuple[str, dict[str, Any]]]:
    """``(setting path, entry)`` of every ShardedSQLiteCache configured: the aliases
    (``CACHES['disk']``) and the L2s written inline in a TieredCache's OPTIONS
    (``CACHES['default']['OPTIONS']['L2']``), which Django never builds itself."""
    from .backends.sqlite import ShardedSQLiteCache
    from .tiered.config import _is_tiered

    def is_sqlite(conf: Any) -> bool:
        if not isinstance(conf, dict):
            return False
        try:
            cls = import_string(conf.get("BACKEND", ""))
        except ImportError:
            return False  # Django reports unknown backends itself
        return isinstance(cls, type) and issubclass(cls, ShardedSQLiteCache)

    found = []
    for alias, conf in getattr(settings, "CACHES", {}).items():
        if is_sqlite(conf):
            found.append((f"CACHES[{alias!r}]", conf))
        elif isinstance(conf, dict) and _is_tiered(conf.get("BACKEND")):
            inline = (conf.get("OPTIONS") or {}).get("L2")
            if is_sqlite(inline):
                found.append((f"CACHES[{alias!r}]['OPTIONS']['L2']", inline))
    return found


def _nearest_existing(path: str) -> str:
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def _settings_problem(conf: dict[str, Any]) -> str | None:
    """What the backend's constructor would raise for ``conf``, found without building
    it (building creates the directory and the store's files)."""
    cls = import_string(conf["BACKEND"])
    params = {k: v for k, v in conf.items() if k not in ("BACKEND", "LOCATION")}
    try:
        cls.check_settings(conf.get("LOCATION", ""), params)
    except ImproperlyConfigured as exc:
        return str(exc)
    return None


@register("caches")
def check_sqlite_locations(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    for where, conf in _sqlite_aliases():
        location = conf.get("LOCATION", "")
        if isinstance(location, os.PathLike):  # BASE_DIR / "cache", as the backend takes
            location = os.fspath(location)
        if isinstance(location, str) and location and (problem := _settings_problem(conf)):
            messages.append(Error(problem, id="djcachebench.E005", obj=where))
            if "\0" in location:  # no path to look at
                continue
        if not isinstance(location, str) or not location:
            messages.append(Error(
                f"{where} has no LOCATION.",
                hint="Set LOCATION to an absolute directory path for the shard files.",
                id="djcachebench.E001",
            ))
            continue
        if not os.path.isabs(location):
            messages.append(Warning(
                f"{where}['LOCATION'] = {location!r} is relative.",
                hint="It resolves against each process's working directory; use an "
                     "absolute path so every process shares one cache.",
                id="djcachebench.W001",
            ))
        target = os.path.abspath(location)
        existing = _nearest_existing(target)
        if os.path.exists(target) and not os.path.isdir(target):
            messages.append(Error(
                f"{where}['LOCATION'] = {location!r} exists and is not a directory.",
                id="djcachebench.E002",
            ))
        elif os.path.isdir(target) and (problem := ownership_problem(target)):
            messages.append(Error(
                f"{where}['LOCATION'] = {location!r}: {problem}",
                id="djcachebench.E004",
            ))
        elif not os.access(existing, os.W_OK | os.X_OK):
            messages.append(Error(
                f"{where}['LOCATION'] = {location!r} is not writable by this "
                f"process ({existing!r} is not writable).",
                hint="Create the directory for the user the application runs as, mode 0700.",
                id="djcachebench.E003",
            ))
    return messages
