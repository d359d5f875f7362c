"""The one way this package creates, sizes and checks a file that every process shares.

Why one helper: a file written through a shared mapping is only safe when its
blocks exist. A sparse file's first write to an unbacked page on a full disk,
or any access past the end of a file someone truncated, is not an error a
program can catch: the kernel sends ``SIGBUS`` and the process dies. So every
shared file is created under a temporary name, sized, *allocated*
(``posix_fallocate``), given its header and only then published with
``link()`` (so nobody ever opens a half-built file), and every process checks
the size and owner of what it opened before it maps or touches it.

This module imports nothing from Django.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import tempfile
import threading
import time

__all__ = ["SharedFileError", "allocate", "ancestry_problem", "fork_safe_lock", "lock_range",
           "open_existing_shared_file", "open_shared_file", "read_kept", "refused_now",
           "regrow", "unlock_range"]

_OPEN_FLAGS = os.O_RDWR | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)


def fork_safe_lock() -> threading.Lock:
    """A lock of this process's registry of shared files (or of its stamps) that
    a forked child gets unheld: the child keeps the descriptors and mappings it
    inherits (they stay valid), but a lock another thread of the parent held at
    the fork would stay held in the child for good. The object stays the same,
    so modules may import it by name."""
    lock = threading.Lock()
    os.register_at_fork(after_in_child=lock._at_fork_reinit)  # type: ignore[attr-defined]
    return lock


class SharedFileError(OSError):
    """A shared file cannot be created, opened, sized or trusted."""


def allocate(fd: int, size: int) -> None:
    """Make sure the first ``size`` bytes of ``fd`` have real blocks (and length).

    Idempotent and cheap on a file that is already allocated, so it also heals
    a sparse file left by an older version. Raises ``SharedFileError`` when the
    disk has no room: the caller degrades instead of mapping a file whose next
    page could be unbacked.
    """
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # a filesystem without it
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)
            return
        raise SharedFileError(exc.errno, f"cannot allocate {size} bytes: {exc.strerror}") from exc


def regrow(fd: int, size: int) -> bool:
    """Give a mapped shared file that was cut short from outside its ``size``
    back (allocated; what was cut reads as zeros), before a page of the mapping
    past the cut is touched: that would kill the process with SIGBUS. One
    ``lseek`` when the file is whole. True if it had been cut; ``OSError``
    (``SharedFileError`` when there is no room) if it cannot be regrown."""
    if os.lseek(fd, 0, os.SEEK_END) >= size:
        return False
    allocate(fd, size)  # sets the length too (posix_fallocate, or ftruncate)
    return True


def _check_opened(fd: int, path: str) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise SharedFileError(errno.EINVAL, f"{path} is not a regular file")
    if st.st_uid != os.geteuid():
        raise SharedFileError(
            errno.EPERM, f"{path} belongs to uid {st.st_uid}, not to this process's uid "
            f"{os.geteuid()}: another user could rewrite what every process trusts")
    if st.st_mode & 0o022:
        raise SharedFileError(
            errno.EPERM, f"{path} is writable by group or others (mode {st.st_mode & 0o777:o}); "
            f"allowed: 0o600")
    return st


def refused_now(path: str, st: os.stat_result, ancestry: bool) -> str | None:
    """Why a process opening ``path`` now would refuse the file ``st`` describes
    (what :func:`open_shared_file` checks: owner, mode, write access, and with
    ``ancestry`` the directories above it), or None.

    Why a process that mapped the file long ago asks too: a process that is
    refused writes without stamping, so the processes still mapping the file
    must stop serving what they read under it, or they serve the values it
    replaced (``chmod 0666``, ``chattr +i`` or a group-writable directory makes
    new processes write unstamped while the old ones would serve the old
    values until ``L1_TIMEOUT``)."""
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return f"owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}"
    if not os.access(path, os.R_OK | os.W_OK, effective_ids=os.access in os.supports_effective_ids):
        return "not writable (read-only, or immutable)"
    return ancestry_problem(path) if ancestry else None


def open_shared_file(path: str, size: int, header: bytes, make_dirs: bool = True) -> int:
    """Open ``path`` read-write, creating it (``size`` bytes, allocated, ``header``
    at offset 0, mode 0o600) if it does not exist. Returns the descriptor.

    When many processes create it at once, exactly one file wins and nobody sees
    it before its header is written. An existing file is returned as it is
    (after the owner and mode checks): validating its contents is the caller's.
    Missing parent directories are created (0o700) unless ``make_dirs`` is false.
    """
    with contextlib.suppress(FileNotFoundError):
        return _open_checked(path)
    directory = os.path.dirname(os.path.abspath(path))
    if make_dirs:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".shared-", dir=directory)  # mode 0o600
    published = False
    try:
        allocate(fd, size)
        os.pwrite(fd, header, 0)
        with contextlib.suppress(FileExistsError):  # another process won the race
            os.link(tmp, path)
            published = True
    finally:
        # Once linked, the descriptor is one of the file at ``path``: it is
        # returned, never closed. Closing any descriptor of a file drops every
        # record lock this process holds on it, and another thread may have
        # opened the new file and locked it (a stamp, a claim) in between.
        if not published:
            os.close(fd)
        os.unlink(tmp)
    if not published:
        return _open_checked(path)
    problem = ancestry_problem(path)
    if problem is not None:
        os.close(fd)
        raise _untrusted(path, problem)
    return fd


def open_existing_shared_file(path: str) -> int:
    """Open the shared file at ``path`` read-write, with the checks of
    :func:`open_shared_file`, without creating it: ``FileNotFoundError`` if it
    is not there (a reader that must not leave a file behind)."""
    return _open_checked(path)


def ancestry_problem(path: str) -> str | None:
    """Why another user could replace ``path`` (a file or a directory) by
    renaming a directory above it, or None.

    Whoever can rename an entry of a directory on the way to a file can put
    another file in its place: an old copy of a cache (a replay of values
    older than an acknowledged write), or another user's table. So every
    directory above ``path`` must belong to root or to this user, and one that
    others can write to must be sticky (``/tmp``: others cannot rename what
    they do not own there); a symbolic link on the way must belong to root or
    this user too (its owner could point it elsewhere). As OpenSSH's
    ``StrictModes`` requires of the directories above a key file.
    """
    me = os.geteuid()
    trusted = (0, me)
    # Walk the path as the kernel resolves it: component by component, each
    # symbolic link followed where it points (a ``..`` after a link goes up
    # from the link's target, not from the text before it), so that every
    # directory and every link actually traversed is looked at.
    pending = [p for p in os.path.join(os.getcwd(), path).split(os.sep) if p]
    current = os.sep
    links = 0
    while pending:
        part = pending.pop(0)
        if part == ".":
            continue
        if part == "..":
            current = os.path.dirname(current)
            continue
        step = os.path.join(current, part)
        try:
            st = os.lstat(step)
        except OSError:
            return None  # not there yet: created by this process, in a checked directory
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in trusted:
                return f"{step} is a symbolic link owned by uid {st.st_uid}"
            links += 1
            if links > 40:
                return f"{path} has too many levels of symbolic links"
            target = os.readlink(step)
            if os.path.isabs(target):
                current = os.sep
            pending = [p for p in target.split(os.sep) if p] + pending
            continue
        if stat.S_ISDIR(st.st_mode) and pending:  # a directory above the end
            if st.st_uid not in trusted:
                return f"{step} is owned by uid {st.st_uid}"
            if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
                return (f"{step} is writable by its group or others and not sticky "
                        f"(mode {stat.S_IMODE(st.st_mode):04o})")
        current = step
    return None


def _untrusted(path: str, problem: str) -> SharedFileError:
    return SharedFileError(errno.EPERM, f"{path}: {problem}: another user could replace "
                           f"it; allowed: directories owned by root or this user, and "
                           f"sticky where others can write")


def _open_checked(path: str) -> int:
    problem = ancestry_problem(path)
    if problem is not None:
        raise _untrusted(path, problem)
    fd = os.open(path, _OPEN_FLAGS)
    try:
        _check_opened(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


# Read-only descriptors that ``read_kept`` opened, by the file they name (and
# any second one opened while a file was being replaced): never closed.
_kept: dict[tuple[int, int], int] = {}
_kept_spare: list[int] = []
_kept_lock = fork_safe_lock()


def read_kept(path: str, length: int) -> bytes:
    """The first ``length`` bytes of the regular file at ``path`` (``OSError``
    if it cannot be read, ``SharedFileError`` if it is not a regular file),
    read through a descriptor this process keeps open for good, one per file.

    For a look at a shared file from outside its owner (a system check) in a
    process that may hold record locks on it through another descriptor:
    closing any descriptor of a file drops every record lock the process holds
    on it. A stamp of another thread then goes on without its slot's lock, and
    another process stamps the slot at the same time: a writer keeps its value
    under a token the other's later write should have ended (a stale L1 read
    after an acknowledged write). Opened without blocking (a FIFO put at the
    path); only regular files are kept, and no lock of ours is on anything else.
    """
    with contextlib.suppress(OSError):
        st = os.stat(path)
        with _kept_lock:
            fd = _kept.get((st.st_dev, st.st_ino))
        if fd is not None:
            return os.pread(fd, length, 0)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise SharedFileError(errno.EINVAL, f"{path} is not a regular file")
    with _kept_lock:
        if (st.st_dev, st.st_ino) in _kept:  # replaced between the stat and the open
            _kept_spare.append(fd)
        else:
            _kept[st.st_dev, st.st_ino] = fd
    return os.pread(fd, length, 0)


def lock_range(fd: int, length: int, start: int, deadline: float) -> bool:
    """Take an exclusive POSIX record lock on ``[start, start+length)``, waiting
    at most until ``deadline`` (``time.monotonic()``). False when it could not.

    Never a blocking ``F_SETLKW``: a holder stopped by ``SIGSTOP``, a debugger
    or a cgroup freezer would block every other writer for as long as it stays
    stopped. The wait spins briefly (holders keep these locks for microseconds)
    and then sleeps in growing steps.
    """
    pause = 0.0
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, length, start, os.SEEK_SET)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
        now = time.monotonic()
        if now >= deadline:
            return False
        if pause:
            time.sleep(min(pause, deadline - now))
            pause = min(pause * 2, 0.002)
        else:
            pause = 0.00002
            os.sched_yield()


def unlock_range(fd: int, length: int, start: int) -> None:
    fcntl.lockf(fd, fcntl.LOCK_UN, length, start, os.SEEK_SET)
