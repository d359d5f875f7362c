"""System checks for a ShardedSQLiteCache LOCATION (``manage.py check``).

Pinned (checks.py, docs/settings.md): what depends on the environment is
reported with stable ids: no LOCATION (E001), a relative one (W001, each
process would resolve it against its own working directory), a LOCATION that
is a file (E002) or cannot be written (E003). A good absolute LOCATION, and
other backends' aliases, give no message.

How this meets Django's own checks: ``run_checks`` also runs Django's
``check_file_based_cache_is_absolute``, which builds *every* alias
(``caches[alias]``) to see whether it is a FileBasedCache. Our constructor
raises ``ImproperlyConfigured`` for a LOCATION it cannot use, so through
``manage.py check`` those problems surface as that exception (naming
``CACHES['disk']['LOCATION']``) before our E001-E003 can be returned; the
check function itself is therefore also tested directly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from djcachebench.checks import check_sqlite_locations

from .sqlite_helpers import caches_entry


def use(settings: Any, entry: dict[str, Any]) -> None:
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "disk": entry,
    }


def our_ids(settings: Any, entry: dict[str, Any]) -> list[str]:
    """The ids our check function returns for ``entry`` as alias ``disk``."""
    use(settings, entry)
    return sorted(m.id for m in check_sqlite_locations() if m.id)


def reported_by_manage_check(settings: Any, entry: dict[str, Any], check_id: str) -> bool:
    """``manage.py check`` reports the problem: as ``check_id`` or as the constructor's
    ``ImproperlyConfigured`` naming the alias's LOCATION."""
    use(settings, entry)
    try:
        messages = checks.run_checks(tags=[checks.Tags.caches])
    except ImproperlyConfigured as exc:
        return "CACHES['disk']['LOCATION']" in str(exc)
    return check_id in {m.id for m in messages}


def test_good_location_passes(settings: Any, tmp_path: Path) -> None:
    entry = caches_entry(tmp_path / "not-yet-created")
    assert our_ids(settings, entry) == []
    use(settings, entry)
    assert [m for m in checks.run_checks(tags=[checks.Tags.caches])
            if m.id and m.id.startswith("djcachebench.")] == []


@pytest.mark.parametrize("location", [None, ""], ids=["missing", "empty"])
def test_no_location_is_an_error(settings: Any, location: str | None) -> None:
    entry = caches_entry("x")
    if location is None:
        del entry["LOCATION"]
    else:
        entry["LOCATION"] = location
    assert our_ids(settings, entry) == ["djcachebench.E001"]
    assert reported_by_manage_check(settings, entry, "djcachebench.E001")


def test_relative_location_is_a_warning(
    settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    entry = caches_entry("relative/cache")
    assert our_ids(settings, entry) == ["djcachebench.W001"]
    assert reported_by_manage_check(settings, entry, "djcachebench.W001")


def test_location_that_is_a_file_is_an_error(settings: Any, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    entry = caches_entry(tmp_path / "file")
    assert our_ids(settings, entry) == ["djcachebench.E002"]
    assert reported_by_manage_check(settings, entry, "djcachebench.E002")


def test_location_below_a_file_is_not_writable(settings: Any, tmp_path: Path) -> None:
    """Root-proof unwritable LOCATION: a directory cannot be created under a file."""
    (tmp_path / "file").write_text("")
    entry = caches_entry(tmp_path / "file" / "sub")
    assert our_ids(settings, entry) == ["djcachebench.E003"]
    assert reported_by_manage_check(settings, entry, "djcachebench.E003")
