"""Shared helpers of the harness tests that run ``djcachebench`` as a command."""

from __future__ import annotations

import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def project_with_target(tmp_path: Path, name: str, source: str) -> dict[str, str]:
    """A ``DJCACHEBENCH_ROOT`` holding the repository's scenarios, its ``locmem``
    target and one more target ``name`` (``backends/<name>.py`` = ``source``),
    and the environment that runs the command on it."""
    root = tmp_path / "root"
    (root / "backends").mkdir(parents=True)
    shutil.copy(REPO / "backends" / "locmem.py", root / "backends" / "locmem.py")
    (root / "backends" / f"{name}.py").write_text(source)
    shutil.copytree(REPO / "bench" / "scenarios", root / "bench" / "scenarios")
    env = {"DJCACHEBENCH_ROOT": str(root), "PYTHONPATH": f"{root / 'backends'}:{REPO}",
           "PATH": "/usr/local/bin:/usr/bin:/bin"}  # fmt: skip
    return env
