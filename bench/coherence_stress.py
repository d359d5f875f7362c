"""TieredCache coherence stress test: `python bench/coherence_stress.py --seconds 60`.

Options: --seconds, --procs, --threads, --keys, --l1-max-entries,
--generation-slots, --clear-every, --seed. Prints the operations made, the
reads checked, and the stale, wrong-key and phantom reads (with the first
ones described); exits 1 if there was any, 2 if a worker failed. What is
checked and how: djcachebench/bench/coherence_stress.py and
djcachebench/bench/coherence_history.py. A shorter run is in CI
(tests/coherence/test_coherence_stress.py).
"""

import sys

from djcachebench.bench.coherence_stress import main

if __name__ == "__main__":
    sys.exit(main())
