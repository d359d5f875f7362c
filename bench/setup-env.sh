# Shared set-up for `sh tests/run.sh` and `sh bench/run.sh` (sourced, POSIX sh).
#
# Why a script and not a Makefile: a fresh Debian machine has neither make nor,
# always, python3-venv; this file needs only sh and installs what is missing
# when it runs as root with apt-get, and otherwise says what it skipped.
#
# After sourcing: $PY is the virtualenv's python, with djcachebench installed
# editable with the [test,bench] extras; memcached / redis-server are on PATH
# when they could be had (the tests and the harness start their own instances).

set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${DJCB_VENV:-$ROOT/.venv}
cd "$ROOT"

say() { printf '[djcachebench] %s\n' "$*" >&2; }

# A step that can be silent for a minute (a virtualenv, pip) says every 9 s that
# it is still running when stderr is not a terminal: a first run whose output is
# piped (CI, nohup, a log) must show it is alive, not go quiet for half a minute.
with_heartbeat() {
    what=$1
    shift
    if [ -t 2 ]; then
        "$@"
        return
    fi
    (while sleep "${DJCB_HEARTBEAT:-9}"; do say "still $what"; done) &
    beat=$!
    if "$@"; then status=0; else status=$?; fi
    kill "$beat" 2>/dev/null || true
    wait "$beat" 2>/dev/null || true
    return "$status"
}

can_apt() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; }

APT_UPDATED=0
apt_install() {
    if ! can_apt; then return 1; fi
    if [ "$APT_UPDATED" = 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null || return 1
        APT_UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# 1. An interpreter: Python 3.11 or newer.
PYTHON=${PYTHON:-}
if [ -z "$PYTHON" ]; then
    for cand in python3.13 python3.12 python3.11 python3; do
        if command -v "$cand" >/dev/null 2>&1 &&
            "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            PYTHON=$cand
            break
        fi
    done
fi
if [ -z "$PYTHON" ]; then
    say "no Python >= 3.11 found; installing Debian's python3"
    apt_install python3 python3-venv python3-dev gcc ||
        { say "cannot install python3 (not root, or no apt-get): install Python >= 3.11 and retry"; exit 2; }
    PYTHON=python3
fi

# 2. The virtualenv (Debian splits ensurepip into python3-venv).
if [ ! -x "$VENV/bin/python" ]; then
    say "creating the virtualenv $VENV"
    if ! with_heartbeat "creating the virtualenv" \
            sh -c '"$0" -m venv "$1" >/dev/null 2>&1' "$PYTHON" "$VENV"; then
        rm -rf "$VENV"
        say "python -m venv failed; installing python3-venv"
        apt_install python3-venv ||
            { say "cannot create a virtualenv: install python3-venv and retry"; exit 2; }
        "$PYTHON" -m venv "$VENV"
    fi
fi
PY=$VENV/bin/python

# 3. The package and its extras, re-installed when the metadata changes.
STAMP=$VENV/.djcachebench-installed
if [ ! -f "$STAMP" ] || [ setup.cfg -nt "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
    say "installing djcachebench[test,bench] into $VENV"
    with_heartbeat "installing pip" "$PY" -m pip install -q --disable-pip-version-check --upgrade pip
    if ! with_heartbeat "installing djcachebench[test,bench]" \
            "$PY" -m pip install -q --disable-pip-version-check -e ".[test,bench]"; then
        # pylibmc has no wheel for every platform: its build needs libmemcached.
        say "install failed; trying with libmemcached-dev and a compiler"
        apt_install libmemcached-dev zlib1g-dev gcc python3-dev || true
        with_heartbeat "installing djcachebench[test,bench]" \
            "$PY" -m pip install -q --disable-pip-version-check -e ".[test,bench]"
    fi
    touch "$STAMP"
fi

# 4. The real peers. Missing ones are installed when possible, else skipped.
missing=""
command -v memcached >/dev/null 2>&1 || [ -x /usr/bin/memcached ] || missing="$missing memcached"
command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ] || missing="$missing redis-server"
command -v wrk >/dev/null 2>&1 || [ -x /usr/bin/wrk ] || missing="$missing wrk"  # djcachebench http
if [ -n "$missing" ]; then
    say "missing servers:$missing; installing with apt-get"
    # shellcheck disable=SC2086
    apt_install $missing ||
        say "could not install$missing (needs root and apt-get): the targets that need them are skipped; install them with: apt-get install$missing"
fi
PATH=$PATH:/usr/sbin:/usr/bin
export PATH PY

# 5. Open files. Debian's default soft limit is 1,024; the suite runs many caches
# (each shard a database, its WAL and shared-memory file) and real servers, and
# under 8 workers the harness does too: at 1,024 the tests fail with "Too many open
# files". Raised to the hard limit, up to 65,536.
soft=$(ulimit -Sn)
hard=$(ulimit -Hn)
want=65536
if [ "$hard" != unlimited ] && [ "$hard" -lt "$want" ]; then want=$hard; fi
if [ "$soft" != unlimited ] && [ "$soft" -lt "$want" ]; then
    ulimit -Sn "$want" 2>/dev/null || say "could not raise the open-file limit from $soft"
    if [ "$(ulimit -Sn)" != unlimited ] && [ "$(ulimit -Sn)" -lt 4096 ]; then
        say "open-file limit $(ulimit -Sn): below 4,096 some tests may fail with 'Too many open files'"
    fi
fi
