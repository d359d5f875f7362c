"""TieredCache under attack: each test is a defect an independent review found.

Every test here failed on the code before its fix (the closing note of the
correctness issue lists how each was checked). They use real files, real
processes and real servers where the defect needs them.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest
from django.core.cache.backends.locmem import LocMemCache

from djcachebench.backends.tiered import TieredCache
from tests.tiered.helpers import locmem_tiered, sqlite_tiered


def _fingerprint_collision(prefix: str) -> tuple[str, str]:
    """Two keys whose final keys (``:1:`` + key) agree on the 32 bits that used to
    tell keys apart on the value board (the high half of an 8-byte BLAKE2b)."""
    seen: dict[bytes, str] = {}
    for i in range(2_000_000):
        key = f"{prefix}{i}"
        fp = hashlib.blake2b(f":1:{key}".encode(), digest_size=8).digest()[4:]
        other = seen.get(fp)
        if other is not None:
            return other, key
        seen[fp] = key
    raise AssertionError("no collision found")


def test_a_colliding_key_never_gets_another_keys_value(tmp_path: Path) -> None:
    """Defect 1: with every key in one slot, a key whose 32-bit fingerprint matched
    another's took that key's value from the value board."""
    a, b = _fingerprint_collision("page-")
    writer = locmem_tiered(tmp_path, GENERATION_SLOTS=1, L1_MAX_ENTRIES=100)
    reader = locmem_tiered(tmp_path, GENERATION_SLOTS=1, L1_MAX_ENTRIES=101)
    writer.set(a, "value of a")
    assert reader.get(a) == "value of a"  # now in the reader's L1
    writer.set(b, "value of b")  # same slot: the reader's entry for a is invalidated
    assert reader.get(a) == "value of a"
    assert reader.get(b) == "value of b"
    assert writer.get(a) == "value of a"


class PausingLocMem(LocMemCache):
    """A LocMemCache whose ``set`` of one key stops after writing, before the
    adapter's stamp: a writer descheduled between its L2 write and its stamp."""

    pause_key: ClassVar[str | None] = None
    written = threading.Event()
    release = threading.Event()
    tiered_returns_what_was_set = True

    def tiered_failure_count(self) -> int:
        return 0

    def set(self, key: Any, value: Any, timeout: Any = None, version: Any = None) -> None:
        super().set(key, value, timeout, version)
        if key == PausingLocMem.pause_key:
            PausingLocMem.written.set()
            PausingLocMem.release.wait(10)


def _pausing(tmp_path: Path, **options: Any) -> TieredCache:
    return TieredCache("", {"OPTIONS": {
        "L2": {"BACKEND": "tests.tiered.test_tiered_attacks.PausingLocMem",
               "LOCATION": str(tmp_path / "l2")},
        "GENERATION_PATH": str(tmp_path / "gen.mmap"), **options}})


def test_racing_writers_never_leave_an_l1_copy_past_the_l2_expiry(tmp_path: Path) -> None:
    """Defect 3: B sets with no timeout and is descheduled before its stamp; C sets
    with timeout=1 and stamps; B's stamp lands last. Readers took the expiry
    from the slot (B's: never) and served C's value after the L2 dropped it."""
    b = _pausing(tmp_path, L1_MAX_ENTRIES=10)
    c = _pausing(tmp_path, L1_MAX_ENTRIES=11)
    reader = _pausing(tmp_path, L1_MAX_ENTRIES=12)
    PausingLocMem.pause_key = "k"
    PausingLocMem.written.clear()
    PausingLocMem.release.clear()
    slow = threading.Thread(target=b.set, args=("k", "from b", None))
    slow.start()
    try:
        assert PausingLocMem.written.wait(10)
        PausingLocMem.pause_key = None
        c.set("k", "from c", 1)
    finally:
        PausingLocMem.release.set()
        slow.join(10)
    assert reader.get("k") == "from c"
    assert reader.get("k") == "from c"
    time.sleep(1.3)
    assert reader.get("k") is None, "an L1 copy outlived the L2 entry"
    assert c.get("k") is None and b.get("k") is None


def test_aincr_is_as_atomic_as_incr(tmp_path: Path) -> None:
    """Defect 7: Django's default aincr reads, adds and sets: 50 tasks x 20 left
    the counter far below 1000, and the TTL was reset."""
    cache = sqlite_tiered(tmp_path)
    cache.set("n", 0, 300)

    async def bump() -> None:
        for _ in range(20):
            await cache.aincr("n")

    async def main() -> None:
        await asyncio.gather(*(bump() for _ in range(50)))

    asyncio.run(main())
    assert cache.get("n") == 1000
    assert cache.l2.get_with_expiry("n")[1] < time.time() + 301  # the TTL was kept
    asyncio.run(cache.adecr("n", 10))
    assert cache.get("n") == 990


def _unpicklable() -> None:
    raise RuntimeError("this value pickles but never unpickles")


class PicklesButDoesNotUnpickle:
    def __reduce__(self) -> tuple:
        return (_unpicklable, ())


def test_a_value_that_does_not_unpickle_is_a_miss_as_in_the_l2(tmp_path: Path) -> None:
    """Defect 10: through the tiered alias, the writing process raised on get of a
    value that pickles but does not unpickle, where the SQLite alias misses."""
    cache = sqlite_tiered(tmp_path)
    cache.set("bad", PicklesButDoesNotUnpickle())
    assert cache.l2.get("bad") is None
    assert cache.get("bad") is None
    assert cache.get_many(["bad"]) == {}


def test_nan_timeout_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """Defect 10: timeout=nan was written and never expired."""
    cache = locmem_tiered(tmp_path)
    for op in (lambda: cache.set("k", "v", float("nan")),
               lambda: cache.add("k", "v", float("nan")),
               lambda: cache.set_many({"k": "v"}, float("nan"))):
        with pytest.raises(ValueError, match="timeout"):
            op()
        assert cache.l2.get("k") is None


def test_a_decimal_nan_timeout_raises_what_the_l2_raises(tmp_path: Path) -> None:
    """TieredCache refused it with ValueError, where its L2 (Django's BaseCache
    arithmetic: float + Decimal) raises TypeError; nothing is written either way."""
    from decimal import Decimal

    from django.core.cache.backends.locmem import LocMemCache

    cache = locmem_tiered(tmp_path)
    for timeout in (Decimal("NaN"), Decimal("1")):
        with pytest.raises(TypeError):
            LocMemCache("decimal", {}).set("k", "v", timeout)
        with pytest.raises(TypeError):
            cache.set("k", "v", timeout)
    assert cache.get("k") is None


@pytest.mark.servers
def test_fractional_timeouts_over_whole_second_redis(tmp_path: Path, redis_server: Any) -> None:
    """Defect 9: Django's RedisCache keeps int(timeout) seconds; the writer's L1
    kept the full fractional timeout (with 0.4 s, a value redis never kept)."""
    cache = TieredCache("", {"OPTIONS": {
        "L2": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
               "LOCATION": redis_server.location, "KEY_PREFIX": f"frac{os.getpid()}"},
        "GENERATION_PATH": str(tmp_path / "gen.mmap")}})
    cache.set("short", "v", 0.4)
    assert cache.l2.get("short") is None  # redis never kept it
    assert cache.get("short") is None
    cache.set("k", "v", 1.9)
    assert cache.get("k") == "v"
    deadline = time.time() + 3
    while cache.l2.get("k") is not None and time.time() < deadline:
        time.sleep(0.02)
    assert cache.l2.get("k") is None
    assert cache.get("k") is None, "the L1 served a value redis had dropped"


@pytest.mark.servers
def test_reads_over_redis_keep_the_server_ttl(tmp_path: Path, redis_server: Any) -> None:
    """A value read from redis is kept in L1 no longer than redis keeps it."""
    opts = {"L2": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                   "LOCATION": redis_server.location, "KEY_PREFIX": f"ttl{os.getpid()}"},
            "GENERATION_PATH": str(tmp_path / "gen.mmap")}
    reader = TieredCache("", {"OPTIONS": {**opts, "L1_MAX_ENTRIES": 77}})
    reader.l2.set("k", "v", 1)  # written past the adapter, with a TTL
    assert reader.get("k") == "v" and reader.get("k") == "v"
    assert reader.stats()["l1_hits"] == 1
    time.sleep(1.2)
    assert reader.get("k") is None


_FULL_DISK_CHILD = textwrap.dedent("""
    import os, sys
    import django
    from django.conf import settings
    settings.configure(SECRET_KEY="x", CACHES={"default": {
        "BACKEND": "django.core.cache.backends.locmem.LocMemCache"}})
    django.setup()
    from djcachebench.backends.tiered import TieredCache
    d = sys.argv[1]
    cache = TieredCache("", {"OPTIONS": {
        "L2": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "GENERATION_PATH": os.path.join(d, "gen.mmap")}})
    cache.set("warm", "up")
    fd = os.open(os.path.join(d, "filler"), os.O_WRONLY | os.O_CREAT)
    try:  # fill the disk to the last block
        while True:
            os.write(fd, b"x" * 4096)
    except OSError:
        os.close(fd)
    for i in range(20000):  # touches every page of the table
        cache.set(f"k{i}", i)
        assert cache.get(f"k{i}") == i
    print("survived", cache.stats()["coherence_faults"])
""")


@pytest.mark.slow
def test_a_full_disk_never_kills_a_process(tmp_path: Path) -> None:
    """Defect 5: the generation table and the value board were sparse files written
    through shared mappings: the first stamp after the disk filled touched an
    unbacked page and the process died of SIGBUS. Runs in a private tmpfs of
    2 MiB (a mount namespace of its own), as root."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a private tmpfs")
    where = tmp_path / "small"
    where.mkdir()
    script = tmp_path / "child.py"
    script.write_text(_FULL_DISK_CHILD)
    shell = (f'mount -t tmpfs -o size=2m tmpfs "{where}" && '
             f'exec "{sys.executable}" "{script}" "{where}"')
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.run(["unshare", "-m", "sh", "-c", shell], capture_output=True,
                          text=True, timeout=120, env=env)
    refused = "permission denied" in proc.stderr.lower() or "not permitted" in proc.stderr
    if proc.returncode != 0 and "mount" in proc.stderr and refused:
        pytest.skip(f"cannot mount a private tmpfs here: {proc.stderr.strip()}")
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    assert "survived" in proc.stdout


def test_touch_and_incr_that_find_nothing_still_stamp(tmp_path: Path) -> None:
    """The stress test's "regressed" reads: a touch or incr told "absent" while a
    delete had committed but not yet stamped, and a later read took the old value
    from an L1. Reporting absence is acknowledging it: the key is stamped."""
    cache = sqlite_tiered(tmp_path)
    l2, table = cache.l2, cache.generation_table
    before = table.token(l2.make_key("gone"))
    assert l2.touch("gone", 10) is False
    after_touch = table.token(l2.make_key("gone"))
    assert after_touch != before
    with pytest.raises(ValueError):
        l2.incr("gone")
    assert table.token(l2.make_key("gone")) != after_touch


def test_instances_per_thread_share_one_table_mapping(tmp_path: Path) -> None:
    """Defect 6: every backend instance opened its own descriptor of the table and
    never closed it; Django builds cache instances per thread, so 300 short-lived
    threads left 600+ descriptors open on generations.mmap."""

    def on_the_table() -> int:
        count = 0
        for name in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{name}")
                count += target.startswith(str(tmp_path)) and "generations" in target
            except OSError:
                continue
        return count

    sqlite_tiered(tmp_path).set("k", "v")
    opened = on_the_table()

    def request() -> None:
        cache = sqlite_tiered(tmp_path)  # what caches["alias"] does in a new thread
        cache.set("k", "v")
        cache.get("k")
        cache.close()

    for _ in range(100):
        thread = threading.Thread(target=request)
        thread.start()
        thread.join()
    assert on_the_table() == opened <= 4


def _write_in_a_new_process(location: str) -> None:
    import django
    from django.conf import settings

    settings.configure(SECRET_KEY="djcachebench-tests-not-secret-0123456789")
    django.setup()
    from tests.tiered.helpers import SQLITE

    cache = TieredCache("", {"OPTIONS": {"L2": {"BACKEND": SQLITE, "LOCATION": location}}})
    cache.set("k", "written after the table was replaced")


@pytest.mark.slow
def test_a_deleted_table_file_is_noticed_before_a_hit_is_served(tmp_path: Path) -> None:
    """The table file deleted under a running process (a cleaner, an operator): a
    process started afterwards creates a new one and stamps only there. The running
    process checks the file's identity at most every CHECK_EVERY, before a hit too,
    so it moves to the new file instead of serving its old entries."""
    import multiprocessing

    from djcachebench.coherence.table import CHECK_EVERY

    cache = sqlite_tiered(tmp_path)
    cache.set("k", "old")
    assert cache.get("k") == "old" and cache.stats()["l1_hits"] == 1
    os.unlink(tmp_path / "sqlite" / "generations.mmap")
    child = multiprocessing.get_context("spawn").Process(
        target=_write_in_a_new_process, args=(str(tmp_path / "sqlite"),))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    time.sleep(CHECK_EVERY * 2)
    assert cache.get("k") == "written after the table was replaced"
    assert cache.stats()["coherence_repairs"] == 1
    cache.set("k", "and back")  # this process stamps the new file now
    assert cache.get("k") == "and back"


def _read_twice_then_again(path: str, store: str, ready: Any, go: Any, out: Any) -> None:
    """A process started after the table was deleted, with another slot count."""
    import django
    from django.conf import settings

    settings.configure(SECRET_KEY="djcachebench-tests-not-secret-0123456789")
    django.setup()
    cache = TieredCache("", {"OPTIONS": {
        "L2": {"BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
               "LOCATION": store},
        "GENERATION_PATH": path, "GENERATION_SLOTS": 1024}})
    out.put((cache.generation_table.slots, cache.get("k"), cache.get("k")))  # an L1 hit
    ready.set()
    go.wait(30)
    out.put(cache.get("k"))


def test_a_process_that_cannot_use_a_recreated_table_still_ends_its_entries(
        tmp_path: Path) -> None:
    """Found by an independent attacker: the table deleted, and recreated by a
    process configured with another GENERATION_SLOTS (a file keeps its own
    count). The running process cannot use the new file, turned its L1 off, and
    from then on its writes stamped nothing: the new process served the value an
    acknowledged write had replaced. Its writes now bump the new file's epoch."""
    import multiprocessing

    path, store = str(tmp_path / "g.mmap"), str(tmp_path / "store")
    cache = TieredCache("", {"OPTIONS": {
        "L2": {"BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
               "LOCATION": store},
        "GENERATION_PATH": path, "GENERATION_SLOTS": 65536}})
    cache.set("k", "v1")
    assert cache.get("k") == "v1"
    os.unlink(path)
    spawn = multiprocessing.get_context("spawn")
    ready, go, out = spawn.Event(), spawn.Event(), spawn.Queue()
    child = spawn.Process(target=_read_twice_then_again, args=(path, store, ready, go, out))
    child.start()
    try:
        assert out.get(timeout=60) == (1024, "v1", "v1")
        assert ready.wait(30)
        cache.set("k", "v2")  # acknowledged
        go.set()
        assert out.get(timeout=30) == "v2"
    finally:
        go.set()
        child.join(30)
    assert cache.get("k") == "v2"  # and its own L1 stays off, reading the L2


def test_a_value_planted_on_the_board_is_not_served(tmp_path: Path) -> None:
    """Defect: whoever could write the value board's file (beside the generation
    table) made every process serve any plain value for any key, although the
    L2's rows (ShardedSQLiteCache) carry integrity tags: a reader whose L1 entry
    a write made stale took the value from the board, unchecked. Board slots are
    tagged under a key derived from SECRET_KEY now; a planted one is not served,
    and the reader goes to the L2."""
    writer = sqlite_tiered(tmp_path, L1_MAX_ENTRIES=100)
    reader = sqlite_tiered(tmp_path, L1_MAX_ENTRIES=101)  # another L1: another process
    writer.set("page", "first version")
    assert reader.get("page") == "first version"  # in the reader's L1
    writer.set("page", "<p>the real page</p>")  # published on the board
    board = writer._board
    assert board is not None
    data = Path(board.path).read_bytes()
    at = data.index(b"<p>the real page</p>")
    with open(board.path, "r+b") as f:  # same length, same token: only the bytes differ
        f.seek(at)
        f.write(b"<p>attacker's page</p>"[:20])
    got = reader.get("page")
    assert got == "<p>the real page</p>", got
    assert reader._board is not None and reader._board.forged >= 1
    assert reader.stats()["board_forged"] >= 1
