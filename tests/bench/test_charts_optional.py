"""Charts are optional: matplotlib is in the ``[bench]`` extra.

On a plain ``pip install djcachebench``, ``manage.py cachebench``,
``djcachebench stampede`` and ``djcachebench http`` must not run, then crash on
the chart before writing report.md (a guard catching an ImportError that the
chart modules' own import never raises would let them). Each test
hides matplotlib (``sys.modules["matplotlib"] = None`` makes its import
fail) and runs the real command.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from djcachebench.bench.plot import missing_matplotlib


def test_missing_matplotlib_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    assert missing_matplotlib() is None  # the test environment has the extra
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    reason = missing_matplotlib()
    assert reason is not None and "pip install 'djcachebench[bench]'" in reason


@pytest.mark.slow
def test_cachebench_writes_its_report_without_matplotlib(
    tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "files": {"BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
                  "LOCATION": str(tmp_path / "files"), "OPTIONS": {"MAX_ENTRIES": 10_000}},
    }  # fmt: skip
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = tmp_path / "out"
    call_command("cachebench", aliases="files", procs=1, ops=50, out=out)
    assert json.loads((out / "results.json").read_text())["backends"][0]["name"] == "files"
    assert (out / "report.md").exists() and not list(out.glob("*.png"))
    assert "charts skipped" in capsys.readouterr().err


@pytest.mark.slow
def test_stampede_writes_its_report_without_matplotlib(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from djcachebench.bench.cli import main\n"
        f"sys.exit(main(['stampede', '--procs', '2', '--threads', '2', '--compute', '0.05', "
        f"'--repeat', '1', '--backends', 'locmem', '--out', {str(out)!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert (out / "report.md").exists() and not (out / "stampede.png").exists()
    assert "chart skipped" in done.stdout + done.stderr
