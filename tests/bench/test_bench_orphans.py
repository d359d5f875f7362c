"""A SIGKILLed harness leaves no server and no worker behind (Linux).

``kill -9`` of ``djcachebench bench``'s main process must not leave
redis-server, memcached and the worker processes running (no ``finally`` block
runs on SIGKILL). The run here is the real command; its
children are found in /proc while the workers measure, then the harness alone
is SIGKILLed and every child must be gone within a few seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from djcachebench.bench.orphans import die_with_parent
from djcachebench.bench.servers import find_binary

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl: Linux")


def children(pid: int) -> dict[int, str]:
    """Live (not zombie) processes whose parent is ``pid``: {pid: command name}."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
        state, ppid = rest.split()[:2]
        if int(ppid) == pid and state != "Z":
            out[int(entry.name)] = name
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_die_with_parent_is_available_here() -> None:
    assert die_with_parent() is True


@pytest.mark.slow
@pytest.mark.servers
def test_sigkill_of_the_harness_leaves_no_server_nor_worker(tmp_path: Path) -> None:
    if find_binary("redis-server") is None:
        pytest.skip("redis-server not found on PATH")
    proc = subprocess.Popen(
        [sys.executable, "-m", "djcachebench", "bench", "--backends", "redis", "--procs", "2",
         "--ops", "2000000", "--warmup", "0", "--out", str(tmp_path / "out"), "--no-plot",
         "--no-progress"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path,
        # A SIGKILLed harness cannot remove its working directories: keep them
        # in this test's directory, not in the machine's /tmp.
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    found: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            found = children(proc.pid)
            if "redis-server" in found.values() and len(found) >= 3:  # server + 2 workers
                break
            time.sleep(0.2)
        assert "redis-server" in found.values() and len(found) >= 3, found
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        # A worker caught still starting (spawn imports Django and this package
        # before it runs anything of ours) only learns of the death when it gets
        # that far: seconds on a loaded machine. Left for good is what fails.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(alive(pid) for pid in found):
            time.sleep(0.1)
        left = {pid: name for pid, name in found.items() if alive(pid)}
        assert not left, f"left running after SIGKILL of the harness: {left}"
        assert sorted(found.values()).count("redis-server") == 1
    finally:
        for pid in [*found, *children(proc.pid), proc.pid]:
            if alive(pid):  # the harness's own children only: listed by their parent
                os.kill(pid, signal.SIGKILL)
