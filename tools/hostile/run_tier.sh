#!/usr/bin/env bash
# Run pyfront's opt-in hostile-input tier (tests/tiers/test_hostile.py): ~300 hand-written bad inputs, auth tricks,
# HTTP-level abuse, disconnect storms, slow clients and overload against `pyfront serve` subprocesses on mock engines.
#
# Usage: tools/hostile/run_tier.sh [extra pytest args]
#   Needs nothing beyond the project's test extra. Runs from the repo root with the project venv's python (the
#   active venv's `python`, else python3; PYFRONT_PYTHON overrides). Prints the figures (cases tried per class,
#   unclean answers, leaked engine requests, every unclean case with a repro) and the elapsed time, pass or fail.
set -euo pipefail

cd "$(dirname "$0")/../.."
start_s=$(date +%s)
trap 'echo "run_tier.sh (hostile): elapsed $(($(date +%s) - start_s)) s" >&2' EXIT

PY="${PYFRONT_PYTHON:-}"
if [[ -z "$PY" ]]; then
    if command -v python >/dev/null 2>&1; then PY=python; else PY=python3; fi
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

# -rP: the test prints its figures even when it passes.
"$PY" -m pytest -q -rP --hostile -m hostile tests/tiers/test_hostile.py "$@"
