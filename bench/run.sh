#!/bin/sh
# The benchmark command of the README: `sh bench/run.sh [djcachebench bench options]`.
#
# On a fresh Debian machine as root it sets up everything first (virtualenv,
# pip install -e .[test,bench], apt-get install memcached redis-server when
# missing: see bench/setup-env.sh), then runs the full eight-process
# comparison. Without root or apt-get it runs what it can: the targets whose
# server or module is missing are listed as SKIPPED with the reason.
# It ends by printing where the report is. Options go to `djcachebench bench`,
# e.g. `sh bench/run.sh --procs 2 --ops 300 --out /tmp/quick`.
. "$(dirname "$0")/setup-env.sh"
exec "$VENV/bin/djcachebench" bench "$@"
