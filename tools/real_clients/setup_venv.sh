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
# shellcheck source=SCRIPTDIR/../lib/venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/venv.sh"

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
    "openai-agents==0.24.0"
)
STAMP_NAME=.pyfront-clients-venv.stamp
STAMP_CONTENT="pyfront real_clients/setup_venv.sh v${SCRIPT_VERSION} ${PINS[*]}"

LOG_NAME="setup_venv.sh (clients)"

VENV="${1:-${PYFRONT_CLIENTS_VENV:-$HOME/.cache/pyfront/clients-venv}}"
STAMP="$VENV/$STAMP_NAME"

verify() {
    local vpy="$VENV/bin/python" out
    out=$(HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 "$vpy" - <<'EOF' 2>&1
import importlib.metadata as m
import torch, lm_eval.models.openai_completions, openai, pydantic, guidellm, transformers, agents  # noqa: F401
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

venv_exit_if_complete "${PYFRONT_CLIENTS_FORCE:-0}"
venv_base_python PYFRONT_CLIENTS_PYTHON "torch $TORCH_VERSION (local wheel) needs 3.11"
venv_create

# --- install ------------------------------------------------------------------------------------
venv_require_torch "$TORCH_VERSION"
log "pip install ${PINS[*]} (about 3 min on a fresh machine here)"
# pip's warnings about the empty extra index folders in the machine's pip config are noise: filtered.
"$VPY" -m pip install --disable-pip-version-check --quiet "${PINS[@]}" \
    2> >(grep -v "^WARNING: Location .* is ignored" >&2) || die "pip install failed"
"$VPY" -m pip check >&2 || die "pip check found broken requirements"

# --- verify and stamp ----------------------------------------------------------------------------
venv_finish
