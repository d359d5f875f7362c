"""Entry points of the child processes of the host-wide statistics tests.

Each runs in a ``spawn``ed process and reaches the caches as a site does,
through ``caches[alias]`` under a settings module written by the test
(:func:`write_site`): a ShardedSQLiteCache (``default``), a TieredCache over
it (``tiered``) and a LocMemCache (``local``, which has no host-wide stats).
Every loop has its own bound, so an orphaned child cannot run for ever.
"""

from __future__ import annotations

import os
import sys
import time
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

SECRET_KEY = "djcachebench-tests-not-secret-0123456789"  # as tests/settings.py
SITE_MODULE = "stats_site"
MAX_CHILD_SECONDS = 120.0
KEYS = 50


def write_site(directory: Path, location: Path) -> dict[str, str]:
    """Write the settings module into ``directory``; return the environment
    that selects it (for ``manage.py``-style subprocesses)."""
    caches = {
        "default": {"BACKEND": "djcachebench.backends.sqlite.ShardedSQLiteCache",
                    "LOCATION": str(location), "OPTIONS": {"SHARDS": 2}},
        "tiered": {"BACKEND": "djcachebench.backends.tiered.TieredCache",
                   "OPTIONS": {"L2": "default"}},
        "local": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    }
    (directory / f"{SITE_MODULE}.py").write_text(
        f"SECRET_KEY = {SECRET_KEY!r}\nUSE_TZ = True\nINSTALLED_APPS = ['djcachebench']\n"
        f"CACHES = {caches!r}\n")
    return {**os.environ, "PYTHONPATH": str(directory), "DJANGO_SETTINGS_MODULE": SITE_MODULE}


def setup(site_dir: str) -> Any:
    sys.path.insert(0, site_dir)
    os.environ["DJANGO_SETTINGS_MODULE"] = SITE_MODULE
    import django

    django.setup()
    from django.core.cache import caches

    return caches


def serve(site_dir: str, sqlite_hits: Synchronized, tiered_hits: Synchronized,
          stop: Event) -> None:
    """Serve gets (each a hit) on both caches until ``stop``, publishing after
    each round how many hits it has had on each."""
    caches = setup(site_dir)
    sq, tc = caches["default"], caches["tiered"]
    for i in range(KEYS):
        sq.set(f"s{i}", i)
        tc.set(f"t{i}", i)
    end = time.monotonic() + MAX_CHILD_SECONDS
    while not stop.is_set() and time.monotonic() < end:
        for i in range(KEYS):
            assert sq.get(f"s{i}") == i
            assert tc.get(f"t{i}") == i
        sqlite_hits.value += KEYS
        tiered_hits.value += KEYS
        time.sleep(0.001)


def exact(site_dir: str, gets: int) -> None:
    """``KEYS`` sets on each cache, then ``gets`` hits on each, then a normal exit."""
    caches = setup(site_dir)
    sq, tc = caches["default"], caches["tiered"]
    for i in range(KEYS):
        sq.set(f"s{i}", i)
        tc.set(f"t{i}", i)
    for n in range(gets):
        assert sq.get(f"s{n % KEYS}") is not None
        assert tc.get(f"t{n % KEYS}") is not None


def forks(site_dir: str, before: int, child: int) -> None:
    """``before`` hits, flushed; then a forked child makes ``child`` hits and
    ends (flushing: it takes no part in the parent's exit)."""
    caches = setup(site_dir)
    sq = caches["default"]
    sq.set("k", 1)
    for _ in range(before):
        assert sq.get("k") == 1
    from djcachebench.hoststats import publish

    publish.flush_all()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for _ in range(child):
                assert sq.get("k") == 1
            publish.flush_all(final=True)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
