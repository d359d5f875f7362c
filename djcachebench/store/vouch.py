"""The vouch board: which value files a process of this host has verified.

Why: a value file's tag is a hash of the whole file (milliseconds a megabyte
on a busy host), and under writes every process would otherwise hash every
new file it reads, once each: eight processes reading a value written once
paid eight hashes, against none for diskcache (which has no integrity). A
process that verified a file under the conditions of ``ValueFiles.read``
(looked at while nobody could write it, unchanged through the read, any later
change visible in its times) records here that this file, with this identity,
holds a payload verified for this key; the others then accept the file on the
identity their own look at it gives, and hash nothing.

What an entry is: a keyed BLAKE2b (16 bytes) over the file's name and
identity, the tag's domain and the cache key, in a slot chosen by the name.
The key is derived from the integrity secret with its own context, so nobody
without it can write an entry that checks; an entry copied from elsewhere, or
an old one put back, names an identity the file has only if it has not
changed since it was verified. An entry also binds the host's boot id, so no
entry outlives a reboot: a disk altered while its host was down (edited from
another machine, which can keep a file's identity) has every file hashed again
at its first read after. A torn or overwritten slot is a miss: the file
is hashed, as without a board. The file is read and written with
``pread``/``pwrite`` (never mapped, so a file cut short cannot kill a
process); if it cannot be had the process goes on without it, logged once.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os

from ..coherence.registry import Registry, own_descriptor
from ..coherence.shared_file import open_shared_file
from .values import Identity

#: Slots of the board, one per value of the first four hex digits of a name.
SLOTS = 1 << 16
ENTRY = 16
BOARD_FILE = "vouched"
#: The context of the board's key, derived from the integrity secret.
KEY_CONTEXT = b"djcachebench.vouched.v1"

log = logging.getLogger("djcachebench.sqlite")


def _boot_id() -> bytes:
    """This boot of the host (Linux); empty where it cannot be told."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return f.read().strip()
    except OSError:
        return b""


BOOT_ID = _boot_id()


def _slot(name: str) -> int:
    """The offset of ``name``'s slot: its first four hex digits (names are random)."""
    return int(name[:4], 16) * ENTRY


class _Descriptor:
    """A board's descriptor, closed once no :class:`VouchBoard` holds it."""

    __slots__ = ("__weakref__", "fd")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        own_descriptor(self, fd)


#: The process's one descriptor per board path, while a board uses it
#: (``coherence/registry.py``). Why shared: Django builds a cache instance per
#: thread (and TieredCache a private L2 per thread); if each kept a descriptor of
#: its own on the board, which nothing closes, a thread-per-request server would
#: lose one per request that reads a value file, and at the open-file limit every
#: large value would read as a miss. The descriptor is
#: only read and written at offsets (pread/pwrite), so threads and forked
#: children can share it; the entries are keyed per secret, not per fd.
_fds: Registry[str, _Descriptor] = Registry()  # a child keeps the descriptors
#: Paths whose board could not be had, logged once per process each.
_logged: set[str] = set()


def _shared_fd(path: str) -> _Descriptor | None:
    """The descriptor of the board at ``path`` (None: it cannot be had now)."""
    real = os.path.realpath(path)
    with _fds.lock:
        found = _fds.find(real)
        if found is not None:
            return found
        try:
            fd = open_shared_file(path, SLOTS * ENTRY, b"")
        except OSError as exc:  # SharedFileError too: owner, mode, no room
            if real not in _logged:
                _logged.add(real)
                log.warning("vouch board %s unusable (%s): this process hashes "
                            "every value file it reads first", path, exc)
            return None
        return _fds.add(real, _Descriptor(fd))


class VouchBoard:
    """Entries shared by every process of the host through one small file."""

    __slots__ = ("_fd", "_keyed", "path")

    def __init__(self, path: str, key: bytes) -> None:
        self.path = path
        self._keyed = hashlib.blake2b(key=key, digest_size=ENTRY)
        # Opened at first use; None: not to be had. Held while an operation
        # uses its number, so that it cannot be closed (and the number reused)
        # under that operation.
        self._fd: _Descriptor | bool | None = False

    def _file(self) -> _Descriptor | None:
        fd = self._fd
        if fd is False:
            # None is kept by this instance only: another instance (a later
            # thread's) tries again, and a fault that passed is then over.
            fd = self._fd = _shared_fd(self.path)
        return fd  # type: ignore[return-value]

    def _entry(self, name: str, ident: Identity, key: str, domain: bytes) -> bytes:
        h = self._keyed.copy()
        # The name has a fixed length and the numbers end with a space: no two
        # inputs read alike. The key, of any length, comes last.
        h.update(b"%s%d %d %d %d %d %s %s " % (name.encode("ascii"), *ident, BOOT_ID, domain))
        h.update(key.encode("utf-8", "surrogatepass"))
        return h.digest()

    def vouched(self, name: str, ident: Identity, key: str, domain: bytes) -> bool:
        """Did a process record this file, with this identity, as verified for ``key``?"""
        fd = self._file()
        if fd is None:
            return False
        try:
            found = os.pread(fd.fd, ENTRY, _slot(name))
        except (OSError, ValueError):
            return False
        return len(found) == ENTRY and hmac.compare_digest(
            found, self._entry(name, ident, key, domain))

    def vouch(self, name: str, ident: Identity, key: str, domain: bytes) -> None:
        """Record a file whose payload this process verified (see the module docstring)."""
        fd = self._file()
        if fd is None:
            return
        # A full disk, a file gone read-only: the next reader hashes.
        with contextlib.suppress(OSError, ValueError):
            os.pwrite(fd.fd, self._entry(name, ident, key, domain), _slot(name))

    def close(self) -> None:
        """Forget the descriptor (the process's, shared: it stays open for the others)."""
        self._fd = False
