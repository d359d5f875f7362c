"""results.json names the servers, the cache files' filesystem and a dirty tree.

A redis figure says which redis-server (version, options) it came from, a
disk cache's figure on what filesystem its files were, and whether the
checkout had changes is more than a ``+dirty`` suffix.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from djcachebench.bench.provenance import filesystem_of
from djcachebench.bench.servers import find_binary


def test_the_filesystem_is_the_longest_mount_holding_the_path() -> None:
    assert filesystem_of("/proc/self") == {"path": str(Path("/proc/self").resolve()),
                                           "mount": "/proc", "fstype": "proc"}  # fmt: skip
    root = filesystem_of("/")
    assert root["mount"] == "/" and root["fstype"]


@pytest.mark.slow
@pytest.mark.servers
def test_results_record_server_versions_commands_filesystem_and_dirty(tmp_path: Path) -> None:
    if find_binary("redis-server") is None:
        pytest.skip("redis-server not found on PATH")
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "djcachebench", "bench", "--backends", "redis", "--procs", "2",
         "--ops", "200", "--out", str(out), "--no-plot"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((out / "results.json").read_text())
    redis = data["machine"]["servers"]["redis"]
    assert redis["version"].startswith("Redis server v=")
    assert redis["command"][0].endswith("redis-server") and "--port" in redis["command"]
    fs = data["machine"]["cache_dir"]
    assert fs["fstype"] and fs["mount"] and fs["path"].startswith(fs["mount"])
    assert isinstance(data["tool"]["dirty"], bool)
    assert data["tool"]["dirty"] == data["tool"]["git"].endswith("+dirty")
    report = (out / "report.md").read_text()
    assert f"on {fs['fstype']} filesystem" in report and "redis: Redis server v=" in report
