"""Entry points of the child processes started by the ShardedSQLiteCache tests.

Every function runs in a process started with the ``spawn`` context: it gets
plain arguments, configures Django itself (``settings.configure`` +
``django.setup()``) and reaches the backend as an application would, through
``caches["default"]``. A child reports failure through its exit code (an
uncaught exception exits 1), so the parent's assertion is on exit codes and
on what the children sent back. Each loop has its own bound, so an orphaned
child can never run for ever.
"""

from __future__ import annotations

import sqlite3
import time
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Barrier, Event
from typing import Any

SECRET_KEY = "djcachebench-tests-not-secret-0123456789"  # as tests/settings.py
BACKEND_PATH = "djcachebench.backends.sqlite.ShardedSQLiteCache"
# A child never runs longer than this, whatever happens to its parent.
MAX_CHILD_SECONDS = 120.0


def child_cache(location: str, options: dict[str, Any]) -> Any:
    """Configure Django in this fresh process and return ``caches["default"]``."""
    import django
    from django.conf import settings

    settings.configure(
        SECRET_KEY=SECRET_KEY,
        USE_TZ=True,
        CACHES={"default": {"BACKEND": BACKEND_PATH, "LOCATION": location, "OPTIONS": options}},
    )
    django.setup()
    from django.core.cache import caches

    return caches["default"]


def incr_worker(
    location: str, options: dict[str, Any], key: str, times: int, barrier: Barrier
) -> None:
    """``incr(key)`` ``times`` times, starting together with the other workers."""
    cache = child_cache(location, options)
    barrier.wait(60)
    for _ in range(times):
        cache.incr(key)


def add_race_worker(
    location: str,
    options: dict[str, Any],
    name: str,
    keys: list[str],
    barrier: Barrier,
    results: Connection,
) -> None:
    """For each key, wait for every racer, then ``add(key, name)``; send the keys won."""
    cache = child_cache(location, options)
    won: list[str] = []
    for key in keys:
        barrier.wait(60)
        if cache.add(key, name):
            won.append(key)
    results.send(won)
    results.close()


def acked_writer(location: str, options: dict[str, Any], prefix: str, acks: Connection) -> None:
    """Write until killed; acknowledge each write only after the cache call returned.

    Every fifth round stores a batch with ``set_many`` (only the keys it did
    not report as failed are acknowledged). The options carry
    ``RAISE_ON_TIMEOUT`` so a give-up raises instead of silently not storing;
    such a write is simply not acknowledged. One ``send`` of a small message
    is one ``write()`` to the pipe, so the parent receives a whole
    acknowledgement or none of it.
    """
    from djcachebench.store.retry import ShardLockTimeout

    cache = child_cache(location, options)
    end = time.monotonic() + MAX_CHILD_SECONDS
    n = 0
    while time.monotonic() < end:
        try:
            if n % 5 == 4:
                batch = {
                    f"{prefix}-{n}-{j}": f"{prefix}:{n}:{j}:" + "b" * (n % 97) for j in range(4)
                }
                failed = set(cache.set_many(batch))
                acked = [(k, v) for k, v in batch.items() if k not in failed]
            else:
                key, value = f"{prefix}-{n}", f"{prefix}:{n}:" + "x" * (n % 311)
                cache.set(key, value)
                acked = [(key, value)]
        except ShardLockTimeout:
            acked = []
        if acked:
            acks.send(acked)
        n += 1


def hold_shard_lock(path: str, how: str, ready: Event, release: Event) -> None:
    """Lock one shard file from another process until ``release`` (or a bound).

    ``how``:
    - ``"write"``: ``BEGIN IMMEDIATE`` + a write, left uncommitted. Holds the
      WAL write lock: other writers get SQLITE_BUSY, readers are NOT blocked
      (WAL lets readers see the last commit while a write is open).
    - ``"exclusive"``: ``PRAGMA locking_mode=EXCLUSIVE`` + a committed write.
      The connection then keeps an exclusive lock on the database file and
      never releases it: a *new* connection cannot even read the schema
      (SQLITE_BUSY), so reads and writes both wait. It can only be taken
      while no other connection has the file open (every open WAL connection
      holds a shared lock on it), so the test closes its own first.
    """
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    try:
        if how == "exclusive":
            conn.execute("PRAGMA locking_mode=EXCLUSIVE")
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("UPDATE meta SET entries = entries WHERE id = 0")
            conn.execute("COMMIT")
        elif how == "write":
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("UPDATE meta SET entries = entries WHERE id = 0")
        else:
            raise ValueError(how)
        ready.set()
        release.wait(MAX_CHILD_SECONDS)
    finally:
        conn.close()


def disk_full_writer(
    location: str, options: dict[str, Any], kept: dict[str, str], big: int, results: Connection
) -> None:
    """Write large values with no room left on "disk"; send back what each call did.

    The room is taken away with ``RLIMIT_FSIZE``: no file of this process may
    grow past the largest shard file (or its WAL) plus 64 KiB, so a write
    that needs more fails in ``write()`` (EFBIG) exactly as on a full disk
    (ENOSPC), with the real files and the real SQLite. ``SIGXFSZ``, which
    would kill the process instead, is ignored, as a server would.
    """
    import os
    import resource
    import signal

    cache = child_cache(location, options)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    largest = max(
        entry.stat().st_size for entry in os.scandir(location) if entry.name.startswith("shard-")
    )
    resource.setrlimit(resource.RLIMIT_FSIZE, (largest + 64 * 1024, resource.RLIM_INFINITY))
    value = "x" * big
    raised: list[str] = []
    for i in range(20):
        try:
            cache.set(f"big{i}", value)
        except Exception as exc:  # the test asserts there is none
            raised.append(repr(exc))
    try:
        read_back = {key: cache.get(key) for key in kept}
        big_values = [cache.get(f"big{i}") for i in range(20)]
    except Exception as exc:
        raised.append(repr(exc))
        read_back, big_values = {}, []
    results.send(
        {
            "raised": raised,
            "kept": sum(read_back.get(k) == v for k, v in kept.items()),
            "big_torn": sum(v is not None and v != value for v in big_values),
            "errors": cache.stats()["errors"],
        }
    )


def filling_writer(
    location: str,
    options: dict[str, Any],
    prefix: str,
    count: int,
    barrier: Barrier,
    results: Connection,
    started: Any,
    done: Any,
) -> None:
    """Insert ``count`` new keys, all writers at once; send the largest count seen.

    The count is taken after every insert from the shards' own ``meta`` rows
    (exact, kept by triggers), read only: the shared copy the writers decide
    on is left as they leave it. The shards are read one after another, so a
    sample may count rows a cull removed from a shard read early together with
    inserts made into a shard read late: it exceeds the count at its start by
    at most the inserts committed while it was taken. Those are at most the
    inserts started (``started``, counted by every writer before its set) by
    the sample's end less those done (``done``, counted after) at its start,
    and are taken off: what is sent never exceeds a true count, however long
    a loaded machine stalls a sampling writer. Every writer sampling after
    every insert is what makes a peak hard to miss.
    """
    cache = child_cache(location, options)
    store = cache._store
    barrier.wait(60)
    largest = 0
    for i in range(count):
        with started.get_lock():
            started.value += 1
        cache.set(f"{prefix}-{i}", i)
        with done.get_lock():
            done.value += 1
        before = done.value
        sample = sum(
            store.pool.get(j).execute("SELECT entries FROM meta").fetchone()[0]
            for j in range(store.n)
        )
        largest = max(largest, sample - (started.value - before))
    results.send(largest)
    results.close()


def keyed_cache(
    location: str, options: dict[str, Any], secret_key: str, fallbacks: list[str]
) -> Any:
    """Like :func:`child_cache`, with this process's own SECRET_KEY and fallbacks."""
    import django
    from django.conf import settings

    settings.configure(
        SECRET_KEY=secret_key,
        SECRET_KEY_FALLBACKS=fallbacks,
        USE_TZ=True,
        CACHES={"default": {"BACKEND": BACKEND_PATH, "LOCATION": location, "OPTIONS": options}},
    )
    django.setup()
    from django.core.cache import caches

    return caches["default"]


def rotated_key_worker(
    location: str,
    options: dict[str, Any],
    secret_key: str,
    fallbacks: list[str],
    key: str,
    results: Connection,
) -> None:
    """Read ``key`` and try to ``add`` it under its own SECRET_KEY; send what happened."""
    cache = keyed_cache(location, options, secret_key, fallbacks)
    results.send(
        {
            "get": cache.get(key, "<miss>"),
            "has_key": cache.has_key(key),
            "add": cache.add(key, f"taken with {secret_key}"),
            "tampered": cache.stats()["tampered"],
        }
    )
    results.close()


def wait_for_value(
    location: str, options: dict[str, Any], key: str, want: str, ready: Event, results: Connection
) -> None:
    """Read ``key`` (a warm connection), signal ``ready``, then poll until it reads
    ``want``; send how long that took after ``ready``, or ``None`` if it never did."""
    cache = child_cache(location, options)
    first = cache.get(key)
    ready.set()
    start = time.monotonic()
    end = start + 30.0
    seen = None
    while time.monotonic() < end:
        if cache.get(key) == want:
            seen = time.monotonic() - start
            break
        time.sleep(0.02)
    results.send({"first": first, "seen_after": seen, "reopened": cache.stats().get("reopened")})
    results.close()


def large_value_writer(
    location: str, options: dict[str, Any], prefix: str, acks: Connection
) -> None:
    """Write, replace and delete large values (stored in files) until killed.

    Each value is ``key || counter`` padded to 40-400 KB, so a reader can tell
    a value of this key from any other; each ``set`` is acknowledged with the
    value's counter after it returned (and each ``delete`` with ``None``).
    """
    import random

    cache = child_cache(location, options)
    rng = random.Random(prefix)
    end = time.monotonic() + MAX_CHILD_SECONDS
    n = 0
    while time.monotonic() < end:
        key = f"{prefix}-{rng.randrange(6)}"
        n += 1
        if rng.random() < 0.2:
            cache.delete(key)
            acks.send((key, None))
        else:
            head = f"{key}|{n}|".encode()
            cache.set(key, head + bytes(rng.randrange(40_000, 400_000)))
            acks.send((key, n))


def blob_value_writer(
    location: str, options: dict[str, Any], prefix: str, acks: Connection
) -> None:
    """Set, set_many, add and delete values of 1-30 KB (held in ``blobs``) until
    killed; each value starts with ``key|counter|``, so a reader can tell a value
    of this key from any other. Each call is acknowledged after it returned."""
    import random

    cache = child_cache(location, options)
    rng = random.Random(prefix)
    end = time.monotonic() + MAX_CHILD_SECONDS
    n = 0

    def value(key: str) -> bytes:
        return f"{key}|{n}|".encode() + bytes(rng.randrange(1_000, 30_000))

    while time.monotonic() < end:
        key = f"{prefix}-{rng.randrange(8)}"
        n += 1
        roll = rng.random()
        if roll < 0.15:
            cache.delete(key)
        elif roll < 0.3:
            cache.add(key, value(key))
        elif roll < 0.45:
            other = f"{prefix}-{rng.randrange(8)}"
            cache.set_many({key: value(key), other: value(other)})
        else:
            cache.set(key, value(key))
        acks.send(n)


def replaced_value(key: str, n: int) -> bytes:
    """Version ``n`` of ``key``'s value for :func:`large_value_replacer`: 1-4 MB
    (always a file value), whole only if every byte is where it belongs."""
    head = f"{key}|{n}|".encode()
    return head + bytes([n % 251]) * (1_000_000 + (n * 7919) % 3_000_000)


def large_value_replacer(
    location: str, options: dict[str, Any], keys: list[str], first: int, acks: Connection
) -> None:
    """Replace the values of ``keys`` in turn until killed: write number ``first + i``
    stores :func:`replaced_value` of ``keys[i % len(keys)]`` and is acknowledged
    with ``i`` after ``set`` returned. So the parent knows which write was in
    flight when it killed this process: the one after the last acknowledged."""
    cache = child_cache(location, options)
    end = time.monotonic() + MAX_CHILD_SECONDS
    i = 0
    acks.send(-1)  # ready
    while time.monotonic() < end:
        key = keys[i % len(keys)]
        cache.set(key, replaced_value(key, first + i))
        acks.send(i)
        i += 1


def read_back(location: str, options: dict[str, Any], keys: list[str],
              results: Connection) -> None:
    """Send what another process reads of ``keys``: ``get``, ``get_many``, ``has_key``."""
    cache = child_cache(location, options)
    results.send({
        "get": {k: cache.get(k) for k in keys},
        "get_many": cache.get_many(keys),
        "has_key": {k: cache.has_key(k) for k in keys},
    })


def disk_full_replacer(location: str, options: dict[str, Any], key: str, big: int,
                       results: Connection) -> None:
    """Replace ``key`` with a value that cannot fit on the "disk" (``RLIMIT_FSIZE``,
    as ``disk_full_writer``), then send what this process reads of it."""
    import os
    import resource
    import signal

    cache = child_cache(location, options)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    largest = max(
        entry.stat().st_size for entry in os.scandir(location) if entry.name.startswith("shard-")
    )
    resource.setrlimit(resource.RLIMIT_FSIZE, (largest + 64 * 1024, resource.RLIM_INFINITY))
    cache.set(key, "x" * big)
    results.send({"read": cache.get(key), "errors": cache.stats()["errors"],
                  "voided": cache.stats()["voided"]})


def late_writer_dies(location: str, options: dict[str, Any], key: str, size: int) -> None:
    """A writer stalled past ``PENDING_AGE`` after registering its file's name (its
    name reclaimed meanwhile, as another process's collection does then), that
    creates its file and is killed before its row commits."""
    import os
    import signal

    from djcachebench.backends.sqlite import ShardedSQLiteCache

    writer = child_cache(location, options)
    other = ShardedSQLiteCache(location, {"OPTIONS": options})
    index = writer._store.route(writer.make_key(key))
    files = writer._store.shards[index].files
    write = files.write

    def late_write(name: str, payload: bytes) -> None:
        collector = other._store
        collector.shards[index].files.collect(collector.pool.get(index), pending_age=0.0)
        write(name, payload)
        os.kill(os.getpid(), signal.SIGKILL)

    files.write = late_write
    writer.set(key, b"x" * size, None)


def serving_worker(location: str, options: dict[str, Any], conn: Connection) -> None:
    """A process serving the cache on command, as a worker serves requests.

    Sends ``("ready", None)`` once built, or ``("refused", message)`` if
    building it raised (``ImproperlyConfigured``), then answers each command
    ``(op, args)`` with ``("ok", result)``: ``set_many`` / ``get_many`` /
    ``add_each`` (a dict key -> whether ``add`` stored it) / ``stats`` /
    ``exit``.
    """
    try:
        cache = child_cache(location, options)
        cache.get("warm")  # built lazily by Django: build it now
    except Exception as exc:  # reported to the test, which asserts on it
        conn.send(("refused", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", None))
    ends = time.monotonic() + MAX_CHILD_SECONDS
    while time.monotonic() < ends:
        if not conn.poll(1.0):
            continue
        op, args = conn.recv()
        if op == "exit":
            return
        if op == "set_many":
            result: Any = cache.set_many(args)
        elif op == "get_many":
            result = {k: cache.get(k) for k in args}
        elif op == "add_each":
            result = {k: cache.add(k, v) for k, v in args.items()}
        elif op == "stats":
            result = cache.stats()
        else:
            raise ValueError(op)
        conn.send(("ok", result))

def wal_writer(location: str, options: dict[str, Any], seed: int, keys: int, sets: int,
               sizes: tuple[int, int], barrier: Barrier) -> None:
    """Replace random keys of ``keys`` with random values of ``sizes`` bytes, ``sets``
    times, starting with the other writers and readers."""
    import random

    cache = child_cache(location, options)
    rng = random.Random(seed)
    values = [rng.randbytes(rng.randint(*sizes)) for _ in range(32)]
    cache.get("warm-up")
    barrier.wait(60)
    ends = time.monotonic() + MAX_CHILD_SECONDS
    for _ in range(sets):
        cache.set(f"k{rng.randrange(keys)}", rng.choice(values), None)
        if time.monotonic() > ends:
            break


def wal_reader(location: str, options: dict[str, Any], seed: int, keys: int, barrier: Barrier,
               stop: Event, reads: Connection) -> None:
    """Get random keys of ``keys`` without a pause until ``stop``; send how many hit."""
    import random

    cache = child_cache(location, options)
    rng = random.Random(seed)
    cache.get("warm-up")
    barrier.wait(60)
    ends = time.monotonic() + MAX_CHILD_SECONDS
    hits = 0
    while not stop.is_set() and time.monotonic() < ends:
        for _ in range(50):
            hits += cache.get(f"k{rng.randrange(keys)}") is not None
    reads.send(hits)
