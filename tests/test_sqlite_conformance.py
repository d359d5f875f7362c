"""Django's own cache test suite, run against ShardedSQLiteCache.

The suite is not copied into this repository: the ``django-conformance``
tool (not part of this repository; its path in ``$DJANGO_CONFORMANCE``, or
found on ``PATH``) fetches the Django sdist matching the installed Django from
PyPI at run time, caches it under /tmp, and runs ``tests/cache/tests.py`` with
Django's test runner against the backend, ending its output with the line
``N passed, N failed, N skipped``. Without the tool these tests are skipped
(failed when ``CI=true``). Every alias of Django's test CACHES (default,
prefix, v2, custom_key, custom_key2, cull, zero_cull) gets our backend, so
``test_cull`` and ``test_zero_cull`` pin culling across shards.

Pinned: with the default shard count, one shard and sixteen shards, all 54
tests pass and none is skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from djcachebench.backends.sqlite import BACKEND_PATH

TOOL = Path(os.environ.get("DJANGO_CONFORMANCE")
            or shutil.which("django-conformance") or "django-conformance")
EXPECTED = "54 passed, 0 failed, 0 skipped"
# One run takes ~15 s on an idle machine; the bound only stops a hang.
RUN_DEADLINE = 600


def _tool() -> Path:
    if not TOOL.exists():
        message = (f"django-conformance not found at {TOOL} (set $DJANGO_CONFORMANCE "
                   "to its path, or put it on PATH)")
        if os.environ.get("CI") == "true":
            pytest.fail(message + " (required in CI)")
        pytest.skip(message)
    return TOOL


@pytest.mark.conformance
@pytest.mark.slow
@pytest.mark.parametrize("shards", [None, 1, 16], ids=["shards-default", "shards-1", "shards-16"])
def test_django_cache_suite_passes(shards: int | None, tmp_path: Path) -> None:
    """Django's cache tests: exit code 0 and the closing line ``54 passed, 0 failed, 0 skipped``."""
    tool = _tool()
    location = tmp_path / "cache"
    cmd = [str(tool), "--python", sys.executable, "--backend", BACKEND_PATH,
           "--location", str(location), "--verbosity", "1"]
    if shards is not None:
        cmd += ["--options", json.dumps({"SHARDS": shards})]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_DEADLINE,
                          check=False)
    output = proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert proc.returncode == 0, output[-6000:]
    assert lines and lines[-1].strip() == EXPECTED, output[-6000:]
