#!/usr/bin/env bash
# Run pyfront's opt-in fuzz tier (tests/tiers/test_fuzz.py): schemathesis against every POST route of
# `pyfront serve --mock-engine`, from its /openapi.json.
#
# Usage: tools/fuzz/run_tier.sh [extra pytest args]
#   Sets up the schemathesis venv (tools/fuzz/setup_venv.sh: idempotent, a few seconds when complete), then runs
#   the tier from the repo root with the current python (the project venv: `python`, else python3; PYFRONT_PYTHON
#   overrides). PYFRONT_FUZZ_VENV picks the venv as in the set-up script; PYFRONT_FUZZ_MAX_EXAMPLES the cases per
#   operation of the fuzzing phase (default in the test). Prints the elapsed time of the whole run, pass or fail.
set -euo pipefail

cd "$(dirname "$0")/../.."
start_s=$(date +%s)
trap 'echo "run_tier.sh (fuzz): elapsed $(($(date +%s) - start_s)) s" >&2' EXIT

PY="${PYFRONT_PYTHON:-}"
if [[ -z "$PY" ]]; then
    if command -v python >/dev/null 2>&1; then PY=python; else PY=python3; fi
fi

# The set-up script logs on stderr and prints its venv path as its last stdout line.
PYFRONT_FUZZ_VENV=$(tools/fuzz/setup_venv.sh | tail -n 1)
export PYFRONT_FUZZ_VENV HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

# -rP: the test prints its figures (operations, cases, statuses, failures by check with reproducing curls).
"$PY" -m pytest -q -rP --fuzz -m fuzz --durations=0 tests/tiers/test_fuzz.py "$@"
