"""The harness works from a built wheel, outside the checkout.

Builds the wheel from a copy of the sources (so the shared checkout gets no
``build/``), installs it into a fresh virtualenv, and runs ``djcachebench
list``, a 2-process ``bench`` and a ``sweep`` from a directory outside the
checkout. The virtualenv reaches the already-installed dependencies (Django,
redis, matplotlib...) through a path file appended *after* its own
site-packages, so the package's own files, and its target definitions and
scenarios, can only come from the wheel: the test asserts it. Offline: the
build uses the installed setuptools (``--no-build-isolation``) and
no index.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[2]
SOURCES = ("setup.cfg", "pyproject.toml", "README.md", "docs", "djcachebench", "backends")


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    assert done.returncode == 0, f"{argv} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.slow
def test_wheel_installs_and_runs_outside_the_checkout(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DJCACHEBENCH_ROOT", "PYTHONPATH")}
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        path = CHECKOUT / name
        if path.is_dir():
            shutil.copytree(path, src / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
        elif path.exists():
            shutil.copy2(path, src / name)
    (src / "bench").mkdir()
    shutil.copytree(CHECKOUT / "bench" / "scenarios", src / "bench" / "scenarios")
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
          "--no-index", "-q", "-w", str(dist), str(src)], tmp_path, env)  # fmt: skip
    (wheel,) = dist.glob("djcachebench-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    # The license travels with the wheel (BSD-3-Clause asks for it); the data too.
    assert any(".dist-info/" in n and n.endswith("LICENSE") for n in names), names
    assert any(n.startswith("djcachebench/bench/data/backends/") for n in names)
    assert any(n.startswith("djcachebench/bench/data/scenarios/") for n in names)

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env)
    python = venv / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                     tmp_path, env).strip())  # fmt: skip
    # The dependencies already installed here, after the venv's own site-packages.
    (site / "zz_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index",
          "--no-deps", "-q", f"{wheel}[bench]"], tmp_path, env)  # fmt: skip

    work = tmp_path / "elsewhere"
    work.mkdir()
    probe = (
        "import json, djcachebench; from djcachebench.bench import paths; "
        "print(json.dumps([djcachebench.__file__, str(paths.backends_dir()), "
        "str(paths.scenarios_dir()), paths.backends_dir().is_symlink()]))"
    )
    where = json.loads(_run([str(python), "-c", probe], work, env))
    package, backends, scenarios, linked = where
    for path in (package, backends, scenarios):
        assert Path(path).is_relative_to(site), f"{path} is not from the wheel"
    assert not linked  # copies, not links back to a checkout
    assert not Path(package).is_relative_to(CHECKOUT)

    djcachebench = str(venv / "bin" / "djcachebench")
    listing = _run([djcachebench, "list"], work, env)
    assert "sqlite " in listing and "many-keys" in listing and "api-json" in listing
    _run([djcachebench, "bench", "--procs", "2", "--ops", "50", "--warmup", "10",
          "--backends", "locmem,sqlite", "--no-plot"], work, env)  # fmt: skip
    (run,) = (work / "bench" / "results").iterdir()  # under the current directory
    results = json.loads((run / "results.json").read_text())
    assert [b["name"] for b in results["backends"]] == ["locmem", "sqlite"]
    assert results["backends"][1]["ops"] == 100
    sweep = work / "sweep"
    _run([djcachebench, "sweep", "--vary", "procs=1,2", "--ops", "50", "--warmup", "10",
          "--backends", "locmem", "--no-plot", "--out", str(sweep)], work, env)  # fmt: skip
    assert json.loads((sweep / "sweep.json").read_text())["values"] == [1, 2]
