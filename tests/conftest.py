"""Shared fixtures: real memcached and redis-server, started once per session.

Where a test file goes: in the folder of the part whose behaviour it guards,
named ``test_<part>_<behaviour>.py`` (where a defect was found, or by whom, is
no name: file it with the behaviour it breaks).

* ``tests/sqlite/``: ShardedSQLiteCache and its store (``backends/sqlite``,
  ``store/``, its checks) and the host-wide counters it publishes
  (``hoststats/``, ``cachestats``);
* ``tests/tiered/``: TieredCache and its L1 in one process (``tiered/``,
  ``l1.py``, key making through both backends);
* ``tests/coherence/``: what keeps processes of one host coherent (the
  generation table, the value board, the shared files, ``coherence/``);
* ``tests/cluster/``: coherence across hosts (``coherence/cluster/``);
* ``tests/stampede/``: stampede protection (``stampede.py``);
* ``tests/bench/``: the benchmark harness and its commands (``bench/``);
* ``tests/`` itself: what spans the whole project: the docs, the sdist, Django's
  own cache suites (``django_suites.py``), and the settings.

Fixtures every part uses are here; a part's own are in its folder's
``conftest.py`` (e.g. ``tests/sqlite/conftest.py``), never imported into test
modules. Helper functions are in the folder's ``helpers.py``, and functions
that spawned processes run in its ``workers.py`` (imported by module path,
e.g. ``tests.sqlite.workers``: every folder is a package).

Both come from ``djcachebench.bench.servers``, the one place that starts
servers. A missing binary skips the tests that need it on a developer's
machine, with the reason; in CI (``CI=true``) it fails them, because CI's
set-up installs both and a silent skip would hide a broken set-up. Any other
start failure is always an error.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from djcachebench.bench.servers import (
    MemcachedServer,
    RedisServer,
    ServerNotInstalled,
)


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def _serve(server: MemcachedServer | RedisServer) -> Iterator[MemcachedServer | RedisServer]:
    try:
        server.start()
    except ServerNotInstalled as exc:
        if _in_ci():
            pytest.fail(f"{exc} (CI=true: the set-up must install it)", pytrace=False)
        pytest.skip(str(exc))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def memcached_server() -> Iterator[MemcachedServer]:
    """A running memcached; ``.location`` is ``127.0.0.1:PORT``."""
    yield from _serve(MemcachedServer())  # type: ignore[misc]


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A running redis-server; ``.location`` is ``redis://127.0.0.1:PORT/0``."""
    yield from _serve(RedisServer())  # type: ignore[misc]


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tests marked ``servers`` start memcached and redis-server themselves (through
    the harness): off CI, a missing binary skips them with the reason, as the
    fixtures above do, instead of failing them (as when the README's quick start
    is run without root)."""
    if item.get_closest_marker("servers") is None or _in_ci():
        return
    from djcachebench.bench.servers import find_binary

    missing = [name for name in ("memcached", "redis-server") if find_binary(name) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (apt-get install {' '.join(missing)})")


#: The default generation tables that existed when the session started.
_TABLES_BEFORE = pytest.StashKey[set[str]]()


def _table_dir() -> Path:
    from djcachebench.tiered.locations import _table_directory

    return Path(_table_directory()) / f"djcachebench-{os.getuid()}"


def pytest_sessionstart(session: pytest.Session) -> None:
    """Note the default generation tables there are before the run."""
    found = _table_dir()
    session.config.stash[_TABLES_BEFORE] = (
        {p.name for p in found.iterdir()} if found.is_dir() else set())


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Remove the default generation tables the run created: each TieredCache over
    an L2 in a test's own directory gets one (tens of MB with its value board),
    and nothing else ever removes them, so runs would pile them up in /tmp."""
    before = session.config.stash.get(_TABLES_BEFORE, None)
    found = _table_dir()
    if before is None or not found.is_dir():
        return
    for path in found.iterdir():
        if path.name not in before and path.is_file():
            with contextlib.suppress(OSError):
                path.unlink()


