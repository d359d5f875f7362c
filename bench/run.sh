#!/bin/sh
# The benchmark command of the README: `sh bench/run.sh [djcachebench bench options]`.
#
# On a fresh Debian machine as root it sets up everything first (virtualenv,
# pip install -e .[test,bench], apt-get install memcached redis-server when
# missing: see bench/setup-env.sh), then runs the eight-process comparison of
# every target. Without root or apt-get it runs what it can: the targets whose
# server or module is missing are listed as SKIPPED with the reason.
#
# A first run must end in minutes, whatever the slowest target: unless the
# options say otherwise (--budget, or --ops for an exact count), each target
# gets a budget of $DJCB_BUDGET seconds of ops (default 25), its op count sized
# by a short calibration (djcachebench/bench/budget.py); eleven targets then
# take about eight minutes on two cores. The full-size run, the scenario's
# 100,000 ops per process for every target: `sh bench/run.sh --budget none`.
#
# It prints its estimate at the start and, when its output is not a terminal,
# a progress line at least every 10 s. Ctrl-C or SIGTERM keeps the finished
# targets in results.json and report.md (exit 130 / 143).
# It ends by printing where the report is. Options go to `djcachebench bench`,
# e.g. `sh bench/run.sh --procs 2 --ops 300 --out /tmp/quick`.
. "$(dirname "$0")/setup-env.sh"
budget="--budget ${DJCB_BUDGET:-25}"
for arg in "$@"; do
    case $arg in
        --budget|--budget=*|--ops|--ops=*) budget="" ;;
    esac
done
# shellcheck disable=SC2086
exec "$VENV/bin/djcachebench" bench $budget "$@"
