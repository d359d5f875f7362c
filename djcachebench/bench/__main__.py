"""``python -m djcachebench.bench ...``: the same as the ``djcachebench`` command."""

import sys

from djcachebench.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
