"""The first benchmark ends in minutes and says how far it got: a time budget per
target, an estimate at the start, progress lines when the output is not a
terminal, and an interrupt that keeps the targets that finished."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from djcachebench.bench.budget import (
    MIN_CALIBRATION_S,
    MIN_OPS,
    calibration_scenario,
    describe_estimate,
    longer_calibration,
    plan_ops,
)
from djcachebench.bench.progress import Progress
from djcachebench.bench.runner import RunOptions, run_targets
from djcachebench.bench.targets import load_targets, select_targets
from djcachebench.bench.workload import REFERENCE


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_piped_output_gets_a_line_every_ten_seconds_with_target_count_and_elapsed() -> None:
    clock, out = FakeClock(), io.StringIO()
    progress = Progress(stream=out, live=False, clock=clock, line_every=10)
    progress.phase("filebased", "starting 8 workers (Django set-up, pre-fill)", 8_000)
    clock.now += 4
    progress.tick()
    assert out.getvalue() == ""  # not yet due
    clock.now += 7
    progress.tick()
    assert out.getvalue() == "  filebased: starting 8 workers (Django set-up, pre-fill), 11.0 s\n"
    clock.now += 3
    progress.update("filebased", 1_536, 8_000, 2.0)  # counts move: written when due
    assert out.getvalue().count("\n") == 1
    clock.now += 8
    progress.update("filebased", 4_096, 8_000, 10.0)
    assert out.getvalue().splitlines()[-1] == "  filebased: 4,096 of 8,000 ops, 10.0 s"
    assert "\r" not in out.getvalue()


def test_a_line_that_was_said_resets_the_interval() -> None:
    clock, out = FakeClock(), io.StringIO()
    progress = Progress(stream=out, live=False, clock=clock, line_every=10)
    progress.phase("redis", "starting 8 workers (Django set-up, pre-fill)")
    clock.now += 9
    progress.say("locmem: 800,000 ops in 9.00s")
    clock.now += 9
    progress.tick()
    assert out.getvalue() == "locmem: 800,000 ops in 9.00s\n"


def test_the_heartbeat_writes_while_the_caller_is_blocked() -> None:
    out = io.StringIO()
    progress = Progress(stream=out, live=False, line_every=0.05)
    progress.phase("db", "starting 2 workers (Django set-up, pre-fill)")
    with progress.heartbeat(period=0.01):
        deadline = time.monotonic() + 5
        while "db: starting" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
    assert "  db: starting 2 workers" in out.getvalue()


def test_a_terminal_gets_the_redrawn_bar_and_no_plain_lines() -> None:
    clock, out = FakeClock(), io.StringIO()
    progress = Progress(stream=out, live=True, clock=clock, line_every=10)
    progress.update("redis", 10, 100, 1.0, force=True)
    clock.now += 60
    progress.tick()
    assert out.getvalue().startswith("\r  redis") and "\n" not in out.getvalue()


def test_a_budget_cuts_a_slow_target_and_leaves_a_fast_one_its_scenario() -> None:
    slow = plan_ops(REFERENCE, ops_per_s=1_600, budget_s=25)  # filebased on two cores
    per_process = 25 * 1_600 // 8
    assert slow.cut and slow.warmup + slow.ops == per_process and slow.warmup <= slow.ops
    fast = plan_ops(REFERENCE, ops_per_s=10_000_000, budget_s=25)
    assert not fast.cut and (fast.ops, fast.warmup) == (REFERENCE.ops, REFERENCE.warmup)
    crawling = plan_ops(REFERENCE, ops_per_s=1, budget_s=1)
    assert crawling.ops == MIN_OPS and crawling.to_dict()["cut"] is True


def test_a_calibration_too_short_to_time_runs_again_longer() -> None:
    """A fast target's few hundred calibration ops take milliseconds, most of them
    the workers' start-up skew: its rate came out several times too low and its
    run got a fraction of its budget. Such a calibration is run again, long enough."""
    first = calibration_scenario(REFERENCE)
    again = longer_calibration(REFERENCE, first, wall_s=0.05)
    assert again is not None and again.ops > first.ops
    # Sized for about twice the minimum at the rate seen.
    assert again.ops >= first.ops * 2 * MIN_CALIBRATION_S / 0.05
    assert (again.procs, again.keys, again.mix) == (first.procs, first.keys, first.mix)
    # Never more than the scenario's own count, and not at all once it is reached.
    small = REFERENCE.with_overrides(ops=5_000)
    capped = longer_calibration(small, calibration_scenario(small), wall_s=0.05)
    assert capped is not None and capped.ops == small.ops
    assert longer_calibration(small, capped, wall_s=0.05) is None
    # Long enough: no second calibration.
    assert longer_calibration(REFERENCE, first, wall_s=MIN_CALIBRATION_S) is None


def test_the_estimate_is_printed_for_a_budget_and_its_absence_said() -> None:
    assert "estimated 7 min for 11 target(s)" in describe_estimate(11, 25)
    assert "no time budget" in describe_estimate(11, None)


def test_a_budgeted_run_records_the_ops_each_target_ran(tmp_path: Path) -> None:
    (target,) = select_targets(load_targets(), ["locmem"])
    scenario = REFERENCE.with_overrides(procs=2, ops=5_000_000, warmup=100)
    results = run_targets([target], RunOptions(scenario=scenario, budget=0.5),
                          Progress(live=False, stream=io.StringIO()))  # fmt: skip
    plan = results.targets["locmem"]["plan"]
    assert plan["cut"] and plan["budget_s"] == 0.5 and plan["scenario_ops"] == 5_000_000
    (backend,) = results.backends
    assert backend.ops == 2 * plan["ops"]
    assert results.run["budget_s"] == 0.5


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for(proc: subprocess.Popen[str], text: str, timeout: float) -> str:
    """The stderr lines read until one contains ``text``."""
    assert proc.stderr is not None
    seen = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen += line
        if text in line:
            return seen
    raise AssertionError(f"{text!r} never printed; got:\n{seen}")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_keeps_the_targets_that_finished(
    signum: signal.Signals, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "djcachebench", "bench", "--backends", "locmem,filebased,db",
         "--procs", "2", "--ops", "200000", "--warmup", "0", "--no-plot", "--out", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
        # A shell that starts jobs in the background (CI runners, nohup) leaves
        # SIGINT ignored, and the child would inherit that: the default restores
        # what a terminal's Ctrl-C meets.
        preexec_fn=_default_sigint,
    )  # fmt: skip
    try:
        # The second target is under way as soon as the first has reported, and
        # 400,000 file-based ops outlast the signal on any machine.
        _wait_for(proc, "locmem: 400,000 ops in", 120)
        if signum == signal.SIGINT:
            os.killpg(proc.pid, signum)  # Ctrl-C: the terminal signals the whole group
        else:
            os.kill(proc.pid, signum)  # a supervisor signals the command alone
        assert proc.wait(60) == 128 + signum
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    data = json.loads((out / "results.json").read_text())
    assert [b["name"] for b in data["backends"]] == ["locmem"]
    assert data["backends"][0]["ops"] == 400_000
    statuses = {s["name"]: s["status"] for s in data["skipped"]}
    # The signal lands as the first target reports: the second is either under
    # way (interrupted) or not started yet; either way nothing of it is reported.
    assert statuses in ({"filebased": "interrupted", "db": "not run"},
                        {"filebased": "not run", "db": "not run"}), statuses
    assert data["run"]["interrupted"] == signal.Signals(signum).name
    report = (out / "report.md").read_text()
    assert "## locmem (per-process)" in report and "interrupted" in report
