"""System checks for a ShardedSQLiteCache LOCATION (``manage.py check``).

Pinned (checks.py, docs/settings.md): what depends on the environment is
reported with stable ids: no LOCATION (E001), a relative one (W001, each
process would resolve it against its own working directory), a LOCATION that
is a file (E002) or cannot be written (E003). A good absolute LOCATION, and
other backends' aliases, give no message.

Also pinned: the checks build no cache, so ``manage.py check`` leaves the disk
as it found it (a LOCATION that does not exist still does not). Django's own
``caches.W002``/``W003`` checks build every alias to find the file-based ones;
with ``"djcachebench"`` installed they skip this project's aliases
(``checks_django.py``) and still report what they report for FileBasedCache.
What the constructor would refuse is reported as E005 with its message, and a
LOCATION it cannot use as E001-E004, never as the constructor's exception.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from djcachebench.checks import check_sqlite_locations

from .helpers import caches_entry


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
    """``manage.py check`` reports the problem as ``check_id`` (the checks build no
    cache, so the constructor's exception never stops them)."""
    use(settings, entry)
    return check_id in {m.id for m in checks.run_checks(tags=[checks.Tags.caches])}


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


def tiered_over(entry: dict[str, Any]) -> dict[str, Any]:
    return {"default": {"BACKEND": "djcachebench.backends.tiered.TieredCache",
                        "OPTIONS": {"L2": "disk"}},
            "disk": entry}


def test_check_leaves_a_missing_location_missing(settings: Any, tmp_path: Path) -> None:
    """Through ``manage.py check`` (deploy checks and STATIC_ROOT included, so that
    Django's W002 check runs too): ShardedSQLiteCache and a TieredCache over it."""
    location = tmp_path / "parent" / "cache"
    settings.CACHES = tiered_over(caches_entry(location))
    settings.STATIC_ROOT = str(tmp_path / "static")
    call_command("check", deploy=True, tags=["caches"], verbosity=0)
    assert not (tmp_path / "parent").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_settings_the_constructor_refuses_are_E005_and_create_nothing(
        settings: Any, tmp_path: Path) -> None:
    location = tmp_path / "cache"
    entry = caches_entry(location, {"SHARDS": "many"})
    assert our_ids(settings, entry) == ["djcachebench.E005"]
    (message,) = check_sqlite_locations()
    assert "CACHES['disk']['OPTIONS']['SHARDS']" in message.msg and "'many'" in message.msg
    settings.CACHES = tiered_over(entry)
    with pytest.raises(SystemCheckError, match=r"djcachebench\.E005"):
        call_command("check", tags=["caches"], verbosity=0)
    assert not location.exists()


def test_a_path_object_location_is_a_location(settings: Any, tmp_path: Path) -> None:
    entry = {**caches_entry("x"), "LOCATION": tmp_path / "cache"}
    assert our_ids(settings, entry) == []


def test_djangos_own_checks_still_see_file_based_caches(
        settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings.CACHES = {
        "default": caches_entry(tmp_path / "ours"),
        "files": {"BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
                  "LOCATION": "relative"},
        "static": {"BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
                   "LOCATION": str(tmp_path / "static" / "cache")},
    }
    settings.STATIC_ROOT = str(tmp_path / "static")
    found = checks.run_checks(tags=[checks.Tags.caches], include_deployment_checks=True)
    ids = [m.id for m in found]
    assert sorted(ids) == ["caches.W002", "caches.W003"]
    assert not (tmp_path / "ours").exists()


def test_an_inline_l2_is_checked_as_an_alias_is(settings: Any, tmp_path: Path) -> None:
    """A ShardedSQLiteCache written inline as a TieredCache's L2 is no alias of its own:
    its settings and its LOCATION are checked under the path that names it."""
    inline = caches_entry(tmp_path / "file" / "cache", {"SHARDS": 0})
    (tmp_path / "file").write_text("")
    settings.CACHES = {"default": {"BACKEND": "djcachebench.backends.tiered.TieredCache",
                                   "OPTIONS": {"L2": inline}}}
    found = {m.id: m.msg for m in check_sqlite_locations()}
    assert sorted(found) == ["djcachebench.E003", "djcachebench.E005"]
    assert "CACHES['default']['OPTIONS']['L2']['OPTIONS']['SHARDS']" in found[
        "djcachebench.E005"]
    assert found["djcachebench.E003"].startswith("CACHES['default']['OPTIONS']['L2']['LOCATION']")
    inline["OPTIONS"] = {}
    inline["LOCATION"] = str(tmp_path / "missing" / "cache")
    call_command("check", tags=["caches"], verbosity=0)
    assert not (tmp_path / "missing").exists()
