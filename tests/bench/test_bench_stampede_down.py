"""A stampede row whose every ``get_or_set`` raises fails; it is not the best row.

A backend that is down computes nothing (0 computations), and its callers,
having no latency, would show p50/p99 "0ns": the best row of the table, exit
status 0. The run here is the real command
with a target whose ``get_or_set`` raises at once.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from djcachebench.bench.stampede.data import Call, Round, Row, StampedeResults
from djcachebench.bench.stampede.report import render
from tests.bench.helpers import project_with_target

DOWN = '''
from django.core.cache.backends.locmem import LocMemCache
from djcachebench.bench.targets import Target


class Down(LocMemCache):
    def get_or_set(self, *args, **kwargs):
        raise ConnectionError("down")


TARGET = Target(name="down", description="get_or_set raises",
                caches=lambda env: {"BACKEND": "down.Down", "LOCATION": "down"}, rank=99)
'''


def test_a_round_where_every_caller_raised_has_no_latency_and_fails() -> None:
    calls = [Call(10, 20, None, "ConnectionError")] * 4
    one = Round.from_calls(calls, calls, set(), 0, 0, 0, 0)
    assert one.p50_s is None and one.p99_s is None and one.max_s is None
    assert one.failure is not None and "every get_or_set raised" in one.failure
    assert one.to_dict()["p99_s"] is None
    row = Row("down", "down", False, None, runs=[one])
    report = render(StampedeResults(machine={}, params={
        "procs": 2, "threads": 2, "callers": 4, "compute_s": 0.1, "repeat": 1}, rows=[row]))
    line = next(x for x in report.splitlines() if x.startswith("| down |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[4:8] == ["-", "-", "-", "-"]  # client p50, p99, p99 ÷ compute, max
    assert cells[-1] == "**FAILED**"
    assert "**down FAILED:** every get_or_set raised (ConnectionError x4)" in report


@pytest.mark.slow
def test_the_stampede_command_fails_a_backend_that_is_down(tmp_path: Path) -> None:
    env = project_with_target(tmp_path, "down", DOWN)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "djcachebench", "stampede", "--procs", "2", "--threads", "2",
         "--compute", "0.05", "--backends", "locmem,down", "--out", str(out), "--no-plot"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = {r["name"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    assert rows["down"]["runs"][0]["p50_s"] is None
    report = (out / "report.md").read_text()
    assert "**down FAILED:**" in report
    assert "| locmem |" in report and "**locmem FAILED" not in report
