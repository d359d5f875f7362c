"""The command as a user runs it: every target, real servers, files in --out.

This is the issue's acceptance run: ``djcachebench bench --procs 2 --ops 300
--out DIR`` runs every target (memcached and redis included) and writes
results.json, report.md and the PNG charts. Our own backends must run as soon
as their modules exist; in CI (``CI=true``) the servers must too.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.cache.backends.filebased import FileBasedCache
from django.core.cache.backends.locmem import LocMemCache
from django.core.management import CommandError, call_command

from djcachebench.bench.cli import main

CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
OURS = {
    "sqlite": ["djcachebench.backends.sqlite"],
    "sqlite-floor": ["djcachebench.bench.floor"],
    "tiered": ["djcachebench.backends.tiered", "djcachebench.backends.sqlite"],
    "tiered-redis": ["djcachebench.backends.tiered"],
}


def _present(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


@pytest.mark.slow
@pytest.mark.servers
def test_bench_runs_every_target_and_writes_its_files(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "djcachebench", "bench", "--procs", "2", "--ops", "300",
         "--out", str(out)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("results.json", "report.md", "get.png", "set.png", "delete.png",
                 "throughput.png", "get-percentiles.png", "set-percentiles.png"):  # fmt: skip
        assert (out / name).stat().st_size > 0, name

    data = json.loads((out / "results.json").read_text())
    ran = {b["name"] for b in data["backends"]}
    skipped = {s["name"]: s["reason"] for s in data["skipped"]}
    assert ran | set(skipped) == set(data["targets"]) and len(data["targets"]) == 11
    assert {"locmem", "filebased", "db", "diskcache"} <= ran, skipped
    for name in ("memcached", "redis"):
        if CI or name not in skipped or "not found on PATH" not in skipped[name]:
            assert name in ran, skipped
    for name, modules in OURS.items():
        if all(_present(m) for m in modules):
            assert name in ran, skipped  # landed on main: must run
        else:
            assert skipped[name].startswith("module not importable"), skipped[name]
    for backend in data["backends"]:
        assert backend["ops"] == 600
        assert backend["actions"]["get"]["count"] > 0
    assert "report:" in proc.stdout and "| Action | Count |" in (out / "report.md").read_text()
    assert "Median" in proc.stdout  # the tables are printed too

    # `djcachebench plot` re-draws from the file alone.
    again = tmp_path / "again"
    assert main(["plot", str(out / "results.json"), "--out", str(again)]) == 0
    assert sorted(p.name for p in again.glob("*.png")) == [
        "delete-percentiles.png", "delete.png", "get-percentiles.png", "get.png",
        "hit-rate.png", "set-percentiles.png", "set.png", "throughput.png"
    ]  # fmt: skip


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--backends", "nope", "--out", "/tmp/unused-djcb"]) == 2
    assert "unknown target(s) ['nope']" in capsys.readouterr().err
    assert main(["bench", "--scenario", "nope"]) == 2
    assert "no scenario 'nope'" in capsys.readouterr().err


def test_version_is_the_packages(capsys: pytest.CaptureFixture[str]) -> None:
    import djcachebench

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"djcachebench {djcachebench.__version__}"


def test_list_shows_targets(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("locmem")
    assert "[needs redis]" in out


@pytest.mark.slow
def test_management_command_benchmarks_the_projects_caches(
    tmp_path: Path, settings: object
) -> None:
    settings.CACHES = {  # type: ignore[attr-defined]
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "files": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": str(tmp_path / "files"),
            "OPTIONS": {"MAX_ENTRIES": 10_000},
        },
    }
    # Under override_settings there is no settings module: the command hands the
    # overridden CACHES to the workers explicitly.
    out = tmp_path / "out"
    from django.core.cache import caches

    project = caches["files"]
    project.set_many({f"project-{i}": i for i in range(50)}, None)
    stdout = io.StringIO()
    call_command("cachebench", aliases="files", procs=2, ops=100, out=out, stdout=stdout)
    data = json.loads((out / "results.json").read_text())
    assert [b["name"] for b in data["backends"]] == ["files"]
    assert data["scenario"]["key_prefix"] == "djcachebench:"
    # It ends by listing every file it wrote, as `djcachebench bench` does.
    charts = sorted(out.glob("*.png"))
    assert charts and sorted(p.name for p in out.iterdir()) == sorted(
        ["results.json", "report.md", *(c.name for c in charts)])
    listed = stdout.getvalue().split("\nresults: ", 1)[1].splitlines()
    assert listed[0] == str(out / "results.json")
    assert sorted(listed[1:-1]) == [f"chart:   {c}" for c in charts]
    assert listed[-1] == f"report:  {out / 'report.md'}"
    # The project's entries are there; the workload's keys are gone.
    assert project.get_many([f"project-{i}" for i in range(50)]) == {
        f"project-{i}": i for i in range(50)}
    assert len(list((tmp_path / "files").iterdir())) == 50


def _files_cache(settings: Any, tmp_path: Path, max_entries: int, backend: str = "") -> None:
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "files": {"BACKEND": backend or "django.core.cache.backends.filebased.FileBasedCache",
                  "LOCATION": str(tmp_path / "files"),
                  "OPTIONS": {"MAX_ENTRIES": max_entries}},
    }


def test_management_command_refuses_a_cache_it_would_cull(
        tmp_path: Path, settings: Any) -> None:
    """A pre-fill of 400 keys into a cache of MAX_ENTRIES 200 would cull most of
    the project's own entries, unannounced: the command refuses it."""
    _files_cache(settings, tmp_path, 200)
    with pytest.raises(CommandError, match=r"MAX_ENTRIES 200.*--keys 100.*--allow-eviction"
                       ) as refused:
        call_command("cachebench", aliases="files", keys=400, procs=2, ops=100,
                     out=tmp_path / "out", no_plot=True)
    assert refused.value.returncode == 2  # bad input, as the README says
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("stop", "status"), [("interrupt", 130), ("terminate", 143)])
def test_management_command_exit_status_tells_ctrl_c_from_sigterm(
        stop: str, status: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """As ``djcachebench bench``: 130 after Ctrl-C, 143 after SIGTERM (which takes
    Ctrl-C's clean-up path as ``Terminated``), so a supervisor can tell its own
    signal from a user's."""
    from djcachebench.bench.signals import Terminated
    from djcachebench.management.commands.cachebench import Command

    def stopped(self: Command, **options: Any) -> list[str]:
        raise KeyboardInterrupt if stop == "interrupt" else Terminated

    monkeypatch.setattr(Command, "_handle", stopped)
    with pytest.raises(CommandError) as ended:
        call_command("cachebench")
    assert ended.value.returncode == status


@pytest.mark.slow
def test_management_command_fails_when_an_alias_fails(tmp_path: Path, settings: Any) -> None:
    """An alias whose every call raises is reported FAILED and the command exits
    1, not 0."""
    _files_cache(settings, tmp_path, 10_000, "tests.bench.test_bench_cli.BrokenCache")
    with pytest.raises(CommandError, match="failed: files") as failed:
        call_command("cachebench", aliases="files", procs=2, ops=100, out=tmp_path / "out",
                     no_plot=True)
    assert failed.value.returncode == 1
    assert (tmp_path / "out" / "results.json").exists()


class BrokenCache(LocMemCache):
    """Every call raises, as a cache whose server is down."""

    def get(self, *args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("down")

    set = delete = add = incr = get_many = set_many = delete_many = get


class WrongValueCache(FileBasedCache):
    """Answers every hit with a value the workload never stored."""

    def get(self, key: Any, default: Any = None, version: Any = None) -> Any:
        found = super().get(key, default, version)
        return found if found is default else "not what was stored"


@pytest.mark.slow
def test_management_command_checks_the_values_it_reads(tmp_path: Path, settings: Any) -> None:
    """A cache the command may not clear is still checked, so the report's Wrong
    column does not say 0 for a cache that returns other values: the command
    deletes its own keys first and checks."""
    _files_cache(settings, tmp_path, 10_000, "tests.bench.test_bench_cli.WrongValueCache")
    with pytest.raises(CommandError, match="failed: files") as failed:
        call_command("cachebench", aliases="files", procs=2, ops=100, out=tmp_path / "out",
                     no_plot=True)
    assert failed.value.returncode == 1
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["backends"][0]["actions"]["get"]["wrong"] > 0


@pytest.mark.slow
def test_management_command_holds_a_locmem_alias_to_its_own_writes(
        tmp_path: Path, settings: Any) -> None:
    """A project's LocMemCache is private to each worker, as the locmem target is:
    answers made stale by the other process's writes are noted, not held against it."""
    _files_cache(settings, tmp_path, 10_000)
    call_command("cachebench", aliases="default", procs=2, ops=400, keys=20,
                 out=tmp_path / "out", no_plot=True)  # fmt: skip
    (backend,) = json.loads((tmp_path / "out" / "results.json").read_text())["backends"]
    assert backend["stale"] == [] and backend["actions"]["get"]["stale"] == 0
    assert any("per-process cache" in note for note in backend["notes"]), backend["notes"]


@pytest.mark.slow
def test_management_command_ignores_what_an_earlier_run_left(
        tmp_path: Path, settings: Any) -> None:
    """Values left under the workload's own keys (an interrupted run, another
    seed) are deleted before the run, so they are not taken for wrong ones."""
    _files_cache(settings, tmp_path, 10_000)
    from django.core.cache import caches

    from djcachebench.bench.workload import load_scenario

    # No pre-fill: what the gets find first is whatever the keys held before.
    scenario = tmp_path / "noprefill.toml"
    scenario.write_text('name = "noprefill"\nkeys = 200\nprefill = false\n')
    own = load_scenario(scenario).with_overrides(key_prefix="djcachebench:")
    caches["files"].set_many({own.key(i): "left by an earlier run" for i in range(200)}, None)
    call_command("cachebench", aliases="files", procs=2, ops=100, out=tmp_path / "out",
                 no_plot=True, scenario=str(scenario))
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["backends"][0]["actions"]["get"]["wrong"] == 0


@pytest.mark.parametrize("argv, message", [
    (["--aliases", ","], "names no alias"),
    (["--ops", "0"], "must be"),
    (["--repeat", "-3"], "must be"),
    (["--procs", "0"], "must be"),
])
def test_management_command_refuses_meaningless_input(
        tmp_path: Path, argv: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("cachebench", *argv, "--out", str(tmp_path / "out"), "--no-plot")


def test_management_command_out_path_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    with pytest.raises(CommandError, match="is not a folder") as refused:
        call_command("cachebench", procs=2, ops=100, out=tmp_path / "afile", no_plot=True)
    assert refused.value.returncode == 2


@pytest.mark.parametrize("argv, message", [
    (["--aliases", "nope"], "unknown CACHES alias"),
    (["--scenario", "nope"], "nope"),
    (["--value-size", "lots"], "lots"),
    (["--procs", "0"], "must be"),  # argparse's own refusal, for comparison
])
def test_management_command_exits_2_on_bad_input(
        tmp_path: Path, argv: list[str], message: str) -> None:
    """As the README says (and ``djcachebench bench`` does): 2, not CommandError's 1."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    done = subprocess.run(
        [sys.executable, "-m", "django", "cachebench", *argv, "--out", str(tmp_path / "out"),
         "--no-plot"], cwd=Path(__file__).resolve().parents[2], env=env,
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_management_command_workers_import_the_settings_module(tmp_path: Path) -> None:
    from django.conf import settings

    assert settings.SETTINGS_MODULE == "tests.settings"
    call_command("cachebench", procs=2, ops=100, out=tmp_path, no_plot=True)
    data = json.loads((tmp_path / "results.json").read_text())
    assert [b["name"] for b in data["backends"]] == ["default"]
    assert data["targets"]["default"]["description"] == "CACHES['default'] of tests.settings"


def test_results_never_record_cache_passwords() -> None:
    from djcachebench.management.commands.cachebench import redact

    entry = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": ["redis://:s3cret@127.0.0.1:6379/0", "redis://user:pw@127.0.0.1:6380/1"],
        "OPTIONS": {"PASSWORD": "s3cret", "CLIENT_CLASS": "x"},
    }
    assert redact(entry) == {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": ["redis://***@127.0.0.1:6379/0", "redis://***@127.0.0.1:6380/1"],
        "OPTIONS": {"PASSWORD": "***", "CLIENT_CLASS": "x"},
    }
    # A password in the query (redis-py reads it), and one holding an "@", are
    # hidden too (whole, not in part).
    assert redact("redis://127.0.0.1:6379/0?password=hunter2&db=1") == (
        "redis://127.0.0.1:6379/0?password=***&db=1")
    assert redact("redis://:p@ss@127.0.0.1:6379") == "redis://***@127.0.0.1:6379"


def test_results_go_under_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from djcachebench.bench.cli import default_out_dir

    monkeypatch.chdir(tmp_path)
    out = default_out_dir("reference")
    assert out.parent == tmp_path / "bench" / "results"  # not the checkout's bench/results
    assert out.name.endswith("-reference")
