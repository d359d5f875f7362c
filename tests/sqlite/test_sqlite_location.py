"""Where the cache lives: LOCATION, its directory and the manifest.

Pinned (docs/settings.md, "Files" and the failure table): a LOCATION that is
missing, empty, not a directory, cannot be created, or that this user cannot
write is refused at start-up with ``ImproperlyConfigured`` naming
``CACHES[...]['LOCATION']``; so is a directory written with another shard
count, by another program, or by a newer format. What is a fault rather than a
mistake is not refused: a file system mounted read-only, a damaged manifest
beside shards (set aside), a manifest that is not a regular file.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from djcachebench.backends.sqlite import ShardedSQLiteCache

from .helpers import (
    caches_entry,
    config_error,
    new_cache,
)

# -- LOCATION -----------------------------------------------------------------------


def test_location_missing(settings: Any) -> None:
    entry = caches_entry("x")
    del entry["LOCATION"]
    message = config_error(settings, entry)
    assert "CACHES['default']['LOCATION']" in message
    assert "directory" in message


def test_location_empty(settings: Any) -> None:
    message = config_error(settings, caches_entry(""))
    assert "CACHES['default']['LOCATION']" in message


def test_location_is_a_regular_file(settings: Any, tmp_path: Path) -> None:
    path = tmp_path / "a-file"
    path.write_text("not a directory")
    message = config_error(settings, caches_entry(path))
    assert "CACHES['default']['LOCATION']" in message
    assert str(path) in message
    assert path.read_text() == "not a directory"  # left as it was


@pytest.mark.parametrize("where", ["under-a-file", "proc"])
def test_location_cannot_be_created(settings: Any, tmp_path: Path, where: str) -> None:
    """Unwritable LOCATION. The suite runs as root, where ``chmod 0o500`` blocks
    nothing, so the directory is made impossible instead: a path below a
    regular file, or a new directory inside ``/proc``."""
    if where == "under-a-file":
        (tmp_path / "file").write_text("")
        location = tmp_path / "file" / "sub"
    else:
        location = Path(f"/proc/{os.getpid()}/djcachebench-cache")
    message = config_error(settings, caches_entry(location))
    assert "CACHES['default']['LOCATION']" in message
    assert str(location) in message


def test_location_not_writable_for_a_non_root_user(settings: Any) -> None:
    """A read-only directory is refused with a clear message.

    Root ignores directory permissions, so when the suite runs as root the
    check runs in a forked child that has dropped to the ``nobody`` user.
    """
    base = Path(tempfile.mkdtemp(prefix="djcb-ro-", dir="/tmp"))
    base.chmod(0o755)
    location = base / "ro"
    location.mkdir(mode=0o555)
    try:
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 3
            try:
                if os.geteuid() == 0:
                    os.setgid(65534)
                    os.setuid(65534)
                message = config_error(settings, caches_entry(location))
                code = 0 if "not writable" in message and str(location) in message else 1
            except BaseException:
                code = 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        location.chmod(0o700)
        shutil.rmtree(base)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None,
                    reason="mounting a file system read-only needs root and mount(8)")
def test_a_location_on_a_read_only_file_system_misses_instead_of_raising(
        settings: Any, tmp_path: Path) -> None:
    """A file system that went read-only (ext4 remounts itself so on an I/O error)
    is a fault, not a configuration error: Django builds an instance per thread,
    so ImproperlyConfigured would crash every request of a new worker. Reads
    miss, writes fail, logged."""
    import subprocess

    writable, read_only = tmp_path / "rw", tmp_path / "ro"
    writable.mkdir()
    read_only.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs",
                       str(writable)], check=False).returncode != 0:
        pytest.skip("this machine does not let even root mount a tmpfs")
    try:
        writer = new_cache(writable / "c")
        writer.set("k", "v")
        writer.close_connections()
        subprocess.run(["mount", "--bind", str(writable), str(read_only)], check=True)
        subprocess.run(["mount", "-o", "remount,ro,bind", str(read_only)], check=True)
        try:
            cache = new_cache(read_only / "c")  # raised ImproperlyConfigured before
            # What SQLite can still read, it reads; else a miss. Never an exception.
            assert cache.get("k", "missed") in ("v", "missed")
            cache.set("k", "new")  # a failed write: returns, as on a full disk
            assert cache.add("other", 1) is False
            assert cache.get("other") is None
            assert cache.stats()["errors"] >= 1
            cache.close_connections()
        finally:
            subprocess.run(["umount", "-l", str(read_only)], check=False)
        again = new_cache(writable / "c")
        assert again.get("k") == "v"  # nothing was lost
        again.close_connections()
    finally:
        subprocess.run(["umount", "-l", str(writable)], check=False)


def test_reopening_with_another_shard_count_names_what_is_on_disk(
    settings: Any, cache_dir: Path, make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    """Keys are routed by ``crc32 % SHARDS``: another count would misroute them."""
    first = make_cache({"SHARDS": 4})
    first.set("k", "v")
    message = config_error(settings, caches_entry(cache_dir, {"SHARDS": 16}))
    assert "CACHES['default']['LOCATION']" in message
    assert "holds 4 shards" in message
    assert "SHARDS=16" in message
    # The original shard count still opens the directory, data intact.
    assert make_cache({"SHARDS": 4}).get("k") == "v"


def test_reopening_with_the_default_after_an_explicit_count(
    settings: Any, cache_dir: Path, make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    make_cache({"SHARDS": 3})
    message = config_error(settings, caches_entry(cache_dir))
    assert "holds 3 shards" in message and "SHARDS=8" in message


@pytest.mark.parametrize("manifest", ["{not json", json.dumps({"format": "other"}),
                                      json.dumps([1, 2])])
def test_foreign_or_damaged_manifest_is_refused(
    settings: Any, cache_dir: Path, manifest: str
) -> None:
    """A directory that is not ours (or whose manifest is damaged) is never written into."""
    cache_dir.mkdir(mode=0o700)
    (cache_dir / "manifest.json").write_text(manifest)
    message = config_error(settings, caches_entry(cache_dir))
    assert "manifest.json" in message
    assert not list(cache_dir.glob("shard-*"))


def test_newer_format_version_is_refused(settings: Any, cache_dir: Path) -> None:
    cache_dir.mkdir(mode=0o700)
    (cache_dir / "manifest.json").write_text(json.dumps(
        {"format": "djcachebench-sqlite", "version": 99, "shards": 8, "hash": "crc32"}))
    message = config_error(settings, caches_entry(cache_dir))
    assert "version 99" in message


# The shard schema of the first layout (commit ca6cf0d), before the ``created``
# column: a directory written then must not be opened as if it were current.
LAYOUT_1_SCHEMA = """
CREATE TABLE cache (key TEXT PRIMARY KEY NOT NULL, expires REAL, stored INTEGER NOT NULL,
                    kind INTEGER NOT NULL, value, size INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE meta (id INTEGER PRIMARY KEY CHECK (id = 0), entries INTEGER NOT NULL,
                   bytes INTEGER NOT NULL);
INSERT INTO meta VALUES (0, 0, 0);
"""


def test_directory_of_an_older_layout_is_refused_at_start_up(
    settings: Any, cache_dir: Path
) -> None:
    """A directory written by the first layout (manifest version 1, no ``created``
    column) is refused with a message naming its version, instead of opening and
    then failing every write with "no column named created"."""
    cache_dir.mkdir(mode=0o700)
    (cache_dir / "manifest.json").write_text(json.dumps(
        {"format": "djcachebench-sqlite", "version": 1, "shards": 8, "hash": "crc32"}))
    for i in range(8):
        conn = sqlite3.connect(cache_dir / f"shard-{i:03d}.sqlite3")
        conn.executescript(LAYOUT_1_SCHEMA)
        conn.close()
    message = config_error(settings, caches_entry(cache_dir))
    assert "format version 1" in message
    assert "CACHES['default']['LOCATION']" in message


@pytest.mark.parametrize("damage", [b"", b"{not json", b"\x00\xff\xfe garbage"])
def test_a_damaged_manifest_beside_shards_is_set_aside_not_fatal(
    cache_dir: Path, make_cache: Callable[..., ShardedSQLiteCache], damage: bytes
) -> None:
    """Defect: a manifest emptied or overwritten with noise in a cache directory
    made every process that opened the cache fail (ImproperlyConfigured, so every
    request using it). Beside shard files, it is moved aside (kept) and written
    again from the settings; the data is still there."""
    make_cache({"SHARDS": 4}).set("k", "v")
    (cache_dir / "manifest.json").write_bytes(damage)
    assert make_cache({"SHARDS": 4}).get("k") == "v"
    assert json.loads((cache_dir / "manifest.json").read_text())["shards"] == 4
    assert [p.read_bytes() for p in cache_dir.glob("manifest.json.corrupt-*")] == [damage]
    # The settings still have to agree with what is on disk afterwards.
    with pytest.raises(ImproperlyConfigured, match="holds 4 shards"):
        make_cache({"SHARDS": 8})


@pytest.mark.parametrize("held", ["4", 4.0, -4, None, True])
def test_a_manifest_whose_shard_count_is_not_one_is_named_damaged(
    cache_dir: Path, make_cache: Callable[..., ShardedSQLiteCache], held: Any
) -> None:
    """A manifest whose shard count is not an int is named damaged: ``"shards":
    "4"`` must not say "holds 4 shards ... but SHARDS=4 was asked for"."""
    make_cache({"SHARDS": 4}).set("k", "v")
    manifest = json.loads((cache_dir / "manifest.json").read_text())
    (cache_dir / "manifest.json").write_text(json.dumps({**manifest, "shards": held}))
    with pytest.raises(ImproperlyConfigured) as raised:
        make_cache({"SHARDS": 4})
    message = str(raised.value)
    assert "manifest.json is damaged" in message and repr(held) in message
    assert "SHARDS=4 was asked for" not in message


def _open_and_get(location: str, out: Any) -> None:
    import resource

    # Bounded, so that the code before this fix (which read /dev/zero whole)
    # fails this test with a MemoryError instead of taking the machine's memory.
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    try:
        cache = ShardedSQLiteCache(location, {"OPTIONS": {"SHARDS": 2}})
        out.put(("got", cache.get("k", "miss")))
    except BaseException as exc:  # reported to the test, which fails on it
        out.put(("raised", f"{type(exc).__name__}: {exc}"))


@pytest.mark.parametrize("odd", ["fifo", "dev-zero", "directory", "dangling-link"])
def test_a_manifest_that_is_not_a_file_is_set_aside_within_a_bound(
        cache_dir: Path, make_cache: Callable[..., ShardedSQLiteCache], odd: str) -> None:
    """``manifest.json`` replaced by a FIFO would block every process constructing
    the cache for good; a link to ``/dev/zero`` would fill its memory; a
    directory would refuse the cache (ImproperlyConfigured, so every request
    using it). Like a damaged manifest beside shard files, it is moved aside and
    written again; the data is still there."""
    make_cache({"SHARDS": 2}).set("k", "v")
    manifest = cache_dir / "manifest.json"
    manifest.unlink()
    if odd == "fifo":
        os.mkfifo(manifest)
    elif odd == "dev-zero":
        manifest.symlink_to("/dev/zero")
    elif odd == "directory":
        manifest.mkdir()
    else:
        manifest.symlink_to(cache_dir / "nowhere")
    spawn = multiprocessing.get_context("spawn")
    out = spawn.Queue()
    child = spawn.Process(target=_open_and_get, args=(str(cache_dir), out), daemon=True)
    child.start()
    try:
        child.join(60)
        assert not child.is_alive(), "constructing the cache still blocked after 60 s"
        assert out.get(timeout=5) == ("got", "v")
    finally:
        if child.is_alive():
            child.kill()
    assert json.loads(manifest.read_text())["shards"] == 2
    assert list(cache_dir.glob("manifest.json.corrupt-*"))


def test_a_relative_location_is_resolved_once_at_start_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative LOCATION is made absolute when the cache is built: kept as
    given, a thread that opens its shards after an ``os.chdir`` would look for
    them in another directory (a miss, and an error logged)."""
    import threading

    monkeypatch.chdir(tmp_path)
    cache = ShardedSQLiteCache("relcache", {})
    assert cache.location == str(tmp_path / "relcache")
    cache.set("k", "value")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    seen: list[Any] = []
    thread = threading.Thread(target=lambda: seen.append(cache.get("k")))  # a new connection
    thread.start()
    thread.join()
    assert seen == ["value"]
    assert not (elsewhere / "relcache").exists()


def test_a_location_with_a_nul_character_is_a_configuration_error(settings: Any) -> None:
    message = config_error(settings, caches_entry("/tmp/a\x00b"))
    assert "CACHES['default']['LOCATION']" in message and "NUL" in message
