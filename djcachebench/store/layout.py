"""The cache directory: created private, described by a manifest.

Why a manifest: keys are routed by ``crc32(key) % SHARDS``. Opening a
directory written with 8 shards as if it had 16 would send most keys to the
wrong file: reads miss, deletes do nothing, and stale values resurface after
a later change of settings. So the directory records its format and shard
count on first use, and every later open must agree.

Why the shard files are consulted too: the manifest is written once and never
touched again while the shards change all the time, so an age-based temp
cleaner deletes it first, and a person may delete or damage it. Rebuilt from
the opening process's own ``SHARDS`` alone, it let a process with another
count join a running cache: each side then read its own older values after
the other's acknowledged writes. So the files are the truth: a manifest is
written only when the shard files present agree with the count (or there are
none), a manifest that disagrees with them is refused, and running processes
look at the manifest again (``LayoutGuard``): one that was replaced or
recreated under them with another count ends their use of the directory.

Why the directory must be ours alone: whoever can write to it can replace a
shard file, and so choose what every process reads (the integrity tag stops
forged values, not an old file put back or two files swapped). A directory
another user created in advance (in a shared ``/tmp``, say) or that a group
or others can write to is refused, as TieredCache refuses such a directory
for its table.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sqlite3
import stat
import tempfile
import time
import urllib.parse

from ..coherence.shared_file import ancestry_problem
from .stats import log_event

FORMAT = "djcachebench-sqlite"
# Bump whenever the shard schema changes: an older directory is then refused
# at start-up instead of failing every write. 2: the ``created`` column.
# 3: ``meta.bytes_exact`` and the resize trigger that depends on it.
# 4: large values in files (``cache.file``, the ``garbage`` table and its
# triggers, ``values/``), their HMAC-SHA256 tag, the index on ``stored``.
# 5: values too long for the key's row in the ``blobs`` table (``cache.blob``).
# 6: tags bind the key's length and the serializer's name (serializers.py); a
# shard's rows sealed before are dropped when it is upgraded (shard.py).
FORMAT_VERSION = 6
# Older versions this one upgrades in place rather than refusing: each shard
# gets what it lacks when a connection opens it (shard.py, ``_ensure_schema``),
# and the manifest is rewritten at once so that code reading only the older
# version refuses the directory instead of misreading values in ``blobs``.
UPGRADES = frozenset({4, 5})
HASH = "crc32"
MANIFEST = "manifest.json"
# Ours are under 200 bytes; anything much larger is not one.
MANIFEST_MAX = 64 * 1024


# Shard ``i`` lives in ``shard-{i:03d}.sqlite3``; files set aside
# (``.corrupt-...``) and SQLite's ``-wal``/``-shm`` do not match.
_SHARD_FILE = re.compile(r"shard-(\d{3,})\.sqlite3")

# What identifies the file a path names: (st_dev, st_ino).
FileId = tuple[int, int]


class LayoutError(Exception):
    """The directory cannot be used as asked (message says why and what is on disk)."""


class LayoutChanged(OSError):
    """The directory no longer holds the layout this process opened (its manifest
    was replaced or recreated with another shard count): every call on the
    cache fails as a fault does, until the process restarts with the directory's
    settings. An ``OSError``, so the store's fault policy counts and logs it."""


def shard_name(index: int) -> str:
    """The file name of shard ``index``."""
    return f"shard-{index:03d}.sqlite3"


#: The ``application_id`` in the SQLite header of every shard file ("DJCB"); its
#: ``user_version`` holds ``shards << 16 | index`` (``Shard.connect`` writes both).
SHARD_APPLICATION_ID = 0x444A4342


def shard_place(path: str) -> tuple[int, int] | None:
    """``(shards, index)`` as the shard file at ``path`` records them in its SQLite
    header, or ``None`` (no such regular file, not an SQLite database, one that
    records nothing because an older version made it, or one that cannot be
    read now). Read without blocking (``_header``)."""
    header = _header(path)
    if header is None:
        return None
    version, application = header
    if application != SHARD_APPLICATION_ID or version <= 0:
        return None
    return version >> 16, version & 0xFFFF


#: Both words of the header in one statement, as the database's current
#: state has them (a header written only to the log so far included).
_SQL_HEADER = "SELECT user_version, application_id FROM pragma_user_version, pragma_application_id"


def _header(path: str) -> tuple[int, int] | None:
    """``(user_version, application_id)`` of the SQLite database at ``path``, or
    ``None`` when it is not a regular file holding one, or cannot be read now.

    Read through SQLite, never through a descriptor of our own. Closing any
    descriptor of a file drops every POSIX lock this process holds on it,
    SQLite's included: a cache instance made by a new thread dropped the locks
    of the other threads' open connections to every shard. Another process
    closing its last connection then took the file for unused, checkpointed
    and deleted the log under them, and their later commits went to a log no
    one reads: acknowledged writes lost (two ``add`` calls both won), and I/O
    errors. SQLite's own connections in a process share one set of locks per
    file and close a descriptor only when none of them holds a lock.

    An empty file is no database (a shard being made, or a name put there by
    hand): SQLite would take it for an empty one. A regular file is checked
    first, without opening it: SQLite's open of a FIFO would wait for a
    writer."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
        return None
    try:
        conn = sqlite3.connect(f"file:{urllib.parse.quote(path)}?mode=rw", uri=True,
                               timeout=0, isolation_level=None, check_same_thread=False)
    except sqlite3.Error:
        return None
    try:
        version, application = conn.execute(_SQL_HEADER).fetchone()
    except sqlite3.Error:  # not a database, or busy (being made right now)
        return None
    finally:
        conn.close()
    return version, application


def shards_on_disk(directory: str) -> tuple[int | None, int]:
    """What the shard files in ``directory`` say of the shard count: the count
    they record (``shard_place``; ``None`` when none records one), and one more
    than the highest index of a file that is an SQLite database (0 when there
    is none), a lower bound only: the highest file may be missing (set aside
    as corrupt, deleted by a cleaner), and is then made again empty. Names
    that are not databases (an empty file, a link to nothing) say nothing.
    ``LayoutError`` when the files record different counts."""
    try:
        names = os.listdir(directory)
    except OSError:
        return None, 0
    recorded: dict[int, list[str]] = {}
    highest = -1
    for match in map(_SHARD_FILE.fullmatch, names):
        if match is None:
            continue
        index = int(match.group(1))
        path = os.path.join(directory, match.group(0))
        place = shard_place(path)
        if place is not None and place[1] == index:
            recorded.setdefault(place[0], []).append(match.group(0))
        if index > highest and (place is not None or _is_database(path)):
            highest = index
    if len(recorded) > 1:
        said = "; ".join(f"{', '.join(sorted(names)[:3])} record {count} shards"
                         for count, names in sorted(recorded.items()))
        raise LayoutError(f"the shard files in {directory!r} disagree about the shard "
                          f"count ({said}): they come from different caches. Point "
                          f"LOCATION to a new directory.")
    return (next(iter(recorded)) if recorded else None), highest + 1


def _is_database(path: str) -> bool:
    """Is ``path`` an SQLite database (read as ``_header`` reads, for the same reason)?"""
    return _header(path) is not None


def prepare_directory(directory: str) -> None:
    """Create ``directory`` (mode 0o700) if needed and check that it is writable."""
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise LayoutError(f"cannot create cache directory {directory!r}: {exc.strerror}") from exc
    if not os.path.isdir(directory):
        raise LayoutError(f"cache LOCATION {directory!r} exists and is not a directory")
    if not os.access(directory, os.W_OK | os.X_OK) and not _read_only_mount(directory):
        owner = os.stat(directory).st_uid
        whose = "" if owner == os.geteuid() else f" (it is owned by {_user(owner)})"
        raise LayoutError(f"cache directory {directory!r} is not writable by this process{whose}")
    problem = ownership_problem(directory)
    if problem:
        raise LayoutError(problem)


def _read_only_mount(directory: str) -> bool:
    """Is ``directory`` on a file system mounted read-only?

    That is a fault, not a configuration error: ext4 remounts itself read-only
    on an I/O error (``errors=remount-ro``), and Django builds a cache instance
    per thread, so raising here would crash every request of a worker started
    after it. The cache is built, logged, and
    every call meets the fault as a miss or a failed write (errors +1)."""
    try:
        read_only = bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        return False
    if read_only:
        log_event(logging.ERROR, "read-only",
                  "cache directory %r is on a read-only file system: reads miss and "
                  "writes fail until it is writable", directory)
    return read_only


def ownership_problem(directory: str) -> str | None:
    """Why ``directory`` (an existing directory) may not hold a cache, or ``None``.

    It must belong to the user this process runs as and be writable by nobody
    else (see the module docstring). A symbolic link is followed: what counts
    is the directory the files are created in.
    """
    st = os.stat(directory)
    me = os.geteuid()
    above = ancestry_problem(directory)
    if above is not None:
        return (
            f"cache directory {directory!r} cannot be trusted: {above}, so another user "
            f"could swap the directory for another (an old copy of the cache, say); "
            f"allowed: every directory above LOCATION owned by root or by {_user(me)}, "
            f"and sticky where others can write (like /tmp)."
        )
    if st.st_uid != me:
        return (
            f"cache directory {directory!r} is owned by {_user(st.st_uid)}, not by "
            f"{_user(me)} that this process runs as; allowed: a directory owned by "
            f"this user and writable by no one else (mode 0700). Create it as this "
            f"user, or point LOCATION to a directory that does not exist yet."
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (
            f"cache directory {directory!r} is writable by its group or by others "
            f"(mode {stat.S_IMODE(st.st_mode):04o}); allowed: writable only by its "
            f"owner, e.g. mode 0700 (chmod go-w {directory})."
        )
    return None


def aside_name(path: str) -> str:
    """A free name beside ``path`` to move a damaged file to (nothing is deleted:
    an operator can inspect it): ``<path>.corrupt-<time>-<pid>[-n]``."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    target = base = f"{path}.corrupt-{stamp}-{os.getpid()}"
    n = 0
    while os.path.lexists(target):  # rename() would replace an earlier copy
        n += 1
        target = f"{base}-{n}"
    return target


def _user(uid: int) -> str:
    """``name (uid N)``, or ``uid N`` for a user without a name."""
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name!r} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def ensure_manifest(directory: str, shards: int) -> tuple[dict[str, object], FileId]:
    """Check the manifest against ``shards`` and the shard files present, writing
    it first if it is absent (atomically, first writer wins); returns it with
    the identity of the file read. A manifest is written only when the shard
    files present agree with ``shards`` or there are none (module docstring)."""
    path = os.path.join(directory, MANIFEST)
    wanted = {"format": FORMAT, "version": FORMAT_VERSION, "shards": shards, "hash": HASH}
    for attempt in range(3):
        if not os.path.exists(path):
            recorded, named = shards_on_disk(directory)
            if recorded is not None and recorded != shards:
                raise LayoutError(
                    f"{path} is missing (deleted, or set aside as damaged) and the shard "
                    f"files in {directory!r} record {recorded} shards, but SHARDS={shards} "
                    f"was asked for. Set SHARDS to {recorded} (the manifest is then written "
                    f"again), or point LOCATION to a new directory (keys would otherwise "
                    f"be routed to the wrong shard files)."
                )
            if recorded is None and named and named != shards:
                # Files of an older version record nothing: their names are all
                # there is, and a count they do not match is refused.
                raise LayoutError(
                    f"{path} is missing (deleted, or set aside as damaged) and "
                    f"{directory!r} holds {named} shard files "
                    f"({shard_name(0)} to {shard_name(named - 1)}) but SHARDS={shards} "
                    f"was asked for. Restore the manifest, or point LOCATION to a new "
                    f"directory (keys would otherwise be routed to the wrong shard files)."
                )
            _write(path, wanted, replace=False)
        try:
            raw, seen = _read_manifest(path)
            if raw is None:
                raise ValueError(f"not a regular file of at most {MANIFEST_MAX} bytes "
                                 f"(mode {seen[2]:o}, {seen[3]} bytes)")
            found = json.loads(raw)
            break
        except FileNotFoundError:
            continue  # removed meanwhile: written again
        except OSError as exc:
            raise LayoutError(f"cannot read {path}: {exc}") from exc
        except ValueError as exc:  # not JSON (UnicodeDecodeError included), or not a file
            if attempt == 2 or not _has_shards(directory):
                raise LayoutError(f"cannot read {path}: {exc}") from exc
            _set_aside(path, seen, exc)
    else:
        raise LayoutError(f"cannot read {path}: it keeps vanishing")
    if not isinstance(found, dict) or found.get("format") != FORMAT:
        raise LayoutError(f"{path} is not a {FORMAT} manifest: {found!r}")
    if found.get("version") != FORMAT_VERSION and found.get("version") not in UPGRADES:
        raise LayoutError(
            f"{path} has format version {found.get('version')!r}; this djcachebench "
            f"reads version {FORMAT_VERSION}. Use a new LOCATION or clear this one."
        )
    held = found.get("shards")
    if type(held) is not int or held < 1:
        # Edited by hand ("2", 2.0, -1): naming it as a count would contradict
        # itself ("holds 2 shards but SHARDS=2 was asked for").
        raise LayoutError(f"{path} is damaged: its \"shards\" is {held!r}, not a shard "
                          f"count. Restore it (this cache was made with some SHARDS), or "
                          f"point LOCATION to a new directory.")
    recorded, named = shards_on_disk(directory)
    if (recorded != held) if recorded is not None else (named > held):
        # A manifest written for another count than the files record (by a
        # process that did not look, or put back by hand) describes another
        # cache than the one on disk: routed by it, keys miss their files.
        said = (f"the shard files record {recorded} shards" if recorded is not None
                else f"{directory!r} holds {named} shard files")
        raise LayoutError(
            f"{path} says {held} shards but {said}: the manifest does not describe "
            f"the data. Delete it (it is written again by a process whose SHARDS the "
            f"files agree with), or point LOCATION to a new directory."
        )
    if held != shards or found.get("hash") != HASH:
        raise LayoutError(
            f"{directory!r} holds {found.get('shards')} shards (hash {found.get('hash')}, "
            f"per {path}) but SHARDS={shards} was asked for. Set SHARDS to "
            f"{found.get('shards')}, or point LOCATION to a new directory (keys would "
            f"otherwise be routed to the wrong shard files)."
        )
    if found["version"] != FORMAT_VERSION:
        found = {**found, "version": FORMAT_VERSION}
        _write(path, found, replace=True)
    return found, (seen[0], seen[1])


class LayoutGuard:
    """The manifest a running process opened its shards under, looked at again.

    Why: running processes read the manifest only at start-up. If it is
    deleted, a process may write it again with another ``SHARDS`` (now only
    where no shard files disagree: ``ensure_manifest``), and after the whole
    directory is removed a process with another count starts on an empty
    one; the processes that opened the old layout went on routing keys by
    theirs. :meth:`confirm` runs whenever a connection to a shard is opened
    and at every file check (``connections.FILE_CHECK_INTERVAL``): while the
    manifest is the file confirmed last it is one ``stat``; otherwise the
    manifest is checked as at start-up (written again from this process's
    count if it is missing and the shard files agree), and if it now says
    another count, :class:`LayoutChanged` is raised, on every call from then
    on: reads miss and writes fail, logged, until the process is restarted.
    """

    def __init__(self, directory: str, shards: int, confirmed: FileId | None) -> None:
        self.directory = directory
        self.shards = shards
        self.path = os.path.join(directory, MANIFEST)
        self._confirmed = confirmed
        # The manifest last refused and why: while it is still the file at the
        # path, each call is refused at the cost of a stat.
        self._refused: tuple[FileId, str] | None = None

    def confirm(self) -> None:
        """Return if the directory still holds this process's layout, or if that
        cannot be told now (a full disk keeps a missing manifest from being
        written: logged, and looked at again at the next check); raise
        :class:`LayoutChanged` if it holds another."""
        try:
            st = os.stat(self.path)
            ident: FileId | None = (st.st_dev, st.st_ino)
        except OSError:
            ident = None
        if ident is not None:
            if ident == self._confirmed:
                return
            if self._refused is not None and self._refused[0] == ident:
                raise LayoutChanged(self._refused[1])
        if ident is None and not os.path.isdir(self.directory):
            # The directory was removed: a fault of every call (the shards cannot
            # be opened), not a layout. When it is made again, whichever process
            # writes the manifest first decides the layout; the others are refused.
            return
        try:
            _, confirmed = ensure_manifest(self.directory, self.shards)
        except LayoutError as exc:
            why = (f"the cache directory {self.directory!r} no longer holds the layout "
                   f"this process opened (SHARDS={self.shards}): {exc} Every call on it "
                   f"fails until this process is restarted with the directory's settings.")
            if ident is not None:
                self._refused = (ident, why)
            log_event(logging.ERROR, "layout", "%s", why)
            raise LayoutChanged(why) from exc
        except OSError as exc:
            log_event(logging.ERROR, "layout-unknown", "cannot check the manifest of %r "
                      "(%s); looked at again at the next check", self.directory, exc)
            return
        self._confirmed = confirmed
        self._refused = None


def _has_shards(directory: str) -> bool:
    """Does the directory hold shard files (is it a cache of ours)?"""
    try:
        return any(n.startswith("shard-") and n.endswith(".sqlite3") for n in os.listdir(directory))
    except OSError:
        return False


def _read_manifest(path: str) -> tuple[bytes | None, tuple[int, int, int, int]]:
    """The manifest's bytes (None if it is not a regular file, or is larger than
    any manifest), and what identifies the file read: (device, inode, mode, size).

    Opened without blocking and checked before reading: a FIFO put in its place
    blocked the cache's construction for good, and ``/dev/zero`` filled the
    memory of the process reading it.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        st = os.lstat(path)  # a symbolic link to nothing is not a manifest either
        return None, (st.st_dev, st.st_ino, st.st_mode, 0)
    try:
        st = os.fstat(fd)
        seen = (st.st_dev, st.st_ino, st.st_mode, st.st_size)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MANIFEST_MAX:
            return None, seen
        return os.read(fd, MANIFEST_MAX + 1), seen
    finally:
        os.close(fd)


def _set_aside(path: str, seen: tuple[int, int, int, int], exc: Exception) -> None:
    """A manifest that is not JSON at all (emptied, overwritten with noise; ours
    are written whole, see ``_write``) beside shard files is moved aside, never
    deleted, so that the next read writes one from this process's settings: a
    damaged file must not stop every process from opening the cache. Without
    shard files beside it the directory may not be ours, and is refused as any
    foreign manifest is. A manifest that *is* JSON but says otherwise is left
    alone: it is the only record of how the shards were made. Another process
    may have replaced it meanwhile: then it is left. Anything that is not a
    regular file (a directory, a FIFO, a device) is moved aside likewise."""
    try:
        st = os.lstat(path)
        # Another process may have replaced it meanwhile (a new file, or the
        # one it wrote over a symbolic link): then it is not ours to move.
        if (st.st_dev, st.st_ino) != seen[:2] and not stat.S_ISLNK(st.st_mode):
            return
        aside = aside_name(path)
        os.rename(path, aside)
    except OSError:
        return
    logging.getLogger("djcachebench.sqlite").error(
        "%s is not a manifest (%s); moved aside to %s, a new one is written", path, exc, aside)


def _write(path: str, manifest: dict[str, object], replace: bool) -> None:
    """Write ``manifest`` at ``path`` whole or not at all (a temporary file,
    synced, then linked or renamed into place). ``replace=False``: only if
    no manifest is there (``link`` fails on an existing name, so of two
    processes creating the directory at once only one writes it); True: over
    the one there (an upgrade, which every process makes alike)."""
    fd, tmp = tempfile.mkstemp(prefix=".manifest-", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(manifest, f)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
