"""Fork while other threads of the process use ShardedSQLiteCache (store/forkgate.py).

Found by an independent attacker: a child forked while another thread was inside
SQLite inherited SQLite's process-wide mutexes locked, and blocked for good on
its first SQLite call (3 of 12 children). On the code before the gate, this
test sees hung children in nearly every run (each fork has a ~1 in 4 chance).
"""

from __future__ import annotations

import os
import select
import threading
import time
from pathlib import Path

from djcachebench.backends.sqlite import ShardedSQLiteCache

from .sqlite_helpers import PATIENT

FORKS = 20
CHILD_BOUND = 60.0  # seconds a child may take before it counts as hung


def _child(cache: ShardedSQLiteCache, out: int) -> None:
    try:
        good = 0
        for i in range(16):
            cache.set(f"child{i}", "v")
            good += cache.get(f"child{i}") == "v"
        os.write(out, b"%d" % good)
    finally:
        os._exit(0)


def test_a_child_forked_while_threads_use_the_cache_does_not_block(tmp_path: Path) -> None:
    location = str(tmp_path / "cache")
    # Patient lock waits: the parent's threads go on writing the same shards
    # while a child writes, and on a loaded machine a give-up would be taken
    # for the defect this test is about.
    cache = ShardedSQLiteCache(location, {"OPTIONS": {"SHARDS": 4, **PATIENT}})
    stop = threading.Event()

    def busy(n: int) -> None:
        j = 0
        while not stop.is_set():
            cache.set(f"busy{n}-{j % 20}", j)
            cache.get(f"busy{n}-{(j * 7) % 20}")
            j += 1

    threads = [threading.Thread(target=busy, args=(n,), daemon=True) for n in range(3)]
    for t in threads:
        t.start()
    outcomes = []
    try:
        for _ in range(FORKS):
            time.sleep(0.05)
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read)
                _child(cache, write)
            os.close(write)
            # poll, not select: the suite's process may hold over 1,024 descriptors.
            poller = select.poll()
            poller.register(read, select.POLLIN)
            ready = poller.poll(CHILD_BOUND * 1000)
            got = os.read(read, 16) if ready else b"hung"
            os.close(read)
            if not ready:
                os.kill(pid, 9)
            os.waitpid(pid, 0)
            outcomes.append(got.decode())
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert outcomes == ["16"] * FORKS, outcomes
