#!/bin/sh
# The test command of the README: sets up what it needs, then runs the whole suite.
# Extra arguments go to pytest (e.g. `sh tests/run.sh -k sqlite -x`).
. "$(dirname "$0")/../bench/setup-env.sh"
# Django's own cache suites also run under Django 6.1, from a second virtualenv
# (tests/test_django_suites.py); skipped with the reason where it cannot be made.
. "$ROOT/tests/django6-env.sh"
exec "$PY" -m pytest "$@"
