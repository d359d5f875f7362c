"""bench/setup-env.sh, the set-up both README commands run first: its slow steps
(a virtualenv, pip) keep a piped output alive with a line every few seconds.

The interpreter is a stand-in script (``PYTHON``) whose ``-m venv`` and ``-m
pip`` are slow and do nothing else, so the test runs the real shell script
without creating a virtualenv or reaching PyPI.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The stand-in: ``-m venv DIR`` makes DIR/bin/python (itself) after a pause;
# ``-m pip ...`` pauses; anything else succeeds at once.
FAKE_PYTHON = """#!/bin/sh
if [ "$1" = -m ] && [ "$2" = venv ]; then
    sleep 2.5
    mkdir -p "$3/bin" && cp "$0" "$3/bin/python"
elif [ "$1" = -m ] && [ "$2" = pip ]; then
    sleep 2.5
fi
exit 0
"""


def _stand_in_env(tmp_path: Path) -> dict[str, str]:
    """The environment that runs the script with the stand-in interpreter, a
    virtualenv path of its own and a heartbeat every second."""
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PYTHON": str(fake), "DJCB_VENV": str(tmp_path / "venv"),
            "DJCB_HEARTBEAT": "1"}


@pytest.mark.skipif(sys.platform != "linux", reason="a POSIX sh script run as on Debian")
def test_slow_steps_say_they_are_still_running_when_piped(tmp_path: Path) -> None:
    env = _stand_in_env(tmp_path)
    # Sourced as bench/run.sh does; stderr is a pipe here, not a terminal.
    done = subprocess.run(["sh", "-c", '. "$0"', str(ROOT / "bench" / "setup-env.sh")],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert "[djcachebench] creating the virtualenv " + str(tmp_path / "venv") in lines
    assert "[djcachebench] still creating the virtualenv" in lines
    assert "[djcachebench] still installing djcachebench[test,bench]" in lines
    assert (tmp_path / "venv" / ".djcachebench-installed").exists()


def test_no_heartbeat_left_running(tmp_path: Path) -> None:
    """A heartbeat outliving its step would keep writing into the benchmark's output."""
    env = _stand_in_env(tmp_path)
    script = '. "$0"; echo SET-UP >&2; sleep 3; echo END >&2'
    done = subprocess.run(["sh", "-c", script, str(ROOT / "bench" / "setup-env.sh")],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    after = lines[lines.index("SET-UP") + 1:]
    assert after == ["END"], lines
