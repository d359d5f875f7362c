"""What the doorkeeper changes in what an L1 keeps, simulated (no cache involved).

Usage: .venv/bin/python bench/l1_admission_sim.py [--keys 1000000] [--zipf 1.0]
                                                  [--ops 400000] [--l1 10000]

One process's op list of ``bench/l1_share.py`` (90% get, 9% set, 1% delete over
``--keys`` keys, Zipf popularity, seed 1000) through two LRUs of ``--l1``
entries: a plain one, which takes every key it misses and every key written (what
TieredCache's L1 did before ``tiered/admission.py``'s doorkeeper), and one that,
once full, takes a key it does not hold only when the real
:class:`~djcachebench.tiered.admission.Doorkeeper` admits it (reads and writes,
as TieredCache does). Prints the share of gets each answered and the fills per
get. A simulation, so no other process invalidates anything: the shares are
upper bounds for one process, and the comparison is what it shows.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import OrderedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from l1_share import _ops

from djcachebench.tiered.admission import Doorkeeper


def simulate(ops: list[tuple[int, str]], l1: int, doorkeeper: bool) -> tuple[float, float]:
    """(share of gets answered, fills per get) of an LRU of ``l1`` entries."""
    lru: OrderedDict[str, None] = OrderedDict()
    door = Doorkeeper(l1)
    hits = gets = fills = 0
    for action, key in ops:
        full = len(lru) >= l1
        if action == 0:
            gets += 1
            if key in lru:
                hits += 1
                lru.move_to_end(key)
                continue
            if doorkeeper and full and not door.admit(key):
                continue
            lru[key] = None
            fills += 1
        elif action == 1:
            if key in lru:
                lru.move_to_end(key)
            elif not doorkeeper or not full or door.admit(key):
                lru[key] = None
        else:
            lru.pop(key, None)
        while len(lru) > l1:
            lru.popitem(last=False)
    return hits / gets, fills / gets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--zipf", type=float, default=1.0)
    parser.add_argument("--ops", type=int, default=400_000)
    parser.add_argument("--l1", type=int, default=10_000)
    args = parser.parse_args()
    ops = _ops(1000, args.keys, args.zipf, args.ops)
    print(f"keys {args.keys:,}  zipf {args.zipf}  ops {args.ops:,}  L1 {args.l1:,}")
    for name, door in (("LRU, every miss and write", False), ("LRU behind the doorkeeper", True)):
        share, fills = simulate(ops, args.l1, door)
        print(f"  {name:27} answered {share:6.1%} of gets, fills {fills:6.1%} of gets")


if __name__ == "__main__":
    main()
