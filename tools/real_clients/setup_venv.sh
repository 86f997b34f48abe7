#!/usr/bin/env bash
# Create the virtualenv of third-party clients used by pyfront's opt-in real-client test tier.
#
# Usage: tools/real_clients/setup_venv.sh [VENV_DIR]
#   VENV_DIR defaults to ${PYFRONT_CLIENTS_VENV:-$HOME/.cache/pyfront/clients-venv}.
#   PYFRONT_CLIENTS_PYTHON picks the base interpreter (default: python3.11, else python3; must be 3.11,
#   the only Python the local torch wheel is built for).
#   PYFRONT_CLIENTS_FORCE=1 redoes every step even when the stamp says the venv is complete.
#
# Why a venv of its own: lm-eval pulls in torch, datasets and friends (about 1.9 GB), which the project's
# own venv must not carry. The clients are pinned so that the tier is deterministic from run to run.
# torch is the +cpu build from the machine's local wheel folder (pip's find-links); a CUDA torch (and its
# nvidia-* wheels, several GB) would be pulled from PyPI if it were not pinned, so it is pinned and checked.
#
# Idempotent: a complete venv holds a stamp file naming this script's version and the pins; when it
# matches, the script only re-verifies (imports and CLIs) and exits. Prints the venv path as its last line.
set -euo pipefail

SCRIPT_VERSION=1
TORCH_VERSION=2.13.0+cpu
PINS=(
    "torch==${TORCH_VERSION}"
    "lm-eval[api]==0.4.13"
    "transformers==5.24.0"
    "datasets==5.2.0"
    "openai==3.57.0"
    "pydantic==2.14.4"
    "guidellm==0.8.1"
)
STAMP_NAME=.pyfront-clients-venv.stamp
STAMP_CONTENT="pyfront real_clients/setup_venv.sh v${SCRIPT_VERSION} ${PINS[*]}"

die() { echo "setup_venv.sh (clients): error: $*" >&2; exit 1; }
log() { echo "setup_venv.sh (clients): $*" >&2; }

VENV="${1:-${PYFRONT_CLIENTS_VENV:-$HOME/.cache/pyfront/clients-venv}}"
STAMP="$VENV/$STAMP_NAME"
start_s=$(date +%s)

verify() {
    local vpy="$VENV/bin/python" out
    out=$(HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 "$vpy" - <<'EOF' 2>&1
import importlib.metadata as m
import torch, lm_eval.models.openai_completions, openai, pydantic, guidellm, transformers  # noqa: F401
assert torch.__version__.endswith("+cpu"), f"torch {torch.__version__} is not the +cpu build"
cuda = [d.metadata["Name"] for d in m.distributions() if d.metadata["Name"].lower().startswith("nvidia-")]
assert not cuda, f"CUDA wheels installed: {cuda}"
print("lm_eval", m.version("lm_eval"), "openai", openai.__version__, "guidellm", m.version("guidellm"),
      "torch", torch.__version__)
EOF
) || die "the clients venv does not import its clients ($out); rerun with PYFRONT_CLIENTS_FORCE=1"
    "$VENV/bin/lm_eval" --help >/dev/null 2>&1 || die "'$VENV/bin/lm_eval --help' failed"
    "$VENV/bin/guidellm" --help >/dev/null 2>&1 || die "'$VENV/bin/guidellm --help' failed"
    log "verified: $(echo "$out" | tail -n 1); lm_eval and guidellm CLIs run"
}

if [[ "${PYFRONT_CLIENTS_FORCE:-0}" != 1 && -f "$STAMP" && "$(cat "$STAMP")" == "$STAMP_CONTENT" ]]; then
    log "venv $VENV is already complete (stamp matches v$SCRIPT_VERSION); verifying only"
    verify
    log "done in $(($(date +%s) - start_s)) s (nothing to do)"
    echo "$VENV"
    exit 0
fi
rm -f "$STAMP"

# --- base interpreter -------------------------------------------------------------------------
PY="${PYFRONT_CLIENTS_PYTHON:-}"
if [[ -z "$PY" ]]; then
    if command -v python3.11 >/dev/null 2>&1; then PY=python3.11; else PY=python3; fi
fi
command -v "$PY" >/dev/null 2>&1 || die "base python '$PY' not found (set PYFRONT_CLIENTS_PYTHON)"
pyver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[[ "$pyver" == 3.11 ]] || die "base python '$PY' is $pyver; torch $TORCH_VERSION (local wheel) needs 3.11"

# --- virtualenv --------------------------------------------------------------------------------
if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating virtualenv at $VENV with $PY ($pyver)"
    mkdir -p "$(dirname "$VENV")"
    "$PY" -m venv "$VENV" || die "'$PY -m venv $VENV' failed"
else
    log "reusing existing (incomplete) virtualenv at $VENV"
fi
VPY="$VENV/bin/python"

# --- install ------------------------------------------------------------------------------------
if ! "$VPY" -m pip install --dry-run --no-deps --ignore-installed --quiet "torch==$TORCH_VERSION" \
        >/dev/null 2>&1; then
    die "pip cannot find torch==$TORCH_VERSION; it must be in a local wheel folder pip reads
  (check 'pip config list' for find-links, e.g. /opt/wheels)"
fi
log "pip install ${PINS[*]} (about 3 min on a fresh machine here)"
# pip's warnings about the empty extra index folders in the machine's pip config are noise: filtered.
"$VPY" -m pip install --disable-pip-version-check --quiet "${PINS[@]}" \
    2> >(grep -v "^WARNING: Location .* is ignored" >&2) || die "pip install failed"
"$VPY" -m pip check >&2 || die "pip check found broken requirements"

# --- verify and stamp ----------------------------------------------------------------------------
verify
echo "$STAMP_CONTENT" > "$STAMP"
log "done in $(($(date +%s) - start_s)) s; venv size: $(du -sh "$VENV" | cut -f1)"
echo "$VENV"
