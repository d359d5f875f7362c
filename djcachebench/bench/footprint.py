"""Memory and disk: what a backend costs besides time, measured per target and run.

A user choosing a cache decides on footprint as much as on latency: a
per-process cache multiplies its memory by the worker count, a server holds
the data once, a disk cache trades memory for files. Three figures, each
taken where it can be taken honestly:

**RSS growth per worker** (``rss_growth_bytes``, one value per worker): the
worker's resident set size (``/proc/self/statm``) just before the start
barrier (Django set up, op list and value pool built, worker 0's pre-fill
done) and again after its last measured op, minus the bytes of the latency
samples the worker itself recorded (8 per call). What is left is what the
run's cache calls made the process keep: an in-process cache's entries
(locmem, TieredCache's L1), client buffers, SQLite page caches. Python's
allocator keeps freed memory, so the figure is an upper bound on what the
cache holds, and it can be slightly negative when the allocator gave pages
back. ``private_growth_bytes`` is the same less the pages shared with a file
mapping (``statm``'s resident minus shared): a file every worker maps, such
as TieredCache's generation table, counts in each worker's RSS but exists
once.

**The server's own memory** (``server``): after the run, what the server
says it holds: redis ``INFO memory`` (``used_memory``, and
``used_memory_dataset`` = used_memory less the server's fixed overhead) with
``DBSIZE``; memcached ``stats`` (``bytes`` of items, ``curr_items``), and the
server process's RSS (``/proc/PID/statm``). memcached's ``flush_all`` frees
items lazily, so after repeated runs its ``bytes`` may still count items of
an earlier run that nothing has reclaimed yet.

**Bytes on disk** (``disk``): the target's private directory walked by
worker 0 after every worker finished its ops and before it closes its own
connections, so SQLite's ``-wal`` files are still there (SQLite removes a
log when its last connection closes): allocated bytes (``st_blocks``), the
files' apparent size, the WAL's share, and the file count.

**Entries** (``entries``): per-entry figures need the number of entries the
cache holds at the end. No Django API counts them, so worker 0 probes the
scenario's keys (all of them up to :data:`PROBE_KEYS`, else a uniform sample
of that many, scaled up: an estimate, flagged ``entries_estimated``). A
per-process cache (locmem) is probed in worker 0's process only.
"""

from __future__ import annotations

import os
import resource
import socket
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from random import Random
from typing import Any

from djcachebench.bench.servers import LOOPBACK
from djcachebench.bench.stats import percentile

#: Keys probed to count entries; more keys than this are sampled.
PROBE_KEYS = 20_000
#: Values above this many bytes are probed one key at a time (bounded memory).
PROBE_BATCH_VALUE_LIMIT = 64 * 1024
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes(pid: int | str = "self") -> int | None:
    """Resident set size of a process (Linux ``/proc``), else the peak from getrusage."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * PAGE_SIZE
    except (OSError, ValueError, IndexError):
        if pid != "self":
            return None
        # ru_maxrss is in KiB on Linux: the peak, the best a non-Linux host offers.
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def private_bytes() -> int | None:
    """Resident pages of this process not shared with a file mapping (Linux ``statm``).

    ``resident - shared``: what the process holds on its own. A file mapped by
    every worker (TieredCache's generation table) counts in each one's RSS
    but not here.
    """
    try:
        with open("/proc/self/statm") as statm:
            fields = statm.read().split()
        return (int(fields[1]) - int(fields[2])) * PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return None


def disk_usage(directory: str | Path) -> dict[str, int] | None:
    """Allocated and apparent bytes under ``directory``, the WAL's share, the file count.

    None when the directory holds no file (a server or in-memory backend).
    """
    allocated = apparent = wal = files = 0
    for root, _dirs, names in os.walk(directory):
        for name in names:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue  # removed while we walked (a value file replaced)
            files += 1
            allocated += st.st_blocks * 512
            apparent += st.st_size
            if name.endswith("-wal"):
                wal += st.st_size
    if not files:
        return None
    return {"bytes": allocated, "apparent_bytes": apparent, "wal_bytes": wal, "files": files}


def count_entries(
    cache: Any,
    make_key: Callable[[int], Any],
    keys: int,
    value_max: int,
    seed: int,
    prints: dict[Any, Hashable] | None = None,
    fingerprint: Callable[[Any], Hashable] | None = None,
) -> tuple[int, int, bool]:
    """(entries, keys probed, estimated?) of the scenario's keys present in ``cache``.

    With ``prints`` and ``fingerprint``, each entry found is also recorded as
    ``prints[key] = fingerprint(value)``, so that the parent can count only the
    entries that hold a value the workload stored (verify.py): a cache that
    answers every key with the same wrong value holds no entries. Large values
    are then read one key at a time (bounded memory) instead of ``has_key``,
    which cannot say what an entry holds.
    """
    if keys <= PROBE_KEYS:
        indices: Sequence[int] = range(keys)
    else:
        indices = sorted(Random(f"probe-{seed}").sample(range(keys), PROBE_KEYS))
    probe = [make_key(i) for i in indices]
    found = 0
    if value_max > PROBE_BATCH_VALUE_LIMIT:
        if fingerprint is None or prints is None:
            found = sum(1 for key in probe if cache.has_key(key))
        else:
            for key in probe:
                value = cache.get(key)
                if value is not None:
                    found += 1
                    prints[key] = fingerprint(value)
    else:
        for start in range(0, len(probe), 500):
            got = cache.get_many(probe[start : start + 500])
            found += len(got)
            if fingerprint is not None and prints is not None:
                for key, value in got.items():
                    prints[key] = fingerprint(value)
    if len(probe) == keys:
        return found, len(probe), False
    return round(found * keys / len(probe)), len(probe), True


def server_memory(kind: str, port: int, pid: int | None) -> dict[str, Any]:
    """What a loopback server says it holds (see the module doc), and its RSS."""
    out: dict[str, Any] = {"kind": kind, "rss_bytes": rss_bytes(pid) if pid else None}
    if kind == "redis":
        info = _redis_info(port)
        out["memory_bytes"] = int(info.get("used_memory", 0))
        out["dataset_bytes"] = int(info.get("used_memory_dataset", 0))
        out["items"] = _redis_dbsize(port)
    elif kind == "memcached":
        stats = _memcached_stats(port)
        out["memory_bytes"] = int(stats.get("bytes", 0))
        out["dataset_bytes"] = out["memory_bytes"]
        out["items"] = int(stats.get("curr_items", 0))
    return out


def _request(port: int, payload: bytes, done: Callable[[bytes], bool]) -> bytes:
    with socket.create_connection((LOOPBACK, port), timeout=5.0) as sock:
        sock.sendall(payload)
        reply = b""
        while not done(reply):
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    return reply


def _redis_info(port: int) -> dict[str, str]:
    def complete(reply: bytes) -> bool:
        if not reply.startswith(b"$"):
            return bool(reply)
        head, _, body = reply.partition(b"\r\n")
        return len(body) >= int(head[1:]) + 2

    reply = _request(port, b"INFO memory\r\n", complete)
    fields = {}
    for line in reply.decode(errors="replace").splitlines()[1:]:
        name, sep, value = line.partition(":")
        if sep:
            fields[name] = value.strip()
    return fields


def _redis_dbsize(port: int) -> int:
    reply = _request(port, b"DBSIZE\r\n", lambda r: r.endswith(b"\r\n"))
    return int(reply[1:].strip() or 0) if reply.startswith(b":") else 0


def _memcached_stats(port: int) -> dict[str, str]:
    reply = _request(port, b"stats\r\n", lambda r: r.endswith(b"END\r\n"))
    stats = {}
    for line in reply.decode(errors="replace").splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "STAT":
            stats[parts[1]] = parts[2]
    return stats


def median_footprint(runs: Sequence[Any]) -> Any:
    """Per figure, the median of the runs' values (recursively; None if a run lacks it)."""
    if not runs:
        return None
    first = runs[0]
    if isinstance(first, dict):
        keys = [k for k in first if all(isinstance(r, dict) and k in r for r in runs)]
        return {k: median_footprint([r[k] for r in runs]) for k in keys}
    if isinstance(first, list):
        if any(not isinstance(r, list) or len(r) != len(first) for r in runs):
            return first
        return [median_footprint([r[i] for r in runs]) for i in range(len(first))]
    if any(r is None for r in runs):
        return None
    if isinstance(first, bool | str):
        return first
    return percentile(sorted(runs), 50)  # nearest-rank median, as everywhere else


def per_entry(footprint: dict[str, Any] | None) -> dict[str, float | None]:
    """Bytes per stored entry: on disk, in the server, of RSS growth (worker median)."""
    out: dict[str, float | None] = {"disk": None, "server": None, "rss": None}
    if not footprint:
        return out
    entries = footprint.get("entries") or 0
    if entries <= 0:
        return out
    disk = footprint.get("disk")
    if disk:
        out["disk"] = disk["bytes"] / entries
    server = footprint.get("server")
    if server and server.get("dataset_bytes") is not None:
        out["server"] = server["dataset_bytes"] / entries
    growth = footprint.get("rss_growth_bytes") or []
    if growth:
        out["rss"] = percentile(sorted(growth), 50) / entries
    return out
