"""The generation table's file under running processes: a full disk kills none of them,
instances made per thread share one mapping, and a table file deleted, or recreated
with another slot count, never lets an L1 serve a value a write replaced.

The tests use real files and real processes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from djcachebench.backends.tiered import TieredCache
from tests.tiered.helpers import sqlite_tiered

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
    """The table deleted, and recreated by a process configured with another
    GENERATION_SLOTS (a file keeps its own count): the running process cannot use
    the new file and turns its L1 off, but its writes still bump the new file's
    epoch; if they stamped nothing, the new process would serve the value an
    acknowledged write had replaced."""
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
