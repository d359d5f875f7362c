"""What a result depends on beyond the machine: servers, the cache's filesystem.

A redis figure depends on the redis-server it ran against (its version, the
options it was started with), and a disk cache's figures on the filesystem
its files live on (tmpfs, ext4, overlayfs behave nothing alike under fsync and
mmap), so both go into ``results.json``. These functions read them without
ever failing a run: a figure that cannot be read is None.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["VERSION_FLAGS", "binary_version", "filesystem_of", "server_info"]

#: The option each server binary prints its version with.
VERSION_FLAGS = {"redis-server": "--version", "memcached": "-V"}


def binary_version(binary: str, name: str) -> str | None:
    """The first line the binary prints for its version option (None if it cannot)."""
    flag = VERSION_FLAGS.get(name)
    if flag is None:
        return None
    try:
        out = subprocess.run([binary, flag], capture_output=True, text=True, timeout=10,
                             check=False).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.strip().splitlines()
    return lines[0] if lines else None


def server_info(server: Any) -> dict[str, Any]:
    """A started loopback server's binary version and exact command line."""
    process = getattr(server, "process", None)
    argv = [str(a) for a in process.args] if process is not None else None
    name = getattr(server, "binary_name", "")
    return {
        "version": binary_version(argv[0], name) if argv else None,
        "command": argv,
    }


def filesystem_of(path: str | Path | None = None) -> dict[str, Any]:
    """The mount point and filesystem type (from /proc/mounts) holding ``path``.

    ``path`` defaults to the directory the targets' cache files go to (the
    temporary directory: each target's ``workdir``). The longest mount point
    that contains the path's real location is the one its files are on.
    """
    where = os.path.realpath(path or tempfile.gettempdir())
    best: tuple[str, str] | None = None
    try:
        with open("/proc/mounts") as mounts:
            for line in mounts:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mount = parts[1].replace("\\040", " ")
                inside = where == mount or where.startswith(mount.rstrip("/") + "/")
                if inside and (best is None or len(mount) >= len(best[0])):
                    best = (mount, parts[2])
    except OSError:
        pass
    return {"path": where, "mount": best[0] if best else None,
            "fstype": best[1] if best else None}  # fmt: skip
