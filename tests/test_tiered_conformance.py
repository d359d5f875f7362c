"""Django's own cache test suite through TieredCache over a fresh ShardedSQLiteCache.

The ``django-conformance`` tool (not part of this repository; its path in
``$DJANGO_CONFORMANCE``, or found on ``PATH``) downloads the Django sdist from
PyPI into its cache at run time and runs ``tests/cache/tests.py``'s
``BaseCacheTests`` against the backend. Every alias of the suite (prefix,
v2, custom_key, cull, ...) gets the same inline L2, so this also checks that
KEY_PREFIX / VERSION / KEY_FUNCTION / MAX_ENTRIES / CULL_FREQUENCY pass
through to it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(os.environ.get("DJANGO_CONFORMANCE")
            or shutil.which("django-conformance") or "django-conformance")


@pytest.mark.conformance
@pytest.mark.slow
def test_django_cache_suite_through_tiered(tmp_path: Path) -> None:
    if not TOOL.exists():
        if os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}:
            pytest.fail(f"conformance tool missing at {TOOL} (CI must provide it)")
        pytest.skip(f"conformance tool not found at {TOOL} (set $DJANGO_CONFORMANCE "
                    "to its path, or put it on PATH)")
    options = {"L2": {"BACKEND": "djcachebench.backends.sqlite.ShardedSQLiteCache",
                      "LOCATION": str(tmp_path / "sqlite")}}
    proc = subprocess.run(
        [str(TOOL), "--python", sys.executable,
         "--backend", "djcachebench.backends.tiered.TieredCache",
         "--options", json.dumps(options), "--verbosity", "1"],
        capture_output=True, text=True, timeout=900,
    )
    output = proc.stdout + proc.stderr
    closing_line = re.compile(r"\d+ passed, \d+ failed, \d+ skipped")
    closing = [ln for ln in output.splitlines() if closing_line.fullmatch(ln)]
    assert closing == ["54 passed, 0 failed, 0 skipped"], output[-4000:]
    assert proc.returncode == 0, output[-4000:]
