#!/usr/bin/env bash
# Create the virtualenv of schemathesis used by pyfront's opt-in fuzz tier (tests/tiers/test_fuzz.py).
#
# Usage: tools/fuzz/setup_venv.sh [VENV_DIR]
#   VENV_DIR defaults to ${PYFRONT_FUZZ_VENV:-$HOME/.cache/pyfront/fuzz-venv}.
#   PYFRONT_FUZZ_PYTHON picks the base interpreter (default: python3.11, else python3; must be 3.11).
#   PYFRONT_FUZZ_FORCE=1 redoes every step even when the stamp says the venv is complete.
#
# Why a venv of its own: schemathesis brings its own pins of hypothesis, requests, werkzeug and a Rust JSON-schema
# validator, which the project's venv must not carry. schemathesis and hypothesis are pinned because they decide
# which cases a run generates: with the tier's fixed seed and derandomized generation the same pins give the same
# cases, so the figures compare from run to run.
#
# Idempotent: a complete venv holds a stamp file naming this script's version and the pins; when it matches, the
# script only re-verifies (import and CLI) and exits. Prints the venv path as its last line.
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib/venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/venv.sh"

SCRIPT_VERSION=1
SCHEMATHESIS_VERSION=4.32.5
PINS=(
    "schemathesis==${SCHEMATHESIS_VERSION}"
    "hypothesis==6.170.17"
)
STAMP_NAME=.pyfront-fuzz-venv.stamp
STAMP_CONTENT="pyfront fuzz/setup_venv.sh v${SCRIPT_VERSION} ${PINS[*]}"

LOG_NAME="setup_venv.sh (fuzz)"

VENV="${1:-${PYFRONT_FUZZ_VENV:-$HOME/.cache/pyfront/fuzz-venv}}"
STAMP="$VENV/$STAMP_NAME"

verify() {
    local v
    v=$("$VENV/bin/python" -c 'import schemathesis; print(schemathesis.__version__)' 2>&1 | tail -n 1) \
        || die "'$VENV/bin/python -c \"import schemathesis\"' failed ($v); rerun with PYFRONT_FUZZ_FORCE=1"
    [[ "$v" == "$SCHEMATHESIS_VERSION" ]] || die "schemathesis.__version__ is '$v', expected $SCHEMATHESIS_VERSION"
    "$VENV/bin/schemathesis" --version >/dev/null 2>&1 || die "'$VENV/bin/schemathesis --version' failed"
    log "verified: schemathesis $v imports and its CLI runs"
}

venv_exit_if_complete "${PYFRONT_FUZZ_FORCE:-0}"
venv_base_python PYFRONT_FUZZ_PYTHON "the fuzz venv is built and tested with 3.11, like the tier's other venvs"
venv_create

# --- install ------------------------------------------------------------------------------------
log "pip install ${PINS[*]}"
# pip's warnings about the empty extra index folders in the machine's pip config are noise: filtered.
"$VPY" -m pip install --disable-pip-version-check --quiet "${PINS[@]}" \
    2> >(grep -v "^WARNING: Location .* is ignored" >&2) || die "pip install failed"
"$VPY" -m pip check >&2 || die "pip check found broken requirements"

# --- verify and stamp ----------------------------------------------------------------------------
venv_finish
