"""The harness and a plain timed loop of the same calls agree, on every target here.

This asserts agreement between two measurements, not a speed: one process of
the reference mix through the harness and through ``plain_loop`` (the same
settings, set-up, op list and warm-up, and nothing but the calls in the
loop), interleaved per round so that a slow period of a shared machine lands
on both, and compared on the median over the rounds. An instrument that
changes its target (a ``stats()`` that switches a backend's statistics on)
or slows the calls it times fails it.
"""

from __future__ import annotations

import os

import pytest

from djcachebench.bench.plain_loop import cross_check
from djcachebench.bench.targets import load_targets
from djcachebench.bench.workload import REFERENCE

CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
#: How far apart the two p50s may be (harness over loop, either way).
AGREEMENT = 0.25
#: About 270 sets and 2,700 gets per run: p50s steady to a few percent.
SCENARIO = REFERENCE.with_overrides(procs=1, ops=3000, warmup=300)
ROUNDS = 3


@pytest.mark.slow
@pytest.mark.servers
def test_the_harness_and_a_plain_loop_agree_on_get_and_set_p50() -> None:
    checks, skipped = cross_check(load_targets(), SCENARIO, rounds=ROUNDS)
    if CI:
        assert not skipped, skipped  # CI installs every target's modules and servers
    assert {c.target for c in checks} >= {"locmem", "diskcache", "sqlite", "tiered"}
    apart = []
    for check in checks:
        for action in ("get", "set"):
            ratio = check.ratio(action)
            assert ratio is not None, (check.target, action)
            if abs(ratio - 1) > AGREEMENT:
                apart.append(
                    f"{check.target} {action}: harness p50 "
                    f"{check.median('harness', action, 'p50')} ns, plain loop "
                    f"{check.median('plain', action, 'p50')} ns ({ratio:.2f})"
                )
    assert not apart, "\n".join(apart)
