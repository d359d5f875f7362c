# Sourced by tests/run.sh after bench/setup-env.sh (POSIX sh): the virtualenv in
# which tests/test_django_suites.py also runs Django's own cache suites under
# Django 6.1. A second one, because Django 6 needs Python >= 3.12 and the main
# virtualenv may be of an older Python (3.11 is supported); only that test uses it.
#
# After sourcing, either DJCB_DJANGO6_PYTHON names its python (Django 6.1 and this
# package installed), or DJCB_DJANGO6_SKIPPED says why there is none (no Python >=
# 3.12 on PATH or under pyenv, no PyPI, DJCB_DJANGO6=0): those runs are then
# skipped with that reason, never failed. A DJCB_DJANGO6_PYTHON set beforehand is
# used as it is.

DJANGO6_REQUIREMENT='django>=6.1,<6.2'
DJANGO6_VENV=${DJCB_DJANGO6_VENV:-$ROOT/.venv-django6}
unset DJCB_DJANGO6_SKIPPED

# A Python >= 3.12 that runs (pyenv's shims exist for versions that are not selected,
# and fail when run): PATH first, then the last of pyenv's installed versions in name order.
python_for_django6() {
    for cand in python3.14 python3.13 python3.12 python3; do
        if command -v "$cand" >/dev/null 2>&1 &&
            "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
            command -v "$cand"
            return 0
        fi
    done
    found=""
    for dir in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.*; do
        if [ -x "$dir/bin/python3" ] &&
            "$dir/bin/python3" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
            found=$dir/bin/python3
        fi
    done
    [ -n "$found" ] && echo "$found"
}

django6_skip() {
    DJCB_DJANGO6_SKIPPED=$1
    export DJCB_DJANGO6_SKIPPED
    say "Django 6.1 suites skipped: $1"
}

django6_setup() {
    if [ -n "${DJCB_DJANGO6_PYTHON:-}" ]; then
        export DJCB_DJANGO6_PYTHON
        return 0
    fi
    if [ "${DJCB_DJANGO6:-1}" = 0 ]; then
        django6_skip "DJCB_DJANGO6=0"
        return 0
    fi
    d6_stamp=$DJANGO6_VENV/.djcachebench-installed
    if [ ! -f "$d6_stamp" ] || [ setup.cfg -nt "$d6_stamp" ] || [ pyproject.toml -nt "$d6_stamp" ]; then
        if [ ! -x "$DJANGO6_VENV/bin/python" ]; then
            d6_python=$(python_for_django6) || true
            if [ -z "$d6_python" ]; then
                django6_skip "no Python >= 3.12 on PATH or under pyenv (Django 6 needs one)"
                return 0
            fi
            if ! "$d6_python" -m venv "$DJANGO6_VENV" >/dev/null 2>&1; then
                rm -rf "$DJANGO6_VENV"
                django6_skip "$d6_python -m venv failed"
                return 0
            fi
        fi
        say "installing $DJANGO6_REQUIREMENT and djcachebench into $DJANGO6_VENV"
        if ! "$DJANGO6_VENV/bin/python" -m pip install -q --disable-pip-version-check \
                "$DJANGO6_REQUIREMENT" -e . >"$DJANGO6_VENV/install.log" 2>&1; then
            rm -f "$d6_stamp"
            django6_skip "could not install $DJANGO6_REQUIREMENT (no PyPI?): see $DJANGO6_VENV/install.log"
            return 0
        fi
        touch "$d6_stamp"
    fi
    DJCB_DJANGO6_PYTHON=$DJANGO6_VENV/bin/python
    export DJCB_DJANGO6_PYTHON
}

django6_setup
