#!/usr/bin/env bash
# Run pyfront's opt-in soak tier (tests/tiers/test_soak.py): benchmarks/soak.py for 2 minutes (pyfront, 2 mock
# engines, 32 clients with disconnects), its RSS growth and leaked engine requests printed and bounded.
#
# Usage: tools/soak/run_tier.sh [extra pytest args]
#   Runs the tier from the repo root with the current python (the project venv: `python`, else python3;
#   PYFRONT_PYTHON overrides); it needs nothing beyond the project's test extra. Prints the elapsed time of the
#   whole run, pass or fail. The 10-minute soak stays a script: `python benchmarks/soak.py --minutes 10`.
set -euo pipefail

cd "$(dirname "$0")/../.."
start_s=$(date +%s)
trap 'echo "run_tier.sh (soak): elapsed $(($(date +%s) - start_s)) s" >&2' EXIT

PY="${PYFRONT_PYTHON:-}"
if [[ -z "$PY" ]]; then
    if command -v python >/dev/null 2>&1; then PY=python; else PY=python3; fi
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

# -rP: the test prints soak.py's summary and its own figures (RSS growth, leaked engine requests).
"$PY" -m pytest -q -rP --soak -m soak --durations=0 tests/tiers/test_soak.py "$@"
