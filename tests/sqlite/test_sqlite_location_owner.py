"""A LOCATION another user owns, or that others can write to, is refused.

Pinned (store/layout.py, checks.py ``djcachebench.E004``, docs/settings.md):
whoever can write the directory can swap shard files and so choose what every
process reads, and another local user can pre-create a predictable LOCATION
(in a shared ``/tmp``) before the application starts. So, as TieredCache does
for its default table directory, an existing LOCATION must belong to the user
the process runs as and be writable by no one else; otherwise the backend
raises ``ImproperlyConfigured`` naming ``LOCATION``, the owner and what is
allowed, and creates nothing there. ``manage.py check`` reports the same as
``djcachebench.E004``. A symbolic link to a directory of ours is fine.

The foreign owner is real: as root the test gives the directory to ``nobody``
(uid 65534), which is how such a directory looks to the victim.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.checks import check_sqlite_locations

from .helpers import caches_entry, new_cache

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory away needs root")


def foreign_dir(tmp_path: Path) -> Path:
    location = tmp_path / "precreated"
    location.mkdir(mode=0o700)
    os.chown(location, NOBODY, NOBODY)
    return location


def check_ids(settings: Any, location: Path) -> list[str]:
    settings.CACHES = {"disk": caches_entry(location)}
    return sorted(m.id for m in check_sqlite_locations() if m.id)


@as_root
def test_location_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    location = foreign_dir(tmp_path)
    with pytest.raises(ImproperlyConfigured) as caught:
        new_cache(location)
    message = str(caught.value)
    assert "['LOCATION']" in message
    assert str(location) in message
    assert f"uid {NOBODY}" in message and "'nobody'" in message
    assert "owned by this user" in message and "0700" in message
    assert list(location.iterdir()) == []  # nothing was created in it


@as_root
def test_system_check_reports_the_foreign_owner(settings: Any, tmp_path: Path) -> None:
    assert check_ids(settings, foreign_dir(tmp_path)) == ["djcachebench.E004"]


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777, 0o1777])
def test_location_writable_by_group_or_others_is_refused(
    settings: Any, tmp_path: Path, mode: int
) -> None:
    location = tmp_path / "shared"
    location.mkdir()
    location.chmod(mode)
    with pytest.raises(ImproperlyConfigured) as caught:
        new_cache(location)
    message = str(caught.value)
    assert "['LOCATION']" in message and "writable by its group or by others" in message
    assert f"{mode & 0o7777:04o}" in message
    assert list(location.iterdir()) == []
    assert check_ids(settings, location) == ["djcachebench.E004"]


@pytest.mark.parametrize("mode", [0o700, 0o750, 0o755])
def test_own_directory_closed_to_writers_is_accepted(
    settings: Any, tmp_path: Path, mode: int
) -> None:
    location = tmp_path / "mine"
    location.mkdir()
    location.chmod(mode)
    cache = new_cache(location)
    cache.set("k", "v")
    assert cache.get("k") == "v"
    assert check_ids(settings, location) == []


def test_symlink_to_own_directory_is_accepted(tmp_path: Path) -> None:
    target = tmp_path / "real"
    target.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(target)
    cache = new_cache(link)
    cache.set("k", "v")
    assert cache.get("k") == "v"


def test_new_location_is_created_private(tmp_path: Path) -> None:
    location = tmp_path / "a" / "b"
    new_cache(location).set("k", "v")
    assert location.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("parent", ["other user's", "group-writable", "link of another user",
                                    "link through a link of another user",
                                    "dot-dot after a link"])
def test_a_location_another_user_can_swap_is_refused(tmp_path: Path, parent: str) -> None:
    """Checking LOCATION itself is not enough: another user who owns (or can
    write) a directory above it can rename whole cache directories there, and
    the victim reads a value older than its own acknowledged write (an old copy
    put back). Every directory above must belong to root or this user, and be
    sticky if others can write to it."""
    if parent != "group-writable" and os.geteuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    above = tmp_path / "site"
    above.mkdir()
    if parent == "group-writable":
        above.chmod(0o775)
        location = above / "cache"
    elif parent == "other user's":
        os.chown(above, 12345, 12345)
        location = above / "cache"
    elif parent == "link of another user":
        target = tmp_path / "real"
        target.mkdir()
        link = tmp_path / "link"
        link.symlink_to(target)
        os.lchown(link, 12345, 12345)
        location = link / "cache"
    elif parent == "link through a link of another user":
        # Not only the links spelled in the path are checked, but also those
        # they point through.
        (tmp_path / "real").mkdir()
        sticky = tmp_path / "sticky"
        sticky.mkdir()
        sticky.chmod(0o1777)
        theirs = sticky / "l2"
        theirs.symlink_to(tmp_path / "real")
        os.lchown(theirs, 12345, 12345)
        ours = tmp_path / "l1"
        ours.symlink_to(theirs)
        location = ours / "cache"
    else:
        # ``lnk/..`` is the parent of lnk's target, not tmp_path (the text).
        evil = tmp_path / "evil"
        (evil / "sub").mkdir(parents=True)
        os.chown(evil, 12345, 12345)
        (tmp_path / "lnk").symlink_to(evil / "sub")
        location = tmp_path / "lnk" / ".." / "cache"
    with pytest.raises(ImproperlyConfigured, match=r"cannot be trusted: .*allowed: every "
                                                   "directory above LOCATION"):
        ShardedSQLiteCache(str(location), {"OPTIONS": {}})


def test_a_sticky_world_writable_directory_above_is_accepted(tmp_path: Path) -> None:
    """The /tmp pattern: others may write there, but cannot rename what is ours."""
    above = tmp_path / "shared"
    above.mkdir()
    above.chmod(0o1777)
    cache = ShardedSQLiteCache(str(above / "cache"), {"OPTIONS": {}})
    cache.set("k", "v")
    assert cache.get("k") == "v"
