"""Children that die with the harness: ``PR_SET_PDEATHSIG`` on Linux.

The runner stops its servers and workers in ``finally`` blocks and on
SIGINT/SIGTERM, but nothing runs when the main process is SIGKILLed (the
OOM killer, ``kill -9``, a CI job's timeout): redis-server, memcached and
the worker processes would be left running, holding ports, memory and
files. On Linux a child can ask the kernel to
send it a signal when its parent dies; each child started here asks for
SIGKILL, from the child itself, before it does anything else.

The parent is the *thread* that started the child, as the kernel counts it:
the harness starts servers and workers from its main thread, whose end is
the process's. A parent that died before the child's request took effect
is caught by comparing ``getppid()`` with the parent recorded before the
start. Elsewhere (macOS) these functions do nothing: the ``finally`` blocks
remain the only clean-up there.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["die_with_parent", "preexec", "run_orphan_safe"]

#: ``PR_SET_PDEATHSIG`` from <linux/prctl.h>.
PR_SET_PDEATHSIG = 1


@functools.cache
def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, looked up once per process (so that a server's
    ``preexec_fn``, which runs between ``fork`` and ``exec``, calls a function
    already resolved instead of loading a library there); None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


def die_with_parent(parent: int | None = None) -> bool:
    """Ask the kernel to SIGKILL this process when its parent dies; True if it will.

    ``parent``: the harness's PID, recorded before this process started; if it
    has already gone, this process kills itself now.
    """
    prctl = _prctl()
    if prctl is None or prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return False
    if parent is not None and os.getppid() != parent and not _exists(parent):
        os.kill(os.getpid(), signal.SIGKILL)
    return True


def _exists(pid: int) -> bool:
    """Is ``pid`` still running? A worker of the forkserver start method is the
    forkserver's child, not the harness's, so a parent other than the harness
    is no sign by itself that the harness died (the forkserver exits when it
    does, and its children with it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def preexec() -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen`` of a server (None off Linux).

    It runs in the forked child before ``exec``; the death signal survives the
    ``exec`` of a binary that is not set-user-ID, as redis-server and memcached are not.
    """
    if _prctl() is None:
        return None
    parent = os.getpid()

    def in_child() -> None:
        die_with_parent(parent)

    return in_child


def run_orphan_safe(parent: int, target: Callable[..., Any], *args: Any) -> Any:
    """A multiprocessing worker's target: ask for the death signal, then run ``target``.

    Used as ``Process(target=run_orphan_safe, args=(os.getpid(), worker_main, ...))``
    so the worker's own module need not know about it.
    """
    die_with_parent(parent)
    return target(*args)

