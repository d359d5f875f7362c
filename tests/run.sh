#!/bin/sh
# The test command of the README: sets up what it needs, then runs the whole suite.
# Extra arguments go to pytest (e.g. `sh tests/run.sh -k sqlite -x`).
. "$(dirname "$0")/../bench/setup-env.sh"
exec "$PY" -m pytest "$@"
