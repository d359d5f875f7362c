"""How low an L1's wall time can go against its L2's in one harness run.

Usage: .venv/bin/python bench/wall_bound.py RESULTS.json [...] [--l1 tiered] [--l2 sqlite]

Reads the ``results.json`` of ``djcachebench bench`` runs that measured both
targets (``--backends sqlite,tiered`` or more) and prints, per run, where each
target's time went: the time inside its timed calls by action, and the time the
workers spent outside them (the harness's own loop, its checks, and waiting for
a core), which is the wall time times the processes, less the calls.

Then the bound: the wall ratio the L1 target would have if its writes (set,
delete) had cost exactly what the L2 target's own writes cost in the same run,
its reads staying as measured. An L1 in front of an L2 writes through to it, so
no L1 design can write for less; with reads as fast as they were measured, its
wall time cannot come under this bound. When the bound is above a target for
the ratio (say 0.7 for ``tiered`` against ``sqlite``), the target asks
for reads faster than the ones measured, not for cheaper writes.

Why totals and not medians: on a machine with fewer cores than worker
processes every process waits for a core, and the waits land in whatever a
process was doing, in proportion to the CPU it spent there; the sums keep that
proportion, the medians do not.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

READS = ("get",)
WRITES = ("set", "delete", "incr")


def _totals(backend: dict[str, Any]) -> dict[str, float]:
    return {action: figures["total_ns"] / 1e9
            for action, figures in backend["actions"].items() if figures.get("count")}


def bound(results: dict[str, Any], l1: str, l2: str) -> dict[str, float]:
    """Per-run figures (seconds summed over processes, and the ratios)."""
    backends = {b["name"]: b for b in results["backends"]}
    missing = [name for name in (l1, l2) if name not in backends]
    if missing:
        raise SystemExit(f"{', '.join(missing)} not in this run "
                         f"(it has {', '.join(sorted(backends))})")
    procs = results["run"]["procs"]
    top, low = _totals(backends[l1]), _totals(backends[l2])
    outside_top = backends[l1]["wall_s"] * procs - sum(top.values())
    outside_low = backends[l2]["wall_s"] * procs - sum(low.values())
    reads_top = sum(top.get(a, 0.0) for a in READS)
    writes_top = sum(top.get(a, 0.0) for a in WRITES)
    writes_low = sum(low.get(a, 0.0) for a in WRITES)
    whole_low = sum(low.values()) + outside_low
    return {
        "reads_l1": reads_top, "reads_l2": sum(low.get(a, 0.0) for a in READS),
        "writes_l1": writes_top, "writes_l2": writes_low,
        "outside_l1": outside_top, "outside_l2": outside_low,
        "wall_ratio": backends[l1]["wall_s"] / backends[l2]["wall_s"],
        "bound": (reads_top + writes_low + outside_top) / whole_low,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", nargs="+", type=Path, help="results.json of bench runs")
    parser.add_argument("--l1", default="tiered", help="the target with the L1 (tiered)")
    parser.add_argument("--l2", default="sqlite", help="its L2 alone (sqlite)")
    args = parser.parse_args()
    print(f"seconds summed over the worker processes; {args.l1} against {args.l2}")
    print(f"{'run':40s} {'reads':>15s} {'writes':>15s} {'outside calls':>15s} "
          f"{'wall ratio':>10s} {'bound':>6s}")
    for path in args.results:
        f = bound(json.loads(path.read_text()), args.l1, args.l2)
        print(f"{str(path)[-40:]:40s} {f['reads_l1']:6.1f} / {f['reads_l2']:6.1f} "
              f"{f['writes_l1']:6.1f} / {f['writes_l2']:6.1f} "
              f"{f['outside_l1']:6.1f} / {f['outside_l2']:6.1f} "
              f"{f['wall_ratio']:10.2f} {f['bound']:6.2f}")


if __name__ == "__main__":
    main()
